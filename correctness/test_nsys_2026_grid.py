"""nsys_profile (2026) (issue 45): three contexts per size with a shorter fallback where a chosen one
runs out of memory, and why the first H100 run's medium@2048 did although the closed form fits: the
Python timer's rounds kept two training forwards' graphs alive. Checked on that run's committed data."""
import json
from pathlib import Path

import torch

from impl.bench.store import read_run_text
from impl.model import SizeRef
from impl.workloads.kernels import TWO_GRAPHS_CAUSE, oom_vs_closed_form, timer_forward_loss
from impl.workloads.steps import build_model, chosen_2026_cases, fallback_2026_cases, memory_need, random_batch
from impl.workloads.sweeps import grid

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "reports/data/h100-80gb-x1/nsys_profile/20261124T153423Z_a2b3c0b2+.json.gz"
H100 = 85_017_493_504


def test_h100_cases_and_their_fallback():
    g = grid("nsys_profile_2026", "full")
    cases = chosen_2026_cases(g, H100)
    assert cases == [("medium", 512), ("medium", 1024), ("medium", 2048), ("large", 256), ("large", 512),
                     ("large", 1024)]
    assert fallback_2026_cases(g, cases) == [("medium", 256)]  # large's would be 128: not above 128


def test_smoke_grid_has_a_fallback_case_to_exercise():
    g = grid("nsys_profile_2026", "smoke")
    cases = chosen_2026_cases(g, None)
    assert cases == [("tiny", 16), ("tiny", 32), ("tiny", 64)] and fallback_2026_cases(g, cases) == [("tiny", 8)]


def test_timer_forward_returns_the_loss_without_its_graph():
    model = build_model(SizeRef("2026", "tiny"), 16, torch.device("cpu"))
    x, y = random_batch(model, 2, 16, torch.device("cpu"))
    loss = timer_forward_loss(model, x, y)
    assert loss.grad_fn is None and not loss.requires_grad and loss.ndim == 0


def test_the_first_runs_peaks_are_two_forward_graphs_not_one_step():
    """Every measured 2026 row of the first H100 run peaked at parameters + 2 x activations (closed form)
    within 2%, and the medium@2048 OOM is that figure above the device, while one step fits."""
    run = json.loads(read_run_text(RUN))
    for b in run["benchmarks"]:
        c = b["extra_info"]["config"]
        need = memory_need(SizeRef("2026", c["size"]), "train_step", "fp32", c["batch"], c["context"])
        two = need["parameters"] + 2 * need["activations"]
        peak = b["extra_info"]["memory"]["peak_allocated"]
        assert abs(peak / two - 1) < 0.02, (c["size"], c["context"], peak, two)
    (oom,) = [r["row"] for r in run["not_run"] if isinstance(r, dict) and r["row"]["status"] == "oom"]
    assert (oom["config"]["size"], oom["config"]["context"]) == ("medium", 2048)
    need = memory_need(SizeRef("2026", "medium"), "train_step", "fp32", 4, 2048)
    why = oom_vs_closed_form(need, H100)
    assert why["fits_by_closed_form"] and why["closed_form_train_step_bytes"] < H100 < why["two_forward_graphs_bytes"]
    assert why["known_cause_before_fix"] == TWO_GRAPHS_CAUSE
