"""cpu_smoke (impl.report.pages.cpu_smoke): facts from synthetic CPU rows, and the page's words as a
snapshot."""
from __future__ import annotations

from impl.bench.row import Env, Status
from impl.report.pages import cpu_smoke as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

CPU = Env("x86_64", "cpu", "2.13.0+cpu", None, None, "smoke")


def _rows():
    def b(problem, config, status=Status.MEASURED, section=None, when="2026-11-24T14:00:00", commit="aaaaaaaa"):
        return bench(problem, config, 0.01 if status is Status.MEASURED else None, device="cpu", section=section,
                     when=when, commit=commit, status=status, env=CPU,
                     reason=None if status is Status.MEASURED else "needs a GPU")
    return [b("pytorch_attention", dict(seq=8)), b("pytorch_attention", dict(seq=16), Status.OOM),
            b("pytorch_attention", dict(seq=32), when="2026-11-25T09:30:00", commit="bbbbbbbb"),
            b("fsdp", dict(world_size=2), Status.NEEDS_HARDWARE), b("fsdp", dict(world_size=4), Status.NEEDS_HARDWARE),
            b("fsdp", dict(world_size=6), Status.LEFT_OUT),
            b("torch_compile", dict(mode="forward"), section="torch_compile_model"),
            bench("pytorch_attention", dict(seq=8), 0.001)]  # a GPU row: not on this page


def test_each_section_counts_its_rows_by_status_and_names_its_newest_run(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    by = {s.section: s for s in f.sections}
    assert list(by) == ["fsdp", "pytorch_attention", "torch_compile_model"]  # sorted; the GPU row left out
    pa = by["pytorch_attention"]
    assert (pa.measured, pa.oom, pa.not_run) == (2, 1, ())
    assert (pa.newest, pa.commit, pa.legacy) == ("2026-11-25 09:30", "bbbbbbbb", False)
    assert by["fsdp"].not_run == (("left_out", 1), ("needs_hardware", 2))
    assert by["torch_compile_model"].problems == ("torch_compile",)
    assert (f.measured, f.others, f.silent) == (3, 4, ["fsdp"])
    assert f.env == CPU and f.scores == {}
    assert all(x.startswith("reports/data/cpu/") for x in f.sources) and len(f.sources) == 4


def test_no_cpu_rows_says_so(tmp_path):
    f = page.facts(context([bench("pytorch_attention", dict(seq=8), 0.001)], tmp_path))
    assert f.env is None and f.sections == () and f.sources == ()


def test_page_words(request, tmp_path):
    assert_snapshot(request, "cpu_smoke", render_page("cpu_smoke.md.j2", f=page.facts(context(_rows(), tmp_path))))
