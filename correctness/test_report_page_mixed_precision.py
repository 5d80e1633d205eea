"""mixed_precision (impl.report.pages.mixed_precision): facts from synthetic and committed rows, and the
page's words as a snapshot."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from impl.report.pages import Kind
from impl.report.pages import mixed_precision as page
from impl.report.pages.benchmarking_script import editions
from impl.report.rows import Stats
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
ACC, DTYPES = "mixed_precision_accumulation", "benchmarking_mixed_precision"
DEV = "h100-80gb-x1"
VALUES = {"fp32 += fp32": 10.0001, "fp16 += fp16": 9.953125, "fp32 += fp16": 10.0021, "fp32 += fp16 cast to fp32": 10.0021}
FORMATS = {"fp32": dict(max=3.4e38, tiny=1.18e-38, eps=1.19e-07, bits=32, mantissa_bits=23),
           "fp16": dict(max=65504.0, tiny=6.1e-05, eps=0.0009765625, bits=16, mantissa_bits=10),
           "bf16": dict(max=3.39e38, tiny=1.18e-38, eps=0.0078125, bits=16, mantissa_bits=7)}


def _observed(dtype):
    return {"parameters": ["float32"], "fc1 output": dtype, "layernorm output": "float32", "logits": dtype,
            "loss": "float32", "gradients": ["float32"], "device_type": "cuda", "autocast_dtype": dtype}


def _script(edition, size, mode, dtype, mean, ctx_=512, std=None, when="2026-12-01T00:00:00", device=DEV):
    cfg = dict(size=size, edition=edition, context=ctx_, dtype=dtype, mode=mode,
               study="main_2026" if edition == "2026" else "main", batch=4)
    b = bench("benchmarking_script", cfg, mean, device=device, when=when)
    return replace(b, stats=Stats(mean, std if std is not None else mean / 100, mean, 0.0, 10, [mean] * 10))


def _rows(device=DEV, formats=True):
    rows = [bench(ACC, dict(steps=1000), 1e-3, device=device, section="mixed_precision", when="2026-11-22T05:00:00",
                  details=dict(exact=10.0, values=VALUES, errors={k: abs(v - 10.0) for k, v in VALUES.items()}))]
    rows += [bench(DTYPES, dict(autocast_dtype=d), 1e-3, device=device, section="mixed_precision",
                   when="2026-11-22T05:00:00",
                   details=dict(dtypes=_observed(d), **(dict(formats=FORMATS) if formats else {})))
             for d in ("float16", "bfloat16")]
    # 2025: training steps of two sizes, bf16 a gain at large, within noise and slower at small
    when25 = "2026-11-23T00:00:00"
    for size, ctx_, fp32, bf16, std in (("small", 256, 0.060, 0.066, 0.001), ("small", 512, 0.070, 0.072, 0.01),
                                        ("large", 512, 0.380, 0.260, 0.002)):
        for mode, k in (("forward", 0.3), ("train_step", 1.0)):
            rows += [_script(None, size, mode, "fp32", fp32 * k, ctx_, std, when25, device),
                     _script(None, size, mode, "bf16", bf16 * k, ctx_, std, when25, device)]
    # 2026: forward and backward timed apart, the bf16 gain growing with size
    for size, f32, b16 in (("small", 0.024, 0.020), ("xl", 0.333, 0.070)):
        for mode, k in (("forward", 1.0), ("backward", 2.0)):
            rows += [_script("2026", size, mode, "fp32", f32 * k, device=device),
                     _script("2026", size, mode, "bf16", b16 * k, device=device)]
    return rows


def test_accumulation_orders_the_loops_by_error():
    a = page.accumulation(_rows())
    assert a.steps == 1000 and a.exact == 10.0
    assert a.order[::3] == ["fp32 += fp32", "fp16 += fp16"]
    assert a.worst_over_best == pytest.approx(0.046875 / 0.0001)


def test_dtypes_are_typed_and_formats_compare_epsilons():
    d = page.dtypes(_rows())
    assert [(r["autocast_dtype"], r["fc1 output"], r["layernorm output"]) for r in d.runs] == [
        ("float16", "float16", "float32"), ("bfloat16", "bfloat16", "float32")]
    assert list(d.formats) == ["fp32", "fp16", "bf16"] and d.formats["fp16"]["max"] == 65504.0
    assert d.bf16_eps_over_fp16 == 8
    without = page.dtypes(_rows(formats=False))
    assert without.formats == {} and without.bf16_eps_over_fp16 is None


def test_bf16_trend_divides_the_grids_means_of_one_row_pair():
    e25, e26 = editions(_rows())
    t = page.bf16_trend(e25)
    assert t.best.size == "large" and t.best.ratio.value == pytest.approx(0.26 / 0.38)
    assert t.best.ratio.value == t.best.bf16.mean_s / t.best.fp32.mean_s
    assert [(p.size, p.context, p.ratio.verdict) for p in t.of("train_step")] == [
        ("small", 256, "slower"), ("small", 512, "within noise"), ("large", 512, "faster")]  # 0.072 vs 0.070 ± 0.01
    t26 = page.bf16_trend(e26)
    fw, bw = t26.largest_fb
    assert bw.size == "xl (2026) = 2.7B (2025)" and bw.ratio.value == pytest.approx(0.070 / 0.333)
    assert not t26.of("train_step") and t26.best is None


def test_the_newer_editions_forward_and_backward_score_c_with_their_rows_date(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    assert f.headline.edition == "2025" and f.headline_fb.edition == "2026" and f.score_fb
    s = f.scores
    assert s[DTYPES].kind is Kind.MEASURED and (s[DTYPES].device, s[DTYPES].date) == (DEV, "2026-12-01")
    assert s[ACC].kind is Kind.MEASURED and s[ACC].date == "2026-11-22"


def test_without_2026_rows_the_training_step_scores_c(tmp_path):
    rows = [b for b in _rows() if b.row.config.get("edition") != "2026"]
    f = page.facts(context(rows, tmp_path))
    assert not f.score_fb and f.headline.edition == "2025" and f.scores[DTYPES].date == "2026-11-23"


def test_the_first_gpu_device_answers_and_names_its_run_files(tmp_path):
    f = page.facts(context(_rows() + _rows("h100-80gb-x2") + _rows("cpu"), tmp_path))
    assert f.runs.device == DEV
    assert f.sources == sorted(f.sources) and all(f"/{DEV}/" in s for s in f.sources) and len(f.sources) == 3


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context(_rows("cpu"), tmp_path))
    assert f.runs is None and {k: s.kind for k, s in f.scores.items()} == {ACC: Kind.NOT_MEASURED,
                                                                             DTYPES: Kind.NOT_MEASURED}


def test_committed_bf16_trend_is_bf16_over_fp32_of_the_grids_means(tmp_path):
    from impl.report import build

    ctx = build.context(ROOT / "reports" / "data", tmp_path)
    eds = editions(ctx.rows.of("benchmarking_script", device=DEV))
    t = page.bf16_trend(eds[0])
    best = t.best
    assert best.mode == "train_step" and best.ratio.value == best.bf16.mean_s / best.fp32.mean_s
    assert best.ratio.value == min(p.ratio.value for p in t.of("train_step") if not p.ratio.noise)
    t26 = page.bf16_trend(eds[1])  # 2026: forward and backward of every size (10B's backward is OOM)
    assert {p.size for p in t26.of("forward")} == set(eds[1].sizes)
    fw, bw = t26.largest_fb
    assert bw.size == "xl (2026) = 2.7B (2025)" and bw.ratio.value == bw.bf16.mean_s / bw.fp32.mean_s
    assert not t26.of("train_step") and t26.best is None


def test_page_words(request, tmp_path):
    assert_snapshot(request, "mixed_precision", render_page("mixed_precision.md.j2",
                                                            f=page.facts(context(_rows(), tmp_path))))
