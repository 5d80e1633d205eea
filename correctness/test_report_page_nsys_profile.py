"""nsys_profile (impl.report.pages.nsys_profile): facts from synthetic and committed rows, and the page's
words as a snapshot."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from impl.bench.row import Status
from impl.report.pages import Kind
from impl.report.pages import nsys_profile as page
from impl.report.rows import Stats
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "nsys_profile"
DEV = "h100-80gb-x1"
GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_execute_kernel"


def _kernels(n, **first):
    rows = [dict(name=f"{GEMM}_{i}", category="matmul", time_us=1000.0 * (n - i), calls=72, share=0.5 / (i + 1))
            for i in range(n)]
    rows[0].update(first)
    return rows


def _nsys(timer_ms, kernel_ms, calls=72, stays=True, profiled="train_step", **extra):
    return dict(
        steps_profiled=2, timing_source="kernels", warmup_steps=1, parse_s=0.5, nontrivial_threshold=0.01,
        top_forward=dict(name=GEMM, category="matmul", calls_per_pass=float(calls)), top_stays_on_top=stays,
        forward_range_ms=timer_ms * 1.02, forward_kernel_ms=kernel_ms, matmul_share_forward=0.8,
        matmul_share_train_step=0.7, softmax_to_matmuls_time_ratio=0.15, softmax_to_matmuls_flop_ratio=0.02,
        profiled=profiled,
        tables={"forward": _kernels(3) + [dict(name="softmax_warp_forward<float>", category="softmax", share=0.05,
                                               calls=24, time_us=50.0)],
                "forward+backward": _kernels(10), "optimizer step": [], "train step": _kernels(2)},
        category_share={"forward": {"matmul": 0.8, "softmax": 0.05}, "train step": {"matmul": 0.7, "softmax": 0.03}},
        **extra)


def _row(size, ctx_, timer_ms=None, kernel_ms=None, edition=None, status=Status.MEASURED, when="2026-11-23T06:00:00",
         device=DEV, details=None, **nsys):
    cfg = dict(size=size, context=ctx_, **({"edition": edition} if edition else {}))
    d = dict(details or {})
    if timer_ms is not None:
        d["nsys"] = _nsys(timer_ms, kernel_ms, **nsys)
    return bench(P, cfg, timer_ms / 1e3 if timer_ms and status is Status.MEASURED else None, status=status,
                 details=d, when=when, device=device)


def _rows(device=DEV):
    """2025: small and large at two contexts (small's kernels a fraction of its timer), 2.7B at 1024 OOM;
    2026: the study's cases, medium at 2048 OOM with its closed-form need."""
    rows = [_row("small", 128, 25.0, 5.0, calls=73, stays=False, device=device),
            _row("small", 512, 27.0, 18.0, calls=61, device=device),
            _row("large", 128, 76.0, 31.0, device=device, details=dict(artifact="nsys_small.trace.json.gz")),
            _row("large", 1024, 253.0, 249.0, calls=145, profiled="forward_backward", device=device),
            _row("2.7B", 1024, status=Status.OOM, device=device)]
    cases = [["medium", 512], ["medium", 2048], ["large", 256]]
    w26 = "2026-11-24T15:00:00"
    rows += [_row("large", 256, 135.0, 58.0, "2026", calls=72, when=w26, device=device, details=dict(cases=cases)),
             _row("medium", 2048, None, None, "2026", Status.OOM, w26, device,
                  dict(cases=cases, memory_need={"total": 57.6e9})),
             _row("medium", 512, 59.0, 50.0, "2026", calls=169, when=w26, device=device, details=dict(cases=cases))]
    return rows


def test_c_reads_the_forwards_kernels_only():
    """(c) asks about the forward pass: the answer's kernels come from the forward's table, so an
    optimizer kernel (multi-tensor apply) that tops the training step's table is not among them."""
    nsys = dict(nontrivial_threshold=0.01, tables={
        "forward": [dict(name="gemm", category="matmul", share=0.8, calls=10),
                    dict(name="softmax_warp_forward<float>", category="softmax", share=0.05, calls=4),
                    dict(name="BinaryFunctor<MulFunctor<float>>", category="elementwise", share=0.02, calls=8),
                    dict(name="tiny", category="elementwise", share=0.001, calls=1)],
        "train step": [dict(name="multi_tensor_apply_kernel<AdamW>", category="elementwise", share=0.3, calls=1)]})
    f = page.forward_non_matmul(nsys)
    assert [(k.share, k.category) for k in f.kernels] == [(0.05, "softmax"), (0.02, "elementwise")]
    assert f.total_share == pytest.approx(0.07) and f.kernels[1].op == "MulFunctor"


def test_cases_keep_the_studys_order_top_kernel_calls_and_oom_need(tmp_path):
    got = page.facts(context(_rows(), tmp_path)).cases
    assert [(c.size_label, c.context) for c in got] == [("medium", 512), ("medium", 2048), ("large", 256)]
    assert (got[0].n["top_forward"]["name"], got[0].top_calls, got[0].b.stats.mean) == (GEMM, 169, pytest.approx(0.059))
    assert got[1].n is None and got[1].need_bytes == 57.6e9 and got[2].top_calls == 72


def test_each_edition_answers_from_its_own_profiled_rows(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    assert [(c.size_label, c.context) for c in f.answer] == [("small", 128), ("small", 512), ("large", 128), ("large", 1024)]
    assert f.edition == "2025" and [(c.size_label, c.context) for c in f.answer26] == [("medium", 512), ("large", 256)]
    assert [c.size_label for c in f.cases] == ["medium", "medium", "large"]
    s = f.scores[P]
    assert s.kind is Kind.MEASURED and (s.device, s.date) == (DEV, "2026-11-24")


def test_kernel_busy_share_and_range_agreement():
    cs = [page.Case.of(b) for b in _rows()[:4]]
    assert [c.busy for c in cs] == pytest.approx([5 / 25, 18 / 27, 31 / 76, 249 / 253])
    assert all(c.range_agrees for c in cs)  # the ranges are 2% over the timer
    assert [c.top_calls for c in cs] == [73, 61, 72, 145]
    assert [c.matmul_train for c in cs] == [0.7, 0.7, 0.7, None]  # the forward+backward fallback is no training step
    assert cs[3].n["matmul_share_train_step"] == 0.7 and cs[3].profiled == "forward_backward"


def test_only_2026_rows_answer_alone(tmp_path):
    f = page.facts(context([b for b in _rows() if b.row.config.get("edition") == "2026"], tmp_path))
    assert f.edition == "2026" and not f.answer26 and f.cases == () and len(f.answer) == 2
    assert f.scores[P].date == "2026-11-24"


def test_the_table_names_oom_and_fallback_rows_and_the_middle_configs_kernels(tmp_path):
    t = page.facts(context(_rows(), tmp_path))
    assert [(r.size, r.context, r.outcome) for r in t.rows] == [
        ("small", 128, "measured"), ("small", 512, "measured"), ("large", 128, "measured"),
        ("large", 1024, "measured"), ("2.7B", 1024, "oom")]
    assert t.rows[3].profiled == "forward_backward" and t.rows[4].n is None and t.stat == "median"
    assert (t.profiles("steps_profiled"), t.profiles("warmup_steps"), sum(t.profiles("parse_s")),
            t.detail("artifact")) == ([2] * 4, [1] * 4, 2.0, "nsys_small.trace.json.gz")
    k = t.middle
    assert (k.size, k.context) == ("large", 128)  # the middle of the four profiled configs
    assert [(p, len(rows)) for p, rows in k.phases] == [("forward", 4), ("forward+backward", 8)]
    assert [x.category for x in k.non_matmul.kernels] == ["softmax"]
    assert k.n["category_share"] == {"forward": {"matmul": 0.8, "softmax": 0.05},
                                     "train step": {"matmul": 0.7, "softmax": 0.03}}


def test_an_older_format_rows_timer_is_its_mean(tmp_path):
    b = _rows()[1]
    old = replace(b, run=replace(b.run, legacy=True), stats=Stats(0.030, 0.001, 0.027, 0.0, 5, None))
    f = page.facts(context([old], tmp_path))
    assert f.answer[0].timer_ms == pytest.approx(30.0) and f.stat == "mean"


def test_no_profiled_gpu_rows_is_not_measured(tmp_path):
    assert page.facts(context(_rows("cpu"), tmp_path)).scores[P].kind is Kind.NOT_MEASURED
    oom_only = [_row("2.7B", 1024, status=Status.OOM)]
    f = page.facts(context(oom_only, tmp_path))
    assert f.device is None and f.scores[P].kind is Kind.NOT_MEASURED


def test_committed_c_answer_has_no_optimizer_kernel(tmp_path):
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    for facts in (f.answer, f.answer26):
        names = [k.name for k in facts[len(facts) // 2].non_matmul.kernels]
        assert names and not [n for n in names if "multi_tensor" in n or "optimizer" in n.lower()]


def test_committed_2026_study_has_three_measured_contexts_per_size_and_no_stale_oom(tmp_path):
    """The 2fbd353 run measured medium at 512/1024/2048 and large at 256/512/1024 (medium@2048's earlier OOM was
    the timer keeping two training forwards alive, fixed): every case measured, and the page names no OOM there."""
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    by: dict[str, list[int]] = {}
    for c in f.cases:
        assert c.n, (c.size_label, c.context)
        by.setdefault(c.size_label, []).append(c.context)
    assert by == {"medium": [512, 1024, 2048], "large": [256, 512, 1024]}  # so no OOM is named there


def test_page_words(request, tmp_path):
    assert_snapshot(request, P, render_page(f"{P}.md.j2", f=page.facts(context(_rows(), tmp_path))))


NK = '''"NVTX Range","Style","PID","TID","NVTX Inst","Kern Inst","Total Time (ns)","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Kernel Name"
":forward","PushPop","100","1","2","4","4000000","1.0","1.0","1","1","0.0","sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_cublas"
":forward","PushPop","100","1","2","2","600000","1.0","1.0","1","1","0.0","void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>"
":forward","PushPop","100","1","2","2","10000","1.0","1.0","1","1","0.0","void at::native::FillFunctor<float>"
":computing attention scores","PushPop","100","1","2","2","1000000","1.0","1.0","1","1","0.0","sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_cublas"
":computing softmax","PushPop","100","1","2","2","300000","1.0","1.0","1","1","0.0","void softmax_warp_forward<float>"
":final matmul","PushPop","100","1","2","2","1000000","1.0","1.0","1","1","0.0","sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x32x8_cublas"
":backward","PushPop","100","1","2","2","20000","1.0","1.0","1","1","0.0","void at::native::FillFunctor<float>"
"","","100","2","0","8","6000000","1.0","1.0","1","1","0.0","void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
'''
KS = '''"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"56.0","6000000","8","1.0","1.0","1","1","0.0","void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
"37.0","4000000","4","1.0","1.0","1","1","0.0","sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_cublas"
"7.0","630000","4","1.0","1.0","1","1","0.0","void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>"
'''
NS = '''"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Style","Range"
"50.0","10000000","2","5000000.0","5000000.0","1","1","0.0","PushPop",":forward"
'''


def _filed_nsys(tmp_path):
    from kits.nsys_outputs import file_run

    folder = file_run(tmp_path / "data", "h200-141gb-x2", "20261126T091116Z",
                      [("nsys_profile_2025_small_ctx128", "nsys_profile",
                        dict(edition="2025", size="small", context=128, steps=2), None)])
    for report, text in (("nvtx_kern_sum", NK), ("cuda_gpu_kern_sum", KS), ("nvtx_sum", NS)):
        (folder / "tables" / f"nsys_profile_2025_small_ctx128_{report}.csv").write_text(text)
    (folder / "tables" / "nsys_profile_2025_small_ctx128.result.json").write_text('{"profiled": "train_step"}')


def test_nsys_tables_answer_a_to_e_and_show_the_autograd_threads_kernels_under_no_range(tmp_path):
    _filed_nsys(tmp_path)
    f = page.facts(context(_rows(), tmp_path))
    (r,) = f.nsys.rows
    assert (r.size, r.context, r.forward_range_ms, r.forward_kernel_ms) == ("small", 128, 5.0, 2.305)
    assert r.top_forward.startswith("sm80_xmma") and r.top_forward_calls == 2 and not r.top_stays
    assert r.matmul_forward == pytest.approx(4.0 / 4.61) and r.matmul_step == pytest.approx(10.0 / 10.63)
    assert [n[:30] for n, _, _ in r.non_matmul] == ["void at::native::vectorized_el"]  # Fill is under 1%
    assert r.softmax_time == pytest.approx(0.15) and r.softmax_flops == pytest.approx(5 / (4 * 64))
    assert (r.backward_range_ms, r.unranged_ms) == (0.01, 3.0)
    assert f.beside(r).size_label == "small" and f.nsys_alone == []
    assert any(s.endswith("manifest.json") and "/nsys/" in s for s in f.sources)


def test_page_words_with_nsys(request, tmp_path):
    _filed_nsys(tmp_path)
    assert_snapshot(request, f"{P}_nsys", render_page(f"{P}.md.j2", f=page.facts(context(_rows(), tmp_path))))
