"""Builds reports/ from reports/data/** only: the index (README.md), one page per problem, the CPU
smoke page, figures and CSVs. `python -m impl.report` runs it on the repository it is run in (or
`--root`, impl.bench.repo), and writes and deletes only under that repository's reports/."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.report.data import load_frames
from impl.report import test_records
from impl.report.index import device_names, index_facts, render_index
from impl.report.pages import Context, Page, render_page

# Page modules in index order (each: pages(ctx) -> list[Page]).
PAGE_MODULES = [
    "impl.report.pages.profiling",
    "impl.report.pages.attention",
    "impl.report.pages.flash",
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


def index(pages: list[Page], older: list[str] | None = None, names: dict[str, str] | None = None,
          tests: list | None = None) -> str:
    return render_index(index_facts(pages, older or [], names or {}), test_records.render(tests or []))


def context(data_dir: Path, reports_dir: Path) -> Context:
    """Every stored run under data_dir, loaded for pages that write their figures and CSVs under reports_dir."""
    df, history = load_frames(data_dir)
    return Context(df=df, history=history, reports_dir=reports_dir, fig_dir=reports_dir / "figures")


def build(root: Path) -> dict[str, str]:
    """{file name under root/reports/: text}; figures and CSVs are written as a side effect."""
    data_dir = root / "reports" / "data"
    ctx = context(data_dir, root / "reports")
    pages = collect(ctx)
    files = {f"{page.slug}.md": render_page(page) for page in pages}
    files["README.md"] = index(pages, older_format(ctx.df), device_names(ctx.df),
                               test_records.device_tests(data_dir, root))
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_repo_arguments(ap, data_dir=False)  # the pages link reports/data: it is always ROOT's
    repo = repo_from_args(ap, ap.parse_args(argv))
    reports = repo.reports
    files = build(repo.root)
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
