"""The report's pages (impl.report.pages.*) built from the committed runs under reports/data."""
import re
from pathlib import Path

import pandas as pd
import pytest

from impl.bench.compiled import WHY
from impl.report import build as builder
from impl.report import figures

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------- pages of 1.1, training_step, cpu_smoke
PROFILING_SLUGS = {"benchmarking_script", "nsys_profile", "mixed_precision", "memory_profiling",
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


def test_memory_profiling_answers_read_from_the_timelines(built):
    """The committed H100 run: the 2.7B training-step peak is the optimizer step's, flat over the
    contexts, and the bf16 forward's largest allocations are named autocast copies of FFN weights."""
    pages, _, _ = built
    page = next(p for p in pages if p.slug == "memory_profiling")
    text = " ".join(a.text for a in page.answers)
    assert "flat across contexts" in text and "optimizer step spikes by" in text
    assert "autocast's bf16 copies of the FFN weights" in text and "2560 × 10240 × 2 B" in text
    assert "GiB" in page.score["memory_profiling"].headline


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
    from impl.report.benchmarking import speedup_cell

    def row(median, std):
        return pd.Series(dict(status="measured", legacy=False, median=median, mean=median, stddev=std))
    assert speedup_cell(row(0.30, 0.05), row(0.25, 0.03)) == "within noise"
    assert speedup_cell(row(0.30, 0.01), row(0.10, 0.01)) == "3.00×"
    assert speedup_cell(row(0.30, 0.01), pd.Series(dict(status="oom", stddev=None))) == "–"


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
