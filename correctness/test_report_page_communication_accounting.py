"""communication_accounting (impl.report.pages.communication_accounting): facts from synthetic rows carrying
the closed forms as perf/test_communication_accounting.py stores them, and the page's words as a snapshot."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from impl.report.pages import Kind, Scored
from impl.report.pages import communication_accounting as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "communication_accounting"


def _cases():
    """perf/test_communication_accounting.py's CASES: each case's results as its rows carry them."""
    path = ROOT / "perf" / "test_communication_accounting.py"
    spec = importlib.util.spec_from_file_location("perf_comm_accounting", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


def _rows(device="cpu", when="2026-11-23T22:28:00", cases=("xxl", "bucket_model", "comm_volumes")):
    fns = _cases()
    return [bench(P, dict(case=c), 1e-5, device=device, when=when, details=dict(results=fns[c]())) for c in cases]


def test_each_case_reads_its_stored_results(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    fns = _cases()
    assert (f.xxl, f.bucket_model, f.comm_volumes) == (fns["xxl"](), fns["bucket_model"](), fns["comm_volumes"]())
    assert f.no_activations["tokens"] == 0 and f.no_activations is f.xxl["fsdp"][0]
    assert f.scores[P] == Scored(Kind.CLOSED_FORM, "closed form")
    assert f.sources == ["reports/data/cpu/communication_accounting/20261123T2228Z_abcdef12.json"]


def test_one_devices_rows_answer(tmp_path):
    """The same closed forms wherever they ran: the first device's rows are read, the others not."""
    rows = _rows() + _rows("h200-141gb-x2", "2026-11-26T00:00:00", cases=("xxl",))
    f = page.facts(context(rows, tmp_path))
    assert f.sources == [rows[0].run.file]


def test_without_the_xxl_case_nothing_is_computed(tmp_path):
    f = page.facts(context(_rows(cases=("bucket_model",)), tmp_path))
    assert f.xxl is None and f.scores[P].kind is Kind.NOT_MEASURED
    assert page.facts(context([], tmp_path)).scores[P].kind is Kind.NOT_MEASURED


def test_committed_rows_carry_the_xxl_case(tmp_path):
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    assert f.xxl["h100_needed"] * f.xxl["h100_bytes"] >= f.xxl["state"]["total"]
    assert f.no_activations["n_fsdp"] and f.xxl["compute_bound"]["global_tokens_int"] > 0
    assert f.bucket_model and f.comm_volumes and f.sources


def test_page_words(request, tmp_path):
    assert_snapshot(request, "communication_accounting",
                    render_page("communication_accounting.md.j2", f=page.facts(context(_rows(), tmp_path))))
