"""Builds reports/ from reports/data/** only: the index (README.md), one page per problem, the CPU
smoke page, figures and CSVs. `python -m impl.report` runs it on the repository it is run in (or
`--root`, impl.bench.repo), and writes and deletes only under that repository's reports/."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.report.data import frame, load_records, split_newest
from impl.report import test_records
from impl.report.index import device_names, index_facts, render_index
from impl.report.pages import Context, Page, render_page
from impl.report.pages.problems import PAGES, STORED_ALIASES, problem
from impl.report.rows import Rows, of_record
from impl.report.templating import render_page as render_whole

# Page modules in index order: a two-file page's module is named for its slug (facts(ctx) and
# templates/<slug>.md.j2); the others expose pages(ctx) -> list[Page].
PAGE_MODULES = [
    "impl.report.pages.benchmarking_script",
    "impl.report.pages.nsys_profile",
    "impl.report.pages.mixed_precision",
    "impl.report.pages.memory_profiling",
    "impl.report.pages.gradient_checkpointing",
    "impl.report.pages.training_step",
    "impl.report.pages.pytorch_attention",
    "impl.report.pages.torch_compile",
    "impl.report.pages.flash_attention",
    "impl.report.pages.flash_benchmarking",
    "impl.report.pages.leaderboard",
    "impl.report.pages.flash_shapes",
    "impl.report.pages.distributed_communication",
    "impl.report.pages.ddp",
    "impl.report.pages.communication_accounting",
    "impl.report.pages.optimizer_sharding",
    "impl.report.pages.fsdp",
    "impl.report.pages.parallelism_calcs",
    "impl.report.pages.leaderboard_2026",
    "impl.report.pages.cpu_smoke",
]
INDEX_LIMIT_BYTES = 25_000
LINK = re.compile(r"\]\(([^)\s]+\.(?:png|csv))\)")


class PageModuleError(RuntimeError):
    """A page module that cannot be imported or has neither facts nor pages: the build fails naming it
    (a page must never vanish from the report because of a typo)."""


def collect(ctx: Context) -> list[Page]:
    pages = []
    for name in PAGE_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise PageModuleError(f"page module {name} failed to import: {type(exc).__name__}: {exc}") from exc
        if hasattr(module, "facts"):
            pages.append(two_file_page(name.rsplit(".", 1)[-1], module.facts(ctx)))
        elif hasattr(module, "pages"):
            pages.extend(module.pages(ctx))
        else:
            raise PageModuleError(f"page module {name} has neither facts(ctx) nor pages(ctx)")
    return pages


def two_file_page(slug: str, facts) -> Page:
    """The page of `slug` rendered whole by templates/<slug>.md.j2 from its facts."""
    if slug not in PAGES:
        raise PageModuleError(f"page module {slug}: no such page in impl.report.pages.problems.PAGES")
    return Page(slug, "", [problem(p) for p in PAGES[slug]], [], "", score=dict(facts.scores),
                index_figures=list(facts.index_figures), text=render_whole(f"{slug}.md.j2", f=facts), facts=facts)


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
    newest, earlier = split_newest(load_records(data_dir))
    rows = Rows(*(tuple(of_record(r, STORED_ALIASES.get(r.row.problem)) for r in recs) for recs in (newest, earlier)))
    return Context(df=frame(newest), history=frame(earlier), reports_dir=reports_dir, fig_dir=reports_dir / "figures",
                   rows=rows)


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
