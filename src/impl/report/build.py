"""Builds reports/ from reports/data/** only: the index (README.md), one page per problem, the CPU
smoke page, figures and CSVs. `python -m impl.report` runs it."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

from impl.report.data import load, load_history
from impl.report.markdown import table
from impl.report.pages import Context, Page, Score, render_page
from impl.report.pages.problems import PROBLEMS
from impl.report import test_records

ROOT = Path(__file__).resolve().parents[3]
# Page modules in index order (each: pages(ctx) -> list[Page]).
PAGE_MODULES = [
    "impl.report.pages.profiling",
    "impl.report.pages.attention",
    "impl.report.pages.distributed",
    "impl.report.pages.parallelism",
    "impl.report.pages.cpu_smoke",
]
INDEX_LIMIT_BYTES = 25_000
LINK = re.compile(r"\]\(([^)\s]+\.(?:png|csv))\)")


def collect(ctx: Context) -> list[Page]:
    pages = []
    for name in PAGE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue  # a page module not written yet: its problems show as not answered
        pages.extend(module.pages(ctx))
    return pages


def older_format(df) -> list[str]:
    """`device: section, ...` for GPU sections whose newest run is still in the older format (its
    kernel rows' figures are do_bench medians, its statistics from before the bench layer)."""
    if df.empty:
        return []
    newest = df.sort_values("datetime").groupby(["device", "section"]).tail(1)
    old = newest[newest.legacy & (newest.device != "cpu")]
    return [f"{dev}: {', '.join(sorted(g.section))}" for dev, g in old.groupby("device")]


def index(pages: list[Page], older: list[str] | None = None, tests: list | None = None) -> str:
    scores: dict[str, tuple[Page, Score]] = {}
    for page in pages:
        for name, score in page.score.items():
            scores[name] = (page, score)
    rows = []
    for p in PROBLEMS:
        page, score = scores.get(p.name, (None, None))
        link = f"[{p.name}]({page.slug}.md)" if page else p.name
        if score is None:
            rows.append([link, p.edition, "not answered yet", "–", "–", "–", "–"])
        else:
            rows.append([link, p.edition, score.answer, score.headline, score.vs_anchor, score.device, score.date])
    out = ["# LLM systems performance suite: the report",
           "Built by `make report` from the saved pytest-benchmark runs under `reports/data/<device>/<section>/`; "
           "every number is read from those files. One row per problem of the course's 2025 and 2026 editions "
           "(and the suite's own extras); the link opens the problem's page, which answers its questions first.",
           "## Scoreboard",
           table(["problem", "edition", "answer", "headline", "ours vs best anchor (same run)", "device",
                  "run date"], rows)]
    if older:
        out.append("Sections whose newest GPU run is still in the older format (before the bench layer: kernel "
                   "rows read do_bench medians, statistics as then recorded): " + "; ".join(older) + ".")
    out.append(test_records.render(tests or []))
    figures = [f for page in pages for f in page.index_figures]
    if figures:
        out.append("## The story in figures")
        out += [f"**{caption}**\n\n![{caption}]({path})" for caption, path in figures]
    return "\n\n".join(out) + "\n"


def build(root: Path | None = None) -> dict[str, str]:
    """{file name under reports/: text}; figures and CSVs are written as a side effect."""
    root = root or ROOT
    data_dir = root / "reports" / "data"
    ctx = Context(df=load(data_dir), history=load_history(data_dir), reports_dir=root / "reports",
                  fig_dir=root / "reports" / "figures")
    pages = collect(ctx)
    files = {f"{page.slug}.md": render_page(page) for page in pages}
    files["README.md"] = index(pages, older_format(ctx.df), test_records.device_tests(data_dir, root))
    return files


def main() -> int:
    reports = ROOT / "reports"
    files = build()
    for name, text in files.items():
        (reports / name).write_text(text)
    stale = [p for p in reports.glob("*.md") if p.name not in files]
    linked = {(reports / m).resolve() for text in files.values() for m in LINK.findall(text)}
    stale += [p for p in (*reports.glob("figures/*.png"), *reports.glob("data-tables/*.csv"))
              if p.resolve() not in linked]
    for p in stale:  # a page, figure or table nothing links any more
        p.unlink()
    print(f"wrote {len(files)} pages under {reports} (index {len(files['README.md'].encode())} bytes)")
    return 0
