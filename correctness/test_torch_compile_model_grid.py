"""torch_compile (b)'s sweep (issue 45): the timed training step beside eager for every size, the 2026
edition's 10B included, in an order that lets a budget cut fall last on the largest size, and the rows
an OOM of the same run already answers (impl.workloads.compiled)."""
from impl.model import SizeRef
from impl.bench.harness import Budget
from impl.bench.row import Status
from impl.workloads.compiled import compile_model_case_id, compile_model_cases, implied_by_oom, not_run_reason
from impl.workloads.steps import memory_need
from impl.workloads.sweeps import grid

H100 = 85_017_493_504  # bytes, torch.cuda.get_device_properties(...).total_memory on the lent H100


def test_full_grid_times_the_training_step_for_every_size_the_10b_included():
    g = grid("torch_compile_model", "full")
    assert [s.id for s in g.sizes] == ["2025-small", "2025-medium", "2025-large", "2025-xl", "2025-2.7B", "2026-10B"]
    assert [str(m) for m in g.modes] == ["forward", "forward_backward", "train_step"]
    assert g.contexts == (128, 256, 512, 1024) and g.budget_s <= 480  # inside gpu_run.sh's 540 s, longest row ~20 s
    cases = compile_model_cases(g.sizes, g.contexts, g.modes)
    train = [(s.name, c, i) for s, c, m, i in cases if m == "train_step"]
    assert ("2.7B", 1024, "compiled") in train and ("10B", 128, "eager") in train and len(train) == 6 * 4 * 2


def test_smoke_grid_has_the_training_step_too():
    g = grid("torch_compile_model", "smoke")
    assert "train_step" in [str(m) for m in g.modes] and {s.edition for s in g.sizes} == {"2025", "2026"}


def test_cases_run_optimizer_first_then_contexts_ascending_eager_before_compiled():
    small = SizeRef("2025", "small")
    cases = compile_model_cases((small,), (256, 128), ("forward", "train_step"))
    assert [(c, m, i) for _, c, m, i in cases][:6] == [
        (None, "optimizer_step", "eager"), (None, "optimizer_step", "compiled"), (128, "forward", "eager"),
        (128, "forward", "compiled"), (128, "train_step", "eager"), (128, "train_step", "compiled")]


def test_ids_keep_the_2025_names_and_mark_the_2026_sizes():
    assert compile_model_case_id(SizeRef("2025", "small"), 128, "forward", "eager") == "small-128-forward-eager"
    assert compile_model_case_id(SizeRef("2026", "10B"), 128, "train_step", "compiled") == \
        "2026-10B-128-train_step-compiled"


def test_an_oom_answers_heavier_and_longer_rows_of_the_same_size_and_impl_only():
    ten = SizeRef("2026", "10B")
    ooms = {(ten, "eager"): [("forward_backward", 256)]}
    assert implied_by_oom(ooms, ten, 256, "train_step", "eager")  # same context, heavier mode
    assert implied_by_oom(ooms, ten, 512, "forward_backward", "eager")  # longer context
    assert implied_by_oom(ooms, ten, 128, "forward_backward", "eager") is None  # shorter: may fit
    assert implied_by_oom(ooms, ten, 1024, "forward", "eager") is None  # lighter mode: may fit
    assert implied_by_oom(ooms, ten, 256, "train_step", "compiled") is None  # another impl
    assert implied_by_oom(ooms, SizeRef("2025", "2.7B"), 256, "train_step", "eager") is None
    assert implied_by_oom(ooms, ten, None, "optimizer_step", "eager") is None  # the optimizer row always runs
    opt = {(ten, "compiled"): [("optimizer_step", None)]}
    assert "optimizer step" in implied_by_oom(opt, ten, 128, "train_step", "compiled")
    assert implied_by_oom(opt, ten, 128, "forward_backward", "compiled") is None


def test_a_row_an_oom_answers_says_so_even_after_the_budget_ran_out():
    """The OOM's reason wins over the budget's: it is the truer one (the 10B's fwd+bwd at 512 after the OOM
    at 128 was recorded "left out by budget" on 2026-11-27)."""
    ten, spent, fresh = SizeRef("2026", "10B"), Budget(0.0), Budget(3600.0)
    spent.deadline = 0.0  # ran out long ago
    ooms = {(ten, "eager"): [("forward_backward", 128)]}
    status, reason = not_run_reason(ooms, spent, ten, 512, "forward_backward", "eager")
    assert status is Status.LEFT_OUT and "ran out of memory at context 128" in reason
    assert not_run_reason(ooms, spent, ten, 512, "forward", "eager") == (Status.LEFT_OUT_BY_BUDGET, spent.reason())
    assert not_run_reason(ooms, fresh, ten, 512, "forward", "eager") is None


def test_closed_form_the_10b_forward_fits_an_h100_and_its_training_does_not():
    ten = SizeRef("2026", "10B")
    assert memory_need(ten, "forward", "fp32", 4, 1024)["total"] < 0.7 * H100
    assert memory_need(ten, "forward_backward", "fp32", 4, 128)["total"] > H100
    # the training step's rows that may not fit one H100 by the closed form: xl@1024, 2.7B@1024
    assert memory_need(SizeRef("2025", "2.7B"), "train_step", "fp32", 4, 1024)["total"] > H100
    assert memory_need(SizeRef("2025", "large"), "train_step", "fp32", 4, 1024)["total"] < H100
