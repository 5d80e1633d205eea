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
