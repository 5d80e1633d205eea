"""The report builder's version history: earlier runs kept under reports/data/<device>/history/ are
loaded apart from the current data and rendered as one row per version."""
import json

from impl.report.__main__ import build


def _leaderboard_doc(when: str, ours_ms: float, cudnn_ms: float, picks=None) -> dict:
    def row(impl, mode, ms):
        info = dict(problem="leaderboard", do_bench_ms=ms, config=dict(impl=impl, mode=mode, batch=1, heads=2, seq=64,
                                                                          d=16, dtype="bf16", causal=True),
                    metrics=dict(tflops=1.0 / ms, mfu=0.01 / ms), env=dict(device="GPU"))
        if impl == "flash_triton" and picks:
            info["tuned_configs"] = picks
        return dict(name=f"test_leaderboard[{impl}-{mode}]", group="leaderboard", extra_info=info,
                    stats=dict(mean=ms / 1e3, stddev=0.0, median=ms / 1e3, min=ms / 1e3, max=ms / 1e3, rounds=1,
                               data=[ms / 1e3]))
    return dict(datetime=when, benchmarks=[row("flash_triton", "fwd_bwd", ours_ms), row("flash_triton", "fwd", ours_ms / 4),
                                           row("sdpa_cudnn", "fwd_bwd", cudnn_ms), row("sdpa_cudnn", "fwd", cudnn_ms / 4)])


def test_history_rows_are_versions_not_current_data(tmp_path):
    dev = tmp_path / "reports" / "data" / "gpu-x"
    (dev / "history").mkdir(parents=True)
    (tmp_path / "reports" / "figures").mkdir()
    (dev / "history" / "leaderboard-v1.json").write_text(json.dumps(_leaderboard_doc("2026-01-01T00:00", 6.0, 4.0)))
    (dev / "leaderboard.json").write_text(json.dumps(_leaderboard_doc(
        "2026-02-01T00:00", 5.0, 4.0, picks={"fwd": "BLOCK_M: 64, BLOCK_N: 128, num_warps: 4, num_stages: 3"})))
    text = build(tmp_path)
    assert text.count("| torch.compile(FlashAttentionTriton.apply) | forward+backward |") + text.count(
        "| FlashAttentionTriton.apply (not compiled) | forward+backward |") == 1, "history rows stay out of the table"
    hist = text.split("### Version history (leaderboard configuration)")[1]
    assert "| v1 | 2026-01-01 | 6.000 |" in hist and "| 1.50× | not recorded |" in hist
    assert "| current | 2026-02-01 | 5.000 |" in hist and "| 1.25× | fwd: 64×128 w4 s3 |" in hist


def _flash_doc(when: str, times: dict) -> dict:
    """flash_benchmarking rows of our kernel: {(mode, seq): ms}, bf16, d 64."""
    rows = []
    for (mode, seq), ms in times.items():
        info = dict(problem="flash_benchmarking", do_bench_ms=ms, timer="do_bench",
                    config=dict(impl="flash_triton", mode=mode, batch=1, seq=seq, d=64, dtype="bf16", causal=True),
                    metrics=dict(tflops=1.0 / ms), env=dict(device="GPU"))
        rows.append(dict(name=f"test_flash[{mode}-{seq}]", group="flash", extra_info=info,
                         stats=dict(mean=ms / 1e3, stddev=0.0, median=ms / 1e3, min=ms / 1e3, max=ms / 1e3,
                                    rounds=1, data=[ms / 1e3])))
    return dict(datetime=when, benchmarks=rows)


def test_flash_regression_table_counts_faster_and_slower_shapes(tmp_path):
    dev = tmp_path / "reports" / "data" / "gpu-x"
    (dev / "history").mkdir(parents=True)
    (tmp_path / "reports" / "figures").mkdir()
    before = {("fwd", 1024): 1.0, ("fwd", 4096): 2.0, ("bwd", 1024): 3.0, ("bwd", 8192): 9.0}
    now = {("fwd", 1024): 0.9, ("fwd", 4096): 2.06, ("bwd", 1024): 3.3, ("fwd_bwd", 1024): 5.0}
    (dev / "history" / "flash_benchmarking-bf16-v1.json").write_text(json.dumps(_flash_doc("2026-01-01T00:00", before)))
    (dev / "flash_benchmarking-bf16.json").write_text(json.dumps(_flash_doc("2026-02-01T00:00", now)))
    text = build(tmp_path).split("### Against the previous version")[1]
    # three shapes in both runs; one faster, one within the 5% band, one 10% slower and listed
    assert "| bf16-v1 | ≤ 4096 | 3 | 1 | 1 | 1.03 | 0.90 | 1.10 | – |" in text
    slower = text.split("Slower beyond the band")[1]
    assert "| backward | 64 | 1024 | 3.000 | 3.300 | 1.10 |" in slower and "4096" not in slower
