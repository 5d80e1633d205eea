"""Builds reports/ from reports/data/** only: the index (README.md), one page per problem, the CPU
smoke page, figures and CSVs. `python -m impl.report` runs it on the repository it is run in (or
`--root`, impl.bench.repo), and writes and deletes only under that repository's reports/."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
from functools import cache
from pathlib import Path
from types import ModuleType

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.report import pages as pages_package, test_records
from impl.report.data import load_rows
from impl.report.index import device_names, index_facts, render_index
from impl.report.pages import Context, Page
from impl.report.rows import Bench, Rows, group
from impl.report.templating import render_page
from impl.workloads.problems import Problem

INDEX_LIMIT_BYTES = 25_000
LINK = re.compile(r"\]\(([^)\s]+\.(?:png|csv))\)")


class PageModuleError(RuntimeError):
    """A page module that cannot be imported, lacks `PROBLEMS` or `facts`, or answers a problem another
    page answers: the build fails naming it (a page must never vanish from the report because of a typo)."""


class PageBuildError(RuntimeError):
    """A page whose `facts(ctx)` raised, or whose template failed to render its facts: the build fails
    naming the page module and the error (the original exception is chained as its cause)."""


def page_order(modules: list[ModuleType], problems: tuple = tuple(Problem)) -> list[ModuleType]:
    """The pages in the index's order: by the place of each page's first problem in `problems` (the
    Problem enum's, the handouts' order), pages answering none last, by name."""
    return sorted(modules, key=lambda m: (problems.index(m.PROBLEMS[0]) if m.PROBLEMS else len(problems), m.__name__))


@cache
def page_modules() -> tuple[ModuleType, ...]:
    """Every page module of impl.report.pages but the "_"-named helpers, imported and checked, in page_order."""
    modules = []
    for info in pkgutil.iter_modules(pages_package.__path__):
        if info.name.startswith("_"):
            continue
        name = f"{pages_package.__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise PageModuleError(f"page module {name} failed to import: {type(exc).__name__}: {exc}") from exc
        for attr in ("PROBLEMS", "facts"):
            if not hasattr(module, attr):
                raise PageModuleError(f"page module {name} has no {attr} (a helper module's name starts with '_')")
        modules.append(module)
    answered: dict[Problem, str] = {}
    for module in modules:
        for p in module.PROBLEMS:
            if p in answered:
                raise PageModuleError(f"page module {module.__name__}: {p} is answered by {answered[p]} too")
            answered[p] = module.__name__
    return tuple(page_order(modules))


def slug(module: ModuleType) -> str:
    """A page's file stem under reports/ and its template's under templates/: its module's name."""
    return module.__name__.rsplit(".", 1)[-1]


def page_problems() -> dict[str, tuple[Problem, ...]]:
    """{each page's slug: the problems it answers}, in page order."""
    return {slug(m): tuple(m.PROBLEMS) for m in page_modules()}


def slugs() -> dict[Problem, str]:
    """{each problem: the slug of the page answering it}."""
    return {p: s for s, ps in page_problems().items() for p in ps}


def collect(ctx: Context) -> list[Page]:
    """Every page, built from its module's facts(ctx), in page order."""
    return [built(m, ctx) for m in page_modules()]


def built(module: ModuleType, ctx: Context) -> Page:
    """One page from its module's facts(ctx), rendered by its template."""
    try:
        facts = module.facts(ctx)
    except Exception as exc:
        raise PageBuildError(f"page module {module.__name__}: facts(ctx) raised {type(exc).__name__}: {exc}") from exc
    try:
        return page_of(slug(module), facts)
    except Exception as exc:
        raise PageBuildError(f"page module {module.__name__}: templates/{slug(module)}.md.j2 failed to render its facts: "
                             f"{type(exc).__name__}: {exc}") from exc


def page_of(name: str, facts) -> Page:
    """The page `name` rendered whole by templates/<name>.md.j2 from its facts."""
    return Page(name, page_problems()[name], render_page(f"{name}.md.j2", f=facts), dict(facts.scores),
                tuple(getattr(facts, "index_figures", ())), facts)


def older_format(rows: list[Bench]) -> list[str]:
    """`device: section, ...` for GPU sections whose newest run is still in the older format (its
    kernel rows' figures are do_bench medians, its statistics from before the bench layer)."""
    newest = {(b.run.device, b.run.section): b for b in sorted(rows, key=lambda b: b.run.datetime)}
    old = group(sorted(k for k, b in newest.items() if b.run.legacy and k[0] != "cpu"), lambda k: k[0])
    return [f"{dev}: {', '.join(section for _, section in keys)}" for dev, keys in old.items()]


def index(pages: list[Page], older: list[str] | None = None, names: dict[str, str] | None = None,
          tests: list | None = None) -> str:
    return render_index(index_facts(pages, older or [], names or {}), test_records.render(tests or []))


def context(data_dir: Path, reports_dir: Path) -> Context:
    """Every stored run under data_dir, loaded for pages that write their figures and CSVs under reports_dir."""
    return Context(reports_dir=reports_dir, fig_dir=reports_dir / "figures",
                   rows=Rows.loaded(load_rows(data_dir)))


def build(root: Path) -> dict[str, str]:
    """{file name under root/reports/: text}; figures and CSVs are written as a side effect."""
    data_dir = root / "reports" / "data"
    ctx = context(data_dir, root / "reports")
    pages = collect(ctx)
    files = {f"{page.slug}.md": page.text for page in pages}
    files["README.md"] = index(pages, older_format(list(ctx.rows.newest)), device_names(list(ctx.rows.newest)),
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
