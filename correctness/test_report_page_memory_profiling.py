"""memory_profiling (impl.report.pages.memory_profiling): facts from synthetic rows, and the page's words as a
snapshot."""
from __future__ import annotations

from pathlib import Path

import pytest

from impl.bench.row import Status
from impl.model.sizes import SizeRef
from impl.report.pages import Kind
from impl.report.pages import memory_profiling as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "memory_profiling"
DEV = "h100-80gb-x1"
SMALL = SizeRef("2025", "small").config
STEP_TL = {"x": [0, 1, 2, 3, 4, 5], "y": [10, 30, 20, 5, 5, 9],
           "markers": [dict(x=0, name="forward"), dict(x=2, name="backward"), dict(x=4, name="optimizer"),
                       dict(x=6, name="end")]}
FWD_TL = {"x": [0, 1], "y": [10, 11], "markers": [dict(x=0, name="forward"), dict(x=2, name="end")]}
CF = {"param_bytes": 13.6e9, "train_step_need_bytes": 204.8e9}
WHEN_2025, WHEN_2026 = "2026-11-22T05:04:00", "2026-11-24T15:42:00"


def _mem(cfg, peak=None, status=Status.MEASURED, details=None, when=WHEN_2025):
    return bench(P, dict(batch=4, **cfg), 0.1 if status is Status.MEASURED else None, device=DEV, when=when,
                 status=status, details=details, peak=peak)


def _rows_2025(contexts=(128, 256, 512), marked=False):
    """small (2025) at `contexts`: fp32 forward and training step with timelines, the fp32 forward's largest
    allocations (the FFN hidden below 512, the attention scores at 512), a bf16 forward at 128 and 512 whose
    FFN-weight-sized allocations are autocast's copies. `marked`: the rows carry details.reference_context
    (newer runs) with 256 as the reference."""
    ffn, hidden = SMALL.d_model * SMALL.d_ff * 2, lambda c: 4 * c * SMALL.d_ff * 4
    scores = lambda c: 4 * SMALL.num_heads * c * c * 4  # noqa: E731
    rows = []
    for c in contexts:
        mark = dict(reference_context=c == 256) if marked else {}
        big = [dict(size=scores(c), count=2 * SMALL.num_layers, frames=["naive.py:25"]),
               dict(size=scores(c), count=SMALL.num_layers, frames=["naive.py:31"])] if c >= 512 else \
            [dict(size=hidden(c), count=2 * SMALL.num_layers, frames=["layers.py:26"])]
        step_big = [dict(size=scores(c), count=5 * SMALL.num_layers, frames=[])] + big[:1] if c >= 512 else []
        rows.append(_mem(dict(size="small", context=c, dtype="fp32", mode="train_step"), 40 + c // 256,
                         details=dict(mark, snapshot=dict(timeline=STEP_TL, largest=step_big))))
        rows.append(_mem(dict(size="small", context=c, dtype="fp32", mode="forward"), 12 + c, details=dict(mark,
            snapshot=dict(timeline=FWD_TL, largest=big, residual={"4": dict(
                bytes=4 * c * SMALL.d_model * 4, found=True, count=7, frames=["layers.py:40"])}))))
        if c in (128, 512):
            top = [dict(size=scores(c), count=SMALL.num_layers, frames=["naive.py:31"])] if c >= 512 else []
            rows.append(_mem(dict(size="small", context=c, dtype="bf16", mode="forward"), 13, details=dict(mark,
                snapshot=dict(largest=top + [dict(size=ffn, count=3 * SMALL.num_layers, frames=["l:26"])]))))
    return rows


def _rows_2026():
    """xl (2026) at 2048: an fp32 forward (residual stream, largest allocations), its OOM training step,
    and a block probe."""
    base = dict(size="xl", edition="2026", dtype="fp32", context=2048)
    fwd = _mem(dict(base, mode="forward"), 19_000_000_000, when=WHEN_2026, details=dict(
        closed_form=CF, residual_derivation=dict(batch=4, context=2048, d_model=2560, bytes_per_elem=4),
        snapshot=dict(timeline={"x": [0, 1], "y": [1, 2]}, residual={"4": dict(found=True, count=580, frames=["l:40"])},
                      largest=[dict(size=2**31, count=64, frames=["naive.py:25"]), dict(size=2**20, count=9, frames=[])])))
    oom = _mem(dict(base, mode="train_step"), status=Status.OOM, when=WHEN_2026, details=dict(closed_form=CF))
    probe = _mem(dict(base, mode="block_probe"), when=WHEN_2026, details=dict(
        block_saved_bytes_closed_form_fp32=4669636608, block_memory=dict(
            block=1, saved_bytes=4669636608, top_share=0.82, backward_change_bytes=[-4250185728] * 3,
            grad_bytes_measured=419450880, grad_bytes_expected=419450880, block_params=104862720,
            top=[dict(op="aten::_softmax", module="attn", nbytes=2147483648, tensors=1, share=0.46)])))
    return [oom, fwd, probe]


def test_2026_facts_peaks_residual_and_block_gradients_come_from_the_rows():
    old = _mem(dict(size="2.7B", context=512, dtype="fp32", mode="forward"), 1)
    m = page.memory_2026_facts([page.mem_case(b) for b in [old] + _rows_2026()])
    assert m.size.startswith("xl (2026)") and m.contexts == [2048] and m.date == "2026-11-24"
    assert m.params == SizeRef("2026", "xl").config.params
    c = m.case(2048, "fp32", "forward")
    assert c.peak_bytes == 19_000_000_000 and m.case(2048, "fp32", "train_step").need_bytes == 204.8e9
    r, = m.residuals
    assert r.nbytes == 4 * 2048 * 2560 * 4 and r.found and r.count == 580
    case, big = m.largest
    assert big["size"] == 2**31 and case.context == 2048 and m.forward_largest == [(case, big)]
    p = m.probe("fp32")
    assert p.top[0]["op"] == "aten::_softmax" and p.top[0]["share"] == 0.46
    assert p.grad_from_change == 419450880 == p.grad_bytes_expected and p.grad_over_expected == 1.0


def test_2025_facts_phases_peaks_and_named_allocations_come_from_the_rows():
    """(a) from the timelines' phase levels at the longest context, (b) the fp32 peaks per context, (d) and (e) at
    the grid's reference context (512): the residual stream there, the forward's largest allocations the
    attention scores, the bf16 forward's FFN-weight-sized allocations named as autocast copies (3 per block)."""
    f = page.memory_2025_facts([page.mem_case(b) for b in _rows_2025()])
    assert f.contexts == [128, 256, 512] and f.measured("fp32", "train_step") == [40, 41, 42]
    assert f.measured("fp32", "forward") == [140, 268, 524] and not f.bf16  # the bf16 training step was not run
    assert f.timelines and (f.step["forward"].start, f.step["forward"].top, f.step["backward"].end) == (10, 30, 5)
    assert f.optimizer_spikes == [4, 4, 4] and f.step_forward_tops == {128: 30, 256: 30, 512: 30}
    assert page.REFERENCE_CONTEXT == 512 and f.reference_context == 512 and f.answer_context == 512 and f.at_reference
    assert (f.residual.context, f.residual.nbytes, f.residual.found) == (512, 4 * 512 * SMALL.d_model * 4, True)
    # the other contexts' residual streams are extra rows, one per context
    assert [(r.context, r.nbytes) for r in f.residuals] == [(c, 4 * c * SMALL.d_model * 4) for c in (128, 256, 512)]
    ffn, scores = SMALL.d_model * SMALL.d_ff * 2, 4 * SMALL.num_heads * 512 * 512 * 4
    assert [(x.kind, x.dtype, x.nbytes, x.count, x.secondary) for x in f.named] == [
        ("largest", "fp32", scores, 3 * SMALL.num_layers, False), ("largest", "bf16", scores, SMALL.num_layers, False),
        ("ffn_copy", "bf16", ffn, 3 * SMALL.num_layers, True), ("largest", "fp32", scores, 7 * SMALL.num_layers, False)]
    # the training step's: every allocation of that size, those without a Python stack trace counted apart
    assert f.named[-1].mode == "train_step" and f.named[-1].untraced == 5 * SMALL.num_layers and not f.named[0].untraced
    assert f.named[0].sites == (("naive.py:25", 24), ("naive.py:31", 12))
    assert page.SizedAs("fp32", "scores") in f.named[0].label and f.batch == 4
    assert {c.context for c, _ in f.largest} == {512}
    # (e)'s extra rows: each context's largest allocation, the FFN hidden below 512
    assert [(x, a.dtype, a.mode, a.nbytes) for x, a in f.largest_rows] == [
        (128, "fp32", "forward", 4 * 128 * SMALL.d_ff * 4), (128, "bf16", "forward", ffn),
        (256, "fp32", "forward", 4 * 256 * SMALL.d_ff * 4), (512, "fp32", "forward", scores),
        (512, "bf16", "forward", scores), (512, "fp32", "train_step", scores)]
    assert f.largest_rows[0][1].label == (page.SizedAs("fp32", "ffn_hidden"),)


def test_2025_facts_without_rows_at_the_reference_context_name_the_gap_not_another_context(tmp_path):
    """No rows at 512: (d) and (e) stay at the reference context, each with its gap (no fp32 forward row there);
    the closed form still answers (d), and 128 and 256 are extra rows only."""
    f = page.memory_2025_facts([page.mem_case(b) for b in _rows_2025((128, 256))])
    assert f.reference_context == 512 == f.answer_context and f.at_reference
    assert f.residual is None and f.residual_bytes == 4 * 512 * SMALL.d_model * 4
    assert f.gaps == (page.Gap("d", "row"), page.Gap("e", "row")) and f.gap("e").row is None
    assert f.named == [] and f.largest == [] and [x.context for x in f.residuals] == [128, 256]
    assert {x for x, _ in f.largest_rows} == {128, 256}
    assert page.facts(context(_rows_2025((128, 256)), tmp_path)).facts_2025 == f  # what the page words
    # without a reference context at all (an earlier grid's rows): the shortest, and no gaps
    g = page.memory_2025_facts([page.mem_case(b) for b in _rows_2025((128, 256))], reference=None)
    assert g.answer_context == 128 and g.reference_context is None and not g.at_reference and g.gaps == ()


def _without_trace(rows):
    """`rows` with the fp32 forward at 512 as a run before the allocation traces stored it: no snapshot."""
    return [bench(P, b.row.config, 0.1, device=DEV, when=WHEN_2025, peak=b.row.memory.peak_allocated, details={})
            if (b.row.config["context"], b.row.config["dtype"], b.row.config["mode"]) == (512, "fp32", "forward")
            else b for b in rows]


def test_a_reference_row_without_its_trace_is_a_gap_that_names_the_row(tmp_path):
    """The fp32 forward at 512 stored without a snapshot (no other row there has a residual lookup either): both
    gaps name that row and its run, and (e) still lists the other rows at 512 (bf16 forward, training step). An
    OOM there is a gap of the measurement."""
    rows = _without_trace(_rows_2025())
    f = page.memory_2025_facts([page.mem_case(b) for b in rows])
    assert f.answer_context == 512 and [(g.part, g.lacks) for g in f.gaps] == [("d", "residual"), ("e", "largest")]
    g = f.gap("e").row
    assert (g.context, g.dtype, g.mode) == (512, "fp32", "forward") and g.run.file.endswith(".json")
    assert [(x.dtype, x.mode) for x in f.named if not x.secondary] == [("bf16", "forward"), ("fp32", "train_step")]
    oom = [bench(P, b.row.config, device=DEV, when=WHEN_2025, status=Status.OOM, reason="CUDA out of memory")
           if b.row.config["context"] == 512 and b.row.config["mode"] == "forward" and b.row.config["dtype"] == "fp32"
           else b for b in rows]
    h = page.memory_2025_facts([page.mem_case(b) for b in oom])
    assert [(g.part, g.lacks) for g in h.gaps] == [("d", "measurement"), ("e", "measurement")]
    assert h.gap("d").row.status is Status.OOM


def test_a_row_is_at_the_reference_by_its_mark_else_by_batch_4_at_context_512():
    """Runs since 2fbd353 mark their rows; earlier rows of the same grid are read by their config."""
    def at(context, batch=4, **mark):
        b = bench(P, dict(size="2.7B", context=context, dtype="fp32", mode="forward", batch=batch), 0.1,
                  device=DEV, details=mark)
        return page.is_reference(page.mem_case(b))
    assert page.REFERENCE_BATCH == 4 and at(512) and not at(256) and not at(512, batch=8)
    assert at(256, reference_context=True) and not at(512, reference_context=False)


def _renamed_rows(tmp_path):
    """An older run's rows named without the edition, a newer run's with it; the newer rows' snapshots named
    snap-<i>.pickle, the one at the reference context (snap-6) stored under reports/artifacts/."""
    old = _rows_2025()
    new = [bench(P, dict(b.row.config, edition="2025"), 0.1, device=DEV, when="2026-11-26T11:37:00",
                 commit="2fbd353", peak=b.row.memory.peak_allocated + 1, name=b.name.replace("[", "[2025-"),
                 details=dict(b.details, snapshot=dict(b.details["snapshot"], artifact=f"snap-{i}.pickle")))
           for i, b in enumerate(old)]
    assert not {b.name for b in old} & {b.name for b in new}
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "snap-6.pickle").write_bytes(b"x")  # small-512-fp32-forward's
    return old, new


def test_a_case_stored_under_an_older_name_is_answered_by_its_newest_row_only(tmp_path):
    """An older run named its rows without the edition (`small-512-fp32-forward`), a newer one with it
    (`2025-small-512-...`): both are the same case, so the page reads the newer row alone and no longer names
    the older run; the newer rows' kept snapshot at the answering context is linked first where it is stored."""
    old, new = _renamed_rows(tmp_path)
    f = page.facts(context(old + new, tmp_path))
    assert f.facts_2025.measured("fp32", "forward") == [141, 269, 525]  # the newer rows' peaks
    assert f.sources == sorted({b.run.file for b in new}) and len(f.runs.runs) == 1
    assert len(f.peaks) == 3  # one row per (size, context)
    first, *rest = f.artifacts
    assert (first.name, first.context, first.mode, first.reference, first.link) == (
        "snap-6.pickle", 512, "forward", True, "artifacts/snap-6.pickle")
    assert all(a.link is None for a in rest) and [a.reference for a in f.artifacts] == [True] * 3 + [False] * 5
    assert [(a.context, a.dtype, a.mode) for a in f.artifacts[:3]] == [
        (512, "fp32", "forward"), (512, "fp32", "train_step"), (512, "bf16", "forward")]
    assert "snap-0.pickle" in {a.name for a in rest}  # named, not linked: not stored


def test_the_page_sets_the_2026_rows_beside_the_2025_ones(tmp_path):
    f = page.facts(context(_rows_2025() + _rows_2026(), tmp_path))
    assert f.facts_2025.size == SizeRef("2025", "small").label and f.facts_2026.size == SizeRef("2026", "xl").label
    assert f.earlier is None and [mode for mode, _ in f.facts_2026.figures] == ["forward"]
    assert [(mode, dtype) for mode, dtype, _ in f.timelines] == [("forward", "fp32"), ("train_step", "fp32")]
    assert all((tmp_path / link).is_file() for *_, link in f.timelines)
    # the index reads the newer edition's run
    assert f.scores[P] == page.Scored(Kind.MEASURED, "H100", "2026-11-24")
    assert f.sources == sorted({b.run.file for b in _rows_2025() + _rows_2026()})
    # one peak row per (size, context): the OOM step is its cell, a mode not run is None
    xl = next(r for r in f.peaks if r.size == SizeRef("2026", "xl").label)
    assert xl.cells[1].status is Status.OOM and xl.cells[2] is None and xl.cells[0].peak_bytes == 19_000_000_000


def test_without_2026_rows_an_earlier_grid_at_its_contexts_is_named_not_the_answer(tmp_path):
    """The 2025 table's xl at the 2026 contexts is another model: its rows are kept apart from (a)-(e),
    named by the 2026 questions' answer and shown under their own label."""
    xl = [_mem(dict(size="xl", context=c, dtype="fp32", mode=m), 7 * 2**30 + c, details=dict(snapshot=dict(
        residual={"4": dict(bytes=4 * c * 1600 * 4, found=True, count=3, frames=["l:40"])})))
        for c in (128, 2048) for m in ("forward", "train_step")]
    f = page.facts(context(_rows_2025() + xl, tmp_path))
    assert f.facts_2026 is None and f.facts_2025.contexts == [128, 256, 512]  # (a)-(e) read small only
    e = f.earlier
    assert not e.own and e.size == SizeRef("2025", "xl").label and e.contexts == [128, 2048]
    assert f.no_2026_sizes == [SizeRef("2025", "xl").label]
    assert [p.context for p in e.peaks] == [128, 2048] and e.peaks[1].cells[2] is None and e.peaks[0].cells[1].measured
    assert [(r.context, r.dtype, r.bytes_per_elem) for r in e.residual_rows] == [(128, "fp32", 4), (2048, "fp32", 4)]
    assert f.scores[P] == page.Scored(Kind.MEASURED, "H100", "2026-11-22")


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context(_rows_2026(), tmp_path))  # 2026 rows alone answer no 2025 question
    assert f.facts_2025 is None and f.scores[P].kind is Kind.NOT_MEASURED and f.sources == []
    assert page.facts(context([], tmp_path)).runs is None


def test_committed_rows_label_each_edition_its_own_rows(tmp_path):
    """xl (2025) and xl (2026) share the stored name "xl": each row of the peak table is one edition's,
    and the 2026 answers read the edition-2026 rows at contexts 128 and 2048 only."""
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    sizes = [(r.size, r.context) for r in f.peaks]
    assert {SizeRef("2025", "xl").label, SizeRef("2026", "xl").label} <= {s for s, _ in sizes}
    assert len(sizes) == len(set(sizes))
    assert f.facts_2026.size == SizeRef("2026", "xl").label and f.facts_2026.contexts == [128, 2048]
    assert f.facts_2025.size == SizeRef("2025", "2.7B").label and f.facts_2026.batch == 4


def test_committed_2025_rows_answer_d_and_e_at_the_reference_context(tmp_path):
    """The committed 2025 rows mark context 512 (details.reference_context): (d) and (e) are answered there, (e)'s
    largest allocations are the (batch, heads, 512, 512) fp32 score/probability tensors, every (size, context) is
    one row although the older run stored the same cases under other names, and the 512 snapshot is stored."""
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    y, m = f.facts_2025, SizeRef("2025", "2.7B").config
    assert y.reference_context == 512 == y.answer_context and y.at_reference and y.residual.context == 512
    assert y.residual.nbytes == y.residual_bytes == y.batch * 512 * m.d_model * 4 and y.residual.found
    assert y.gaps == ()  # the 512 rows have their residual lookup and allocation trace
    top = y.named[0]
    assert (top.dtype, top.mode, top.nbytes) == ("fp32", "forward", y.batch * m.num_heads * 512 * 512 * 4)
    assert page.SizedAs("fp32", "scores") in top.label
    assert {x for x, _ in y.largest_rows} == {128, 256, 512}
    assert len([r for r in f.peaks if r.size == y.size]) == 3
    a = f.artifacts[0]
    assert (a.context, a.dtype, a.mode, a.reference) == (512, "fp32", "forward", True)
    assert (ROOT / "reports" / "artifacts" / a.name).is_file()


def test_allocation_labels_name_every_tensor_of_that_size_and_only_the_rows_dtypes():
    # xl (2025), batch 4, context 128: fp32 logits (4·128·10000·4 B) = bf16 FFN weight (1600·6400·2 B)
    xl = SizeRef("2025", "xl").config
    size = 4 * 128 * 10_000 * 4
    assert page.shape_labels(xl, 4, 128, "fp32")[size] == (page.SizedAs("fp32", "logits"),)
    both = page.shape_labels(xl, 4, 128, "bf16")[size]
    assert page.SizedAs("fp32", "logits") in both and page.SizedAs("bf16", "ffn_weight") in both
    assert not any(t.dtype == "bf16" for v in page.shape_labels(xl, 4, 128, "fp32").values() for t in v)


def test_page_words(request, tmp_path):
    assert_snapshot(request, P, render_page(f"{P}.md.j2", f=page.facts(context(_rows_2025() + _rows_2026(), tmp_path))))


def _filed_nsys(tmp_path, saved=4669636608):
    """A filed memory_profiling case at the probe's context: each of 3 blocks keeps `saved` bytes."""
    from kits.nsys_outputs import file_run, write_memory_export

    tmp_path.mkdir(parents=True, exist_ok=True)
    ev, ranges = [(0, 2**30, 0, 2)], [("step 0", 0, 100), ("forward", 1, 40), ("backward", 50, 90)]
    for k in range(3):
        t = 10 * k + 5
        ev += [(t, saved, 0, 2), (t + 1, 2**20, 0, 2), (t + 2, 2**20, 1, 2)]
        ranges.append((f"block {k}", t - 1, t + 3))
    ev += [(60 + k, saved, 1, 2) for k in range(3)]
    export = write_memory_export(tmp_path / "mem.sqlite", ev, ranges)
    file_run(tmp_path / "data", "h200-141gb-x2", "20261126T090839Z",
             [("memory_profiling_2026_xl_ctx2048_fp32", "memory_profiling",
               dict(edition="2026", size="xl", context=2048, batch=4, dtype="fp32"), export)])


def test_nsys_blocks_leave_their_saved_bytes_beside_torch_profilers_probe(tmp_path):
    _filed_nsys(tmp_path)
    f = page.facts(context(_rows_2025() + _rows_2026(), tmp_path))
    (c,) = f.nsys.cases
    assert [b.net for b in c.blocks] == [4669636608] * 3 and c.per_block.allocations == 2
    assert c.torch_saved == 4669636608 and c.agrees and c.backward.net == -3 * 4669636608
    assert (tmp_path / c.figure).is_file() and any(s.endswith(".memory.json.gz") for s in f.sources)
    _filed_nsys(tmp_path / "off", saved=4 * 10**9)
    assert not page.facts(context(_rows_2025() + _rows_2026(), tmp_path / "off")).nsys.cases[0].agrees


@pytest.mark.parametrize("case", ["missing_reference", "no_trace", "artifacts"])
def test_page_words_of_2025(request, tmp_path, case):
    """2025's other wordings: (d) and (e) without rows at the reference context, or with its fp32 forward stored
    without a trace (each gap named with the call that records it), and the kept snapshots named, the stored one
    linked."""
    rows = {"missing_reference": lambda: _rows_2025((128, 256)), "no_trace": lambda: _without_trace(_rows_2025()),
            "artifacts": lambda: sum(_renamed_rows(tmp_path), [])}[case]()
    assert_snapshot(request, f"{P}-{case}", render_page(f"{P}.md.j2", f=page.facts(context(rows, tmp_path))))


def test_page_words_with_nsys(request, tmp_path):
    _filed_nsys(tmp_path)
    assert_snapshot(request, f"{P}_nsys",
                    render_page(f"{P}.md.j2", f=page.facts(context(_rows_2025() + _rows_2026(), tmp_path))))
