"""impl.bench.compile_caches: what the on-disk compile caches hold, read where Triton and Inductor look."""
from __future__ import annotations

from impl.bench.compile_caches import CompileCaches


def test_caches_are_read_where_the_environment_points_them(tmp_path, monkeypatch):
    triton, inductor = tmp_path / "triton", tmp_path / "inductor"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    c = CompileCaches.read()
    assert (c.triton_dir, c.inductor_dir) == (str(triton), str(inductor))
    assert (c.triton_files, c.inductor_files) == (0, 0) and c.empty  # not created yet: empty
    (triton / "abc").mkdir(parents=True)
    assert CompileCaches.read().empty  # a folder alone holds no kernel
    (triton / "abc" / "k.cubin").write_bytes(b"\0")
    (inductor / "fx").mkdir(parents=True)
    (inductor / "fx" / "g.py").write_text("")
    (inductor / "fx" / "g.json").write_text("{}")
    c = CompileCaches.read()
    assert (c.triton_files, c.inductor_files) == (1, 2) and not c.empty
