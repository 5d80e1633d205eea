"""parallelism_calcs (impl.report.pages.parallelism_calcs): the closed forms and the bounds evaluated at
C and W read from synthetic rows, the index's counting of closed-form answers, and the page's words as
a snapshot."""
from __future__ import annotations

from impl import parallelism_calcs as pc
from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Peaks
from impl.report.index import index_facts
from impl.report.pages import Kind, Scored
from impl.report.pages import parallelism_calcs as page
from impl.report.build import page_of
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

COMM = "distributed_communication_single_node"
CALCS = ["alternate_ring_all_reduce", "data_parallel_calcs", "fsdp_calcs", "tp_calcs", "fsdp_tp_calcs"]


def _ar(nbytes, n, busbw_gbps, backend="nccl", device="h200-141gb-x4", when="2026-11-26T04:00:00"):
    return bench(COMM, dict(backend=backend, world_size=n, bytes=nbytes), 0.01, device=device, when=when,
                 metrics={Metric.BUS_BW: busbw_gbps})


def _peak_row(device, flops, when, section="flash_shapes"):
    b = bench("flash_shapes", dict(seq=1024), 0.001, device=device, when=when, section=section)
    b.row.peaks = Peaks(flops, "bfloat16", 8192, 9.89e14)
    return b


def _rows():
    return [_ar(2**20, 2, 100.0), _ar(2**30, 2, 300.0), _ar(2**30, 4, 343.0), _ar(2**30, 4, 9.0, backend="gloo"),
            _peak_row("h100-80gb-x1", 7.36e14, "2026-11-24T00:00:00"),
            _peak_row("h100-80gb-x1", 6e14, "2026-11-20T00:00:00", section="leaderboard")]  # older: not read


def test_w_is_the_largest_nccl_all_reduce_and_c_the_newest_measured_peak(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    assert (f.w.bps, f.w.bytes, f.w.processes, f.w.device, f.w.date) == (343e9, 2**30, 4, "h200-141gb-x4", "2026-11-26")
    h100, h200, tpu = f.devices
    assert (h100.kind, h100.figures.C, h100.figures.W) == ("h100", 7.36e14, 343e9)
    assert h100.peak.run.section == "flash_shapes"
    assert h200.peak is None and h200.figures.C == datasheet_bf16_flops("H200")  # no peak measured on the H200s
    assert tpu.figures is pc.TPU_V5P_FIGURES and f.h100_borrows_w
    assert f.sources == sorted({b.run.file for b in _rows()[2:3] + _rows()[4:5]})


def test_world_size_picks_that_process_count():
    from impl.report.rows import Rows

    w = page.nccl_bus_bandwidth(Rows(tuple(_rows())), world_size=2)
    assert (w.bytes, w.processes, w.bps) == (2**30, 2, 300e9)


def test_bounds_are_impl_parallelism_calcs_at_each_devices_c_and_w(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    for d in f.devices:
        assert d.bounds == pc.parallelism_bounds(d.figures, f.wl.B, f.wl.D_FF)
    assert f.devices[0].kind == "h100"


def test_every_answer_is_the_symbolic_form_of_its_function(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.ar is pc.alternate_ring_all_reduce_time and f.dp.max_devices.formula is pc.dp_max_devices
    assert [a.formula for a in f.answers("ft")][-1] is pc.fsdp_tp_max_devices_serial
    formulas = {a.formula for r in ("dp", "tp", "ft") for a in f.answers(r)}  # the table's rows: symbolic form, name
    assert {pc.dp_max_devices, pc.tp_max_devices_forward, pc.fsdp_tp_max_devices} <= formulas


def test_without_an_all_reduce_only_tpu_v5p_is_evaluated(tmp_path):
    f = page.facts(context([_peak_row("h100-80gb-x1", 7.36e14, "2026-11-24T00:00:00")], tmp_path))
    assert f.w is None and [d.kind for d in f.devices] == ["tpu"] and not f.h100_borrows_w and f.sources == []


def test_the_index_counts_each_calculation_as_closed_form(tmp_path):
    """Closed-form rows are answered, not measured: the index's counts are the old page's."""
    f = page.facts(context(_rows(), tmp_path))
    assert set(f.scores) == set(CALCS)
    assert all(s == Scored(Kind.CLOSED_FORM, "closed form") for s in f.scores.values())
    rows = {r.problem: r for r in index_facts([page_of("parallelism_calcs", f)], [], {}).rows}
    for p in CALCS:
        assert rows[p].answered and not rows[p].measured and rows[p].device == "closed form"
    assert index_facts([page_of("parallelism_calcs", f)], [], {}).count(Kind.CLOSED_FORM) == len(CALCS)


def test_page_words(request, tmp_path):
    assert_snapshot(request, "parallelism_calcs",
                    render_page("parallelism_calcs.md.j2", f=page.facts(context(_rows(), tmp_path))))
