"""The report's pages (impl.report.pages.*): each page module's pages answer their problems, link
only images and tables that exist, draw legends from their series, and type no numbers by hand."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from impl.workloads.compiled import WHY
from impl.report import build as builder
from impl.report import figures
from impl.bench.row import Env, Metric, Row, Status, Timing
from impl.report.data import load, load_history
from impl.report.pages import Context, render_page

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------- pages of 1.1, training_step, cpu_smoke
PROFILING_SLUGS = {"memory_profiling",
                   "gradient_checkpointing", "training_step"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(pages of impl.report.pages.profiling and cpu_smoke, the legends drawn, reports dir): built
    from the committed data into a scratch reports/ folder; every figure's legend is recorded with
    the labels of the series the axes drew."""
    root = tmp_path_factory.mktemp("root")
    (root / "reports").mkdir()
    (root / "reports" / "data").symlink_to(ROOT / "reports" / "data")
    legends, save = [], figures.save

    def recording_save(fig, path):
        for ax in fig.axes:
            if ax.get_legend() is not None:
                drawn = [a.get_label() for a in [*ax.lines, *ax.containers, *ax.patches, *ax.collections]
                         if not a.get_label().startswith("_")]
                legends.append((path.name, [t.get_text() for t in ax.get_legend().get_texts()], drawn))
        save(fig, path)
    mp = pytest.MonkeyPatch()
    mp.setattr(figures, "save", recording_save)
    from impl.report.pages import cpu_smoke, profiling
    from impl.report.data import load, load_history
    from impl.report.pages import Context
    data = root / "reports" / "data"
    ctx = Context(df=load(data), history=load_history(data), reports_dir=root / "reports",
                  fig_dir=root / "reports" / "figures")
    pages = profiling.pages(ctx) + cpu_smoke.pages(ctx)
    mp.undo()
    return pages, legends, root / "reports"


def test_profiling_pages_answer_every_question(built):
    pages, _, _ = built
    assert {p.slug for p in pages} == PROFILING_SLUGS | {"cpu_smoke"}
    for page in pages:
        assert page.answers, page.slug
        for a in page.answers:
            assert a.question.strip() and a.text.strip(), (page.slug, a.question)
        for name in (p.name for p in page.problems):
            assert page.score[name].answer, (page.slug, name)


def test_profiling_pages_images_exist_and_gpu_pages_leave_out_cpu(built):
    pages, _, reports = built
    for page in pages:
        text = builder.render_page(page)
        for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            assert (reports / link).is_file(), (page.slug, link)
        for link in re.findall(r"\]\((data-tables/[^)]+)\)", text):
            assert (reports / link).is_file(), (page.slug, link)
        if page.slug != "cpu_smoke":
            assert "Runs** on `cpu`" not in text and "## cpu" not in text, page.slug
    for caption, path in (f for p in pages for f in p.index_figures):
        assert (reports / path).is_file(), caption


def test_profiling_figures_legends_are_the_series_drawn(built):
    _, legends, _ = built
    assert legends, "the pages draw figures with legends"
    for name, shown, drawn in legends:
        assert shown == list(dict.fromkeys(drawn)), name


def test_memory_profiling_peak_table_labels_each_edition_its_own_rows(built):
    """xl (2025) and xl (2026) share the stored name "xl": each row of the peak table is one edition's."""
    from impl.model.sizes import SizeRef

    pages, _, _ = built
    page = next(p for p in pages if p.slug == "memory_profiling")
    table = page.body.split("### peak memory")[1].split("###")[0]
    sizes = [line.split(" | ")[0].strip("| ") for line in table.splitlines() if line.startswith("| ") and "context" not in line]
    assert SizeRef("2025", "xl").label in sizes and SizeRef("2026", "xl").label in sizes
    assert len(sizes) == len(set(zip(sizes, [line.split(" | ")[1] for line in table.splitlines()
                                              if line.startswith("| ") and "context" not in line])))
    assert "GiB" in page.score["memory_profiling"].headline


def test_memory_profiling_2026_answers_read_2026_rows_only(built):
    """The 2026 answers are about xl (2026) = 2.7B (2025), read from the edition-2026 rows at contexts 128
    and 2048 and set beside the 2025 answers (each labelled); the 2025 answers read the 2.7B rows."""
    from impl.model.sizes import SizeRef

    pages, _, _ = built
    page = next(p for p in pages if p.slug == "memory_profiling")
    texts = [a.text for a in page.answers]
    head26 = f"**{SizeRef('2026', 'xl').label}, batch 4, contexts 128 and 2048 (2026):**"
    assert all(head26 in t for t in texts)
    assert all(f"**{SizeRef('2025', '2.7B').label} (2025 rows):**" in t for t in texts[:5])
    assert "1600" not in " ".join(t.split(head26)[1] for t in texts)  # no number of the 2025 xl's rows


def test_allocation_labels_name_every_tensor_of_that_size_and_only_the_rows_dtypes():
    from impl.model.sizes import SizeRef
    from impl.report.memory_2025_facts import shape_labels as _shape_labels
    # xl (2025), batch 4, context 128: fp32 logits (4·128·10000·4 B) = bf16 FFN weight (1600·6400·2 B)
    xl = SizeRef("2025", "xl").config
    size = 4 * 128 * 10_000 * 4
    assert _shape_labels(xl, 4, 128, "fp32")[size] == "fp32, logits (batch × ctx × vocab)"
    both = _shape_labels(xl, 4, 128, "bf16")[size]
    assert "fp32, logits" in both and "bf16, FFN-weight-sized" in both
    assert not any("bf16" in v for v in _shape_labels(xl, 4, 128, "fp32").values())


def test_timeline_axis_starts_at_zero(tmp_path, monkeypatch):
    """A forward that moves 0.1 GiB on 13 GiB of weights is drawn from zero, not zoomed into noise."""
    seen = []
    monkeypatch.setattr(figures, "save", lambda fig, path: seen.append([ax.get_ylim() for ax in fig.axes]))
    g = 2**30
    data = dict(x=[0, 1, 2, 3], y=[13 * g, 13.1 * g, 13.05 * g, 13 * g],
                markers=[dict(name="forward", x=0), dict(name="end", x=3)])
    figures.memory_timelines([("a", data), ("b", data)], tmp_path / "t.png", "t")
    assert all(lo == 0 and hi >= 13.1 for lo, hi in seen[0])


def test_speedups_within_their_spread_read_within_noise():
    from impl.report.benchmarking import ratio_cell

    def row(median, std):
        return pd.Series(dict(status="measured", legacy=False, median=median, mean=median, stddev=std))
    assert ratio_cell(row(0.25, 0.03), row(0.30, 0.05)) == "within noise"
    assert ratio_cell(row(0.15, 0.01), row(0.30, 0.01)) == "0.50×"  # ours ÷ reference
    assert ratio_cell(pd.Series(dict(status="oom", stddev=None)), row(0.30, 0.01)) == "–"


def test_compile_prose_has_no_typed_numbers(tmp_path):
    """torch_compile (b)'s reason is the code's WHY, never the prose an older run stored with
    hand-typed compile times; WHY itself carries no figures."""
    from impl.bench.row import Env, Row, Status, Timing
    from impl.report.data import frame, load_file
    from impl.report.profiling import compile_section
    import json

    assert not re.search(r"\d", WHY)
    env = Env(device="NVIDIA H100", device_type="cuda", torch="2", triton=None, cuda="12", profile="full")
    typed = "the whole small model took 31 + 65 s on the H100"
    row = Row(problem="torch_compile", config=dict(size="small", context=128, mode="forward", impl="eager",
                                                  study="model"),
              env=env, status=Status.MEASURED, timing=Timing("one forward", "SyncTimer", 1, 5),
              details=dict(compiled_what="regional", compiled_why=typed))
    path = tmp_path / "gpu" / "torch_compile_model" / "run.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(datetime="2026-03-01T00:00", benchmarks=[dict(
        name="t", group="torch_compile", extra_info=row.to_json(),
        stats=dict(mean=0.01, stddev=0.0, median=0.01, min=0.01, max=0.01, rounds=5))])))
    text = compile_section(frame(load_file(path)))
    assert typed not in text and WHY in text
# ------------------------------------------------------------------------------- attention pages
from impl.report.pages import attention as attention_pages  # noqa: E402

ENV = Env(device="GPU", device_type="cuda", torch="2", triton="3", cuda="12", profile="full")
ATTENTION_PROBLEMS = {"pytorch_attention", "torch_compile"}


def _store(data: Path, section: str, stamp: str, measured: list[tuple[Row, float, float]], not_run=(),
           device: str = "gpu-x1") -> None:
    """One stored run in impl.bench.store's layout: rows with (median ms, iqr ms)."""
    def name(row):
        return f"test_{row.problem}[{'-'.join(map(str, row.config.values()))}]"

    def entry(row, med, iqr):
        s, q = med / 1e3, iqr / 1e3
        return dict(name=name(row), group=row.problem,
                    extra_info=row.to_json(), stats=dict(mean=s, stddev=q, median=s, min=s, max=s, iqr=q, rounds=10,
                                                         data=[s] * 10))
    doc = dict(datetime=f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:00",
               commit_info=dict(id=stamp[-8:] + "0" * 32, dirty=False),
               benchmarks=[entry(*m) for m in measured],
               not_run=[dict(name=name(r), fullname="x", group=r.problem, row=r.to_json()) for r in not_run])
    folder = data / device / section
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stamp}.json").write_text(json.dumps(doc))


def _ctx(tmp_path: Path, data: Path) -> Context:
    return Context(df=load(data), history=load_history(data), reports_dir=tmp_path, fig_dir=tmp_path / "figures")


def _referenced(text: str) -> list[str]:
    return re.findall(r"\]\(((?:figures|data-tables)/[^)]+)\)", text)


@pytest.fixture(scope="module")
def stored_pages(tmp_path_factory):
    """The attention pages built from the stored runs (reports/data), written under a temporary reports/."""
    out = tmp_path_factory.mktemp("reports")
    ctx = builder.context(ROOT / "reports" / "data", out)
    return out, attention_pages.pages(ctx)


def test_attention_pages_answer_and_reference_only_files_that_exist(stored_pages):
    out, pages = stored_pages
    assert {name for p in pages for name in p.score} == ATTENTION_PROBLEMS
    for page in pages:
        assert page.answers and all(a.question and a.text for a in page.answers), page.slug
        text = render_page(page)
        for ref in _referenced(text):
            assert (out / ref).exists(), (page.slug, ref)
        for _, fig in page.index_figures:
            assert (out / fig).exists()


def test_attention_pages_show_no_typed_compile_times(stored_pages):
    """The older H100 run's `compiled_why` typed compile times into prose; the page shows the compilation table."""
    _, pages = stored_pages
    text = "".join(render_page(p) for p in pages)
    assert "12.7 + 19.4" not in text and "on the H100 the whole small model took" not in text


@pytest.mark.parametrize("module", [attention_pages], ids=["attention"])
def test_attention_page_prose_types_no_numbers(module):
    """No string literal of the page modules (docstrings aside) holds a number: prose numbers are
    formatted from the data. Comparisons with 1 ("> 1: compiled faster") are allowed."""
    tree = ast.parse(Path(module.__file__).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and isinstance(n.body[0], ast.Expr)}
    prose = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and len(n.value) > 12 and id(n) not in docs]
    number = r"(?<![\w.])\d+(\.\d+)?(?!\w)"
    allowed = ("FlashAttention-2", "< 1", "> 1")
    typed = [s for s in prose if re.search(number, re.sub("|".join(map(re.escape, allowed)), "", s))]
    assert typed == []


# ---------------------------------------------------------------------------------------------------
# distributed and parallelism pages (impl.report.pages.distributed, .parallelism)

DIST_SLUGS: set[str] = set()  # every distributed page is a two-file page with its own test file
PAR_SLUGS = {"parallelism_calcs", "leaderboard_2026"}


@pytest.fixture(scope="module")
def dist_ctx(tmp_path_factory):
    fig = tmp_path_factory.mktemp("reports") / "figures"
    data = ROOT / "reports" / "data"
    return Context(df=load(data), history=load_history(data), reports_dir=ROOT / "reports", fig_dir=fig)


@pytest.fixture(scope="module")
def dist_pages(dist_ctx):
    from impl.report.pages import parallelism

    return parallelism.pages(dist_ctx)


def test_distributed_pages_one_per_slug_each_problem_answered(dist_pages):
    from impl.report.pages.problems import PROBLEMS

    assert {p.slug for p in dist_pages} == DIST_SLUGS | PAR_SLUGS
    mine = {p.name for p in PROBLEMS if p.slug in DIST_SLUGS | PAR_SLUGS}
    scored = {name for p in dist_pages for name in p.score}
    assert scored == mine
    for page in dist_pages:
        assert page.answers and all(a.text.strip() for a in page.answers), page.slug


def test_distributed_pages_reference_only_existing_images(dist_pages, dist_ctx):
    for page in dist_pages:
        text = render_page(page)
        for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            assert (dist_ctx.fig_dir.parent / link).exists(), (page.slug, link)
            assert Path(link).name.startswith(page.slug + "-"), (page.slug, link)
        for _, link in page.index_figures:
            assert (dist_ctx.fig_dir.parent / link).exists()


def test_gpu_pages_show_no_cpu_smoke_rows(dist_pages):
    for page in dist_pages:
        assert "(cpu)" not in render_page(page) and "tiny," not in page.body, page.slug




def test_parallelism_page_prints_each_function_beside_its_symbolic_form(dist_pages):
    from impl import parallelism_calcs as pc

    page = render_page(next(p for p in dist_pages if p.slug == "parallelism_calcs"))
    for f in (pc.dp_max_devices, pc.fsdp_max_devices, pc.tp_max_devices_forward, pc.fsdp_tp_max_devices,
              pc.fsdp_tp_max_devices_serial, pc.alternate_ring_all_reduce_time):
        assert f.symbolic in page
    for f in (pc.dp_max_devices, pc.tp_max_devices_forward, pc.fsdp_tp_max_devices):
        assert f"`{f.symbolic}` | `{f.name}`" in page
    assert "TPU v5p" in page and "borrowed" in page


def test_bounds_table_evaluates_parallelism_bounds(dist_ctx):
    from impl import parallelism_calcs as pc
    from impl.report.pages import parallelism

    devices, _ = parallelism.device_figures(dist_ctx)
    wl = parallelism.workload()
    text = parallelism.bounds_table(devices, wl)
    tpu = pc.parallelism_bounds(pc.TPU_V5P_FIGURES, wl.B, wl.D_FF)
    assert f"| {tpu.dp.value:,.1f} | {tpu.fsdp.value:,.1f} | {tpu.tp_forward.value:,.1f} /" in text


# ------------------------------------------------------------- the index
def test_index_has_a_row_per_problem_links_existing_pages_and_stays_small(tmp_path):
    """The index (issue 22's contract): under 25 KB, one scoreboard row per problem of both
    editions, every page it links is built, every image a page links is written, and the build
    leaves no figure that no page links."""
    from impl.report.pages.problems import PROBLEMS

    reports = tmp_path / "reports"
    (reports / "figures").mkdir(parents=True)
    (reports / "figures" / "orphan.png").write_bytes(b"\x89PNG")
    (reports / "data").symlink_to(ROOT / "reports" / "data")
    (tmp_path / "pyproject.toml").write_text("")
    builder.main(["--root", str(tmp_path)])
    index = (reports / "README.md").read_text()
    assert len(index.encode()) < builder.INDEX_LIMIT_BYTES
    rows = [line for line in index.splitlines() if line.startswith("| [") or line.startswith("| ")]
    for p in PROBLEMS:
        assert any(line.startswith(f"| [{p.name}]({p.slug}.md)") for line in rows), p.name
        assert (reports / f"{p.slug}.md").exists(), p.slug
    linked = set()
    for md in reports.glob("*.md"):
        for ref in builder.LINK.findall(md.read_text()):
            assert (reports / ref).exists(), (md.name, ref)
            linked.add((reports / ref).resolve())
    assert not (reports / "figures" / "orphan.png").exists()
    assert {p.resolve() for p in reports.glob("figures/*.png")} <= linked


# ------------------------------------------------------------- leaderboard (2026)
def _lb26_rows(layers_ms_gib: list[tuple[int, float, float]], policy: str = "every_k") -> list[tuple[Row, float, float]]:
    out = []
    for layers, med_ms, gib in layers_ms_gib:
        row = Row(problem="leaderboard_2026", config=dict(config="8B", layers=layers, batch=1, context=32768,
                                                           checkpointing=policy, k=1 if policy == "every_k" else None),
                  env=ENV, status=Status.MEASURED, timing=Timing("one training step", "SyncTimer", 2, 5),
                  metrics={Metric.TOKENS_PER_S: 32768 / med_ms * 1e3, Metric.MFU: 0.4})
        row.memory.peak_allocated = int(gib * 2**30)
        out.append((row, med_ms, 1.0))
    return out


def _allreduce_run(data: Path, busbw_gbps: float) -> None:
    rows = [(Row(problem="distributed_communication_single_node",
                 config=dict(backend=backend, world_size=n, bytes=2**30), env=ENV, status=Status.MEASURED,
                 timing=Timing("one all-reduce", "SyncTimer", 2, 10), metrics={Metric.BUS_BW: bw}), 5.0, 0.1)
            for backend, n, bw in (("nccl", 2, busbw_gbps), ("nccl", 4, 10 * busbw_gbps), ("gloo", 2, 1.0))]
    _store(data, "distributed_communication", "20260301T000000Z_cccccccc", rows, device="gpu-x2")


def test_leaderboard_2026_page_predicts_two_gpus_from_one_gpu_rows(tmp_path):
    """Synthetic one-GPU rows at 1, 2, 4 layers on a line (0.3 s + 0.2 s/layer; 20 GiB + 3 GiB/layer) and
    a 2-GPU all-reduce: the answer stays "not run on two GPUs" and prints the prediction of
    impl.leaderboard_prediction at 34 layers with the 2-process bus bandwidth, not the 4-process one."""
    from impl.model import MODEL_CONFIGS
    from impl.leaderboard_prediction import LayerRun, predict_step
    from impl.report.pages import parallelism

    data = tmp_path / "data"
    line = [(n, 300 + 200 * n, 20 + 3 * n) for n in (1, 2, 4)]
    plain_oom = Row(problem="leaderboard_2026", config=dict(config="8B", layers=8, batch=1, context=32768,
                                                            checkpointing="none", k=None),
                    env=ENV, status=Status.OOM, reason="CUDA out of memory")
    _store(data, "leaderboard_2026", "20260302T000000Z_aaaaaaaa", _lb26_rows(line) + _lb26_rows([(1, 250, 26)], "none"),
           [plain_oom])
    _allreduce_run(data, 300.0)
    page = parallelism.leaderboard_2026_page(_ctx(tmp_path, data))
    text = page.answers[0].text
    pred = predict_step([LayerRun(n, t / 1e3, g * 2**30) for n, t, g in line], MODEL_CONFIGS["8B"], 300e9)
    assert text.startswith("Not run on two GPUs") and "checkpointing every_k (k 1), 3 runs" in text
    assert f"**{pred.total_s:.2f} s** per step" in text and f"{pred.compute_s:.2f} s of one rank's compute" in text
    assert abs(pred.compute_s - (0.3 + 0.2 * 34)) < 1e-9 and "at 300 GB/s" in text and "on 2 GPUs" in text
    assert f"**{pred.per_rank_peak_bytes / 2**30:,.1f} GiB**" in text
    assert page.score["leaderboard_2026"].headline == f"{pred.total_s:.2f} s (predicted)"
    assert "| 8 | none | oom |" in page.body and "CUDA out of memory" in page.body
    assert "| 4 | every_k (k 1) | 1100 ± 1 |" in page.body


def test_leaderboard_2026_page_without_rows_says_what_is_missing(tmp_path):
    from impl.report.pages import parallelism

    data = tmp_path / "data"
    _allreduce_run(data, 300.0)
    page = parallelism.leaderboard_2026_page(_ctx(tmp_path, data))
    assert "Not run on two GPUs" in page.answers[0].text and "no prediction" in page.answers[0].text
    assert page.score["leaderboard_2026"].headline == "–"
    _store(data, "leaderboard_2026", "20260302T000000Z_aaaaaaaa", _lb26_rows([(2, 700, 26)]))
    page = parallelism.leaderboard_2026_page(_ctx(tmp_path, data))
    assert "fewer than two layer counts" in page.answers[0].text and "| 2 | every_k (k 1) |" in page.body




def _lb26_two_gpu_rows(policies: list[tuple[str, int, float, float]], breakdown: bool = True):
    """Two-GPU rows: (policy, k, harness median ms, do_bench ms), first call 60 s for the first, 7 s after."""
    from impl.bench.row import Peaks

    out = []
    for i, (policy, k, med_ms, db_ms) in enumerate(policies):
        row = Row(problem="leaderboard_2026",
                  config=dict(config="8B", layers=34, batch=2, context=32768, checkpointing=policy, k=k, world_size=2,
                              backend="nccl"),
                  env=ENV, status=Status.MEASURED, timing=Timing("one training step", "SlowestRankClock", 1, 5),
                  metrics={Metric.DO_BENCH_MS: db_ms, Metric.FIRST_CALL_S: 60.0 if i == 0 else 7.0,
                           Metric.FLOPS: 3.2e15, Metric.TOKENS_PER_S: 65536 / med_ms * 1e3},
                  peaks=Peaks(measured_flops=800e12, measured_dtype="bfloat16", measured_n=8192, datasheet_flops=989.4e12),
                  details=dict(ranks=[dict(peak=100 * 2**30), dict(peak=101 * 2**30)],
                               do_bench=dict(warmup_ms=25.0, rep_ms=100.0, return_mode="median", ranks="slowest")))
        if breakdown:
            row.details["breakdown"] = dict(
                timing_source="cuda", step_ms=med_ms, kernel_ms=med_ms - 300.0, gap_ms=300.0,
                phase_ms={"forward": 1500.0, "backward": med_ms - 2100.0, "optimizer step": 300.0},
                category_ms={"matmul": med_ms / 2, "attention": med_ms / 4, "communication": 100.0, "other": 0.0},
                top=[dict(name="nvjet_gemm", category="matmul", ms=900.0, calls=400.0)])
        row.memory.peak_allocated = 101 * 2**30
        out.append((row, med_ms, 10.0))
    return out


def test_leaderboard_2026_page_answers_with_the_measured_two_gpu_step_beside_the_prediction(tmp_path):
    """Two-GPU rows of one run: the fastest by do_bench answers, with its MFU by the datasheet and the
    run's measured peak, the first calls against the handout's 10 minutes, the class's best scaled by
    the B200's datasheet peak (named constants, not typed), where the time goes, and the one-GPU
    prediction of the same policy beside it."""
    from impl.bench.peaks import datasheet_bf16_flops
    from impl.report.pages import parallelism
    from impl.workloads.leaderboard_2026 import CLASS_BEST_GPU, CLASS_BEST_STEP_S

    data = tmp_path / "data"
    _store(data, "leaderboard_2026", "20260302T000000Z_aaaaaaaa",
           _lb26_rows([(n, 300 + 200 * n, 20 + 3 * n) for n in (1, 2, 4)]))
    _store(data, "leaderboard_2026", "20260303T000000Z_bbbbbbbb",
           _lb26_two_gpu_rows([("every_k", 1, 7500.0, 7450.0), ("keep_attention", 0, 6900.0, 6880.0)]),
           device="gpu-x2")
    _allreduce_run(data, 300.0)
    page = parallelism.leaderboard_2026_page(_ctx(tmp_path, data))
    text, where = (a.text for a in page.answers)
    assert "**keep_attention (k 0): 6.88 s per step** (do_bench" in text
    ours_mfu = 3.2e15 / 6.88 / 989.4e12
    assert f"{ours_mfu:.1%} MFU against the datasheet" in text and f"{3.2e15 / 6.88 / 800e12:.1%} against the run's" in text
    assert "every_k (k 1) 60.0 s (the run's first" in text and "within the 10 minutes" in text
    scale = datasheet_bf16_flops(CLASS_BEST_GPU) / 989.4e12
    assert CLASS_BEST_GPU == "B200" and f"{6.88 / CLASS_BEST_STEP_S:.2f}× its time" in text
    assert f"{scale:.2f}× an {ENV.device}'s" in text and f"{3.2e15 / CLASS_BEST_STEP_S / (scale * 989.4e12):.1%} MFU" in text
    from impl.leaderboard_prediction import LayerRun, predict_step
    from impl.model import MODEL_CONFIGS
    pred = predict_step([LayerRun(n, (300 + 200 * n) / 1e3, (20 + 3 * n) * 2**30) for n in (1, 2, 4)],
                        MODEL_CONFIGS["8B"], 300e9)
    assert f"the measured every_k (k 1) step is 7.45 s, {7.45 / pred.total_s:.2f}× the prediction" in text
    assert "gap" in where and "keep_attention (k 0)" in where and "communication 0.10 s" in where
    assert "| keep_attention (k 0) | 2026-03-03 00:00 | 6.880 |" in page.body and "`nvjet_gemm`" in page.body
    assert "`reports/data/gpu-x2/leaderboard_2026/20260303T000000Z_bbbbbbbb.json`" in text
    score = page.score["leaderboard_2026"]
    assert score.headline.startswith("6.88 s/step") and score.device == "gpu-x2 + gpu-x1"  # measured + predicted from
