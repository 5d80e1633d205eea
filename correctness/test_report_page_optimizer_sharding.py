"""optimizer_state_sharding(_accounting) (impl.report.pages.optimizer_sharding): facts from synthetic rows
and the committed runs, and the page's words as a snapshot."""
from __future__ import annotations

from pathlib import Path

import pytest

from impl.bench.row import Status
from impl.report.pages import Kind, Scored
from impl.report.pages import optimizer_sharding as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "optimizer_state_sharding_accounting"
X2, H100 = "h200-141gb-x2", "h100-80gb-x2"
NEW, OLD = "2026-11-26T05:00:00", "2026-11-23T06:00:00"
GiB = 2**30
N_PARAMS = 2e9  # Ψ = 8 GB of fp32 gradients


def _rank(state, after_peak, activations=10 * GiB, grads=7.5 * GiB):
    return dict(init_peak=15 * GiB, init_allocated=7.6 * GiB, before_peak=30 * GiB + state, after_peak=after_peak,
                named_before=dict(parameters=7.5 * GiB, gradients=grads, buffers=0),
                named_after=dict(optimizer_state=state),
                activations=activations, other_before=0.1 * GiB)


def _row(variant, median, *, device=X2, when=NEW, edition="2026", state=15 * GiB, peaks=(38 * GiB, 37 * GiB),
         activations=10 * GiB, status=Status.MEASURED, reason=None, size="xl", n_params=N_PARAMS):
    """A variant's row: two ranks, the second with the smaller peak after the step."""
    details = dict(n_params=n_params, comm_bytes_per_step=n_params * 4, comm_bytes_source="counted",
                   predicted=dict(parameters=7.5 * GiB, gradients=7.5 * GiB, optimizer_state=state,
                                  activations=22 * GiB),
                   predicted_ring_bytes_per_rank=dict(ddp=8e9, sharded_simple=12e9, zero1=8e9),
                   ranks=[_rank(state, p, activations) for p in peaks], steps=dict(opt_s=(median or 0) / 10))
    return bench(P, dict(size=size, edition=edition, context=512, batch_per_rank=4, world_size=2, backend="nccl",
                         variant=variant), median if status is Status.MEASURED else None, device=device,
                 section="optimizer_sharding", when=when, status=status, reason=reason,
                 details=details if status is Status.MEASURED else {})


def _rows():
    """A 2026 run on 2×H100 (torch's ZeRO not run) and a 2025 run on 2×H200 whose ZeRO-1 held its
    gradients twice through backward."""
    new = [_row("none", 1.14, device=H100, state=25 * GiB, peaks=(64 * GiB, 63 * GiB)),
           _row("sharded", 1.15, device=H100, state=12.5 * GiB, peaks=(51 * GiB, 50 * GiB)),
           _row("zero1", 1.13, device=H100, state=12.5 * GiB, peaks=(39 * GiB, 38 * GiB)),
           _row("torch_zero", None, device=H100, status=Status.NEEDS_HARDWARE, reason="needs 2 GPUs")]
    old = [_row("none", 0.75, when=OLD, edition="2025"),
           _row("sharded", 0.76, when=OLD, edition="2025", state=7.5 * GiB, peaks=(30 * GiB, 29 * GiB)),
           _row("zero1", 0.73, when=OLD, edition="2025", state=7.5 * GiB, peaks=(23 * GiB, 22 * GiB),
                activations=17.5 * GiB)]
    return new + old


def _ctx(tmp_path, rows=None):
    log = tmp_path / "data" / X2 / "logs" / page.LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("collected 103 items\n\n103 passed in 59.71s\n")
    return context(_rows() if rows is None else rows, tmp_path)


@pytest.fixture
def f(tmp_path):
    return page.facts(_ctx(tmp_path))


def test_each_variant_reads_its_largest_rank_and_ratios_divide_one_run(f):
    new, old = f.answers
    assert (new.run.edition, old.run.edition) == ("2026", "2025")  # the current edition answers first
    assert new.sharded.after_peak == 51 * GiB and new.sharded.state == 12.5 * GiB < new.none.state
    assert new.sharded.vs(new.none, "x").value == pytest.approx(1.15 / 1.14)
    assert old.zero1.vs(old.sharded, "x").value == pytest.approx(0.73 / 0.76)
    assert new.zero1.grad_gb == pytest.approx(8.0)


def test_the_scoreboard_reads_the_newest_edition_with_both_rows_and_the_verdict_its_log(f):
    assert f.scored.device == H100 and f.scored.run.edition == "2026"
    assert f.verdict.device == X2 and f.verdict.passed == "103 passed"
    assert f.scores == {"optimizer_state_sharding": Scored(Kind.MEASURED, X2),
                        P: Scored(Kind.MEASURED, H100, "2026-11-26")}


def test_oddities_init_peak_and_zero1_gradients_held_twice(f):
    new, old = f.answers
    assert old.init["init_peak"] == 15 * GiB and old.init["named_before"]["parameters"] == 7.5 * GiB
    za, sa = old.zero1_held_twice
    assert (za["activations"], sa["activations"], za["named_before"]["gradients"], old.zero1.b.run.commit) == (
        17.5 * GiB, 10 * GiB, 7.5 * GiB, "abcdef12")
    assert new.zero1_held_twice is None  # the same transient: nothing to explain


def test_table_rows_per_rank_and_not_run_variants_named_with_their_reason(f):
    new, _ = f.answers
    none, sharded, zero1, torch_zero = new.variants
    t = torch_zero
    assert (t.b.status, t.b.row.reason, t.ranks) == (Status.NEEDS_HARDWARE, "needs 2 GPUs", ())
    assert len(sharded.ranks) == 2 and sharded.after_peak == 51 * GiB
    assert (sharded.predicted_volume, none.predicted_volume, zero1.predicted_volume) == (12e9, 8e9, 8e9)
    assert sharded.opt_s == pytest.approx(0.115) and sharded.payload_source == "counted"
    assert new.big and new.psi == N_PARAMS * 4


def test_a_smoke_model_is_told_in_mib(tmp_path):
    (r,) = page.facts(_ctx(tmp_path, [_row("none", 0.01, size="tiny", n_params=1e6)])).answers
    assert not r.big and r.config.size_label == "tiny"


def test_without_both_rows_of_the_current_edition_the_older_one_scores(tmp_path):
    rows = [b for b in _rows() if not (b.run.device == H100 and b.row.config["variant"] == "sharded")]
    f = page.facts(_ctx(tmp_path, rows))
    assert f.scored.run.edition == "2025" and f.scores[P].date == "2026-11-23"
    assert f.answers[0].sharded is None


def test_sources_name_every_run_file_read(f):
    assert f.sources == sorted({b.run.file for b in _rows()})


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.answers == [] and {s.kind for s in f.scores.values()} == {Kind.NOT_MEASURED}


def test_committed_2025_run_reads_the_rows_size_and_its_zero1_transient(tmp_path):
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    old = next(r for s in f.sections if s.device == X2 for r in s.runs if r.run.edition == "2025")
    assert old.run.size_short == "xl (2025)" and all(x.startswith(f"reports/data/{X2}/") for x in old.run.files)
    ranks = old.sharded.b.details["ranks"]
    assert old.sharded.after_peak == max(r["after_peak"] for r in ranks) and old.sharded.state < old.none.state
    za, sa = old.zero1_held_twice
    assert za["activations"] - sa["activations"] > 0


def test_page_words(request, tmp_path):
    text = render_page("optimizer_sharding.md.j2", f=page.facts(_ctx(tmp_path)))
    assert_snapshot(request, "optimizer_sharding", text)
