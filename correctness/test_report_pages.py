"""The report's pages (impl.report.pages.*): each page module's pages answer their problems, link
only images and tables that exist, draw legends from their series, and type no numbers by hand."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from impl.report import build as builder
from impl.report import figures

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------- figures of the profiling pages
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the legends drawn, reports dir): the figures of memory_profiling, gradient_checkpointing and
    training_step drawn from the committed data into a scratch reports/ folder; every figure's legend is
    recorded with the labels of the series the axes drew."""
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
    from impl.report import build
    from impl.report.pages import gradient_checkpointing, memory_profiling, training_step
    ctx = build.context(root / "reports" / "data", root / "reports")
    for page in (memory_profiling, gradient_checkpointing, training_step):
        page.facts(ctx)
    mp.undo()
    return legends, root / "reports"


def test_profiling_figures_legends_are_the_series_drawn(built):
    legends, _ = built
    assert legends, "the pages draw figures with legends"
    for name, shown, drawn in legends:
        assert shown == list(dict.fromkeys(drawn)), name


def test_timeline_axis_starts_at_zero(tmp_path, monkeypatch):
    """A forward that moves 0.1 GiB on 13 GiB of weights is drawn from zero, not zoomed into noise."""
    seen = []
    monkeypatch.setattr(figures, "save", lambda fig, path: seen.append([ax.get_ylim() for ax in fig.axes]))
    g = 2**30
    data = dict(x=[0, 1, 2, 3], y=[13 * g, 13.1 * g, 13.05 * g, 13 * g],
                markers=[dict(name="forward", x=0), dict(name="end", x=3)])
    figures.memory_timelines([("a", data), ("b", data)], tmp_path / "t.png", "t")
    assert all(lo == 0 and hi >= 13.1 for lo, hi in seen[0])


# ------------------------------------------------------------- the index
def test_index_has_a_row_per_problem_links_existing_pages_and_stays_small(tmp_path):
    """The index (issue 22's contract): under 25 KB, one scoreboard row per problem of both
    editions, every page it links is built, every image a page links is written, and the build
    leaves no figure that no page links."""
    reports = tmp_path / "reports"
    (reports / "figures").mkdir(parents=True)
    (reports / "figures" / "orphan.png").write_bytes(b"\x89PNG")
    (reports / "data").symlink_to(ROOT / "reports" / "data")
    (tmp_path / "pyproject.toml").write_text("")
    builder.main(["--root", str(tmp_path)])
    index = (reports / "README.md").read_text()
    assert len(index.encode()) < builder.INDEX_LIMIT_BYTES
    rows = [line for line in index.splitlines() if line.startswith("| [") or line.startswith("| ")]
    for p, slug in builder.slugs().items():
        assert any(line.startswith(f"| [{p}]({slug}.md) [") for line in rows), p  # with its parts' links
        assert (reports / f"{slug}.md").exists(), slug
    from impl.report.index import headings
    refs = re.findall(r"^\[[^\]]+\]: ([\w.]+\.md)#(\S+)$", index, re.M)
    assert refs and all(a in {x for _, _, x in headings((reports / md).read_text())} for md, a in refs), refs
    linked = set()
    for md in reports.glob("*.md"):
        for ref in builder.LINK.findall(md.read_text()):
            assert (reports / ref).exists(), (md.name, ref)
            linked.add((reports / ref).resolve())
    assert not (reports / "figures" / "orphan.png").exists()
    assert {p.resolve() for p in reports.glob("figures/*.png")} <= linked
    for md in reports.glob("*.md"):
        assert _ragged_tables(md.read_text()) == [], md.name


def _cells(line: str) -> int:
    """Cells of a markdown table line: its unescaped pipes, less the outer two."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def _ragged_tables(text: str) -> list[str]:
    """Table lines whose cell count differs from their table's delimiter row (GitHub then drops or
    shifts cells: an unescaped | inside a cell, such as |error|, breaks the row)."""
    out, width = [], None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            width = None
            continue
        if width is None and i + 1 < len(lines) and re.fullmatch(r"\|(-+\|)+", lines[i + 1]):
            width = _cells(lines[i + 1])
        if width is not None and _cells(line) != width:
            out.append(line)
    return out


def test_ragged_tables_are_found():
    assert _ragged_tables("| a | |b| |\n|---|---|\n| 1 | 2 |\n") == ["| a | |b| |"]
    assert _ragged_tables("| a | \\|b\\| |\n|---|---|\n| 1 | 2 |\n\ntext | x |") == []


# ------------------------------------------------------------- words live in templates
def prose_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string literal of three or more words in a module, docstrings aside (f-string
    pieces count): a page's words belong in its template (issue 44)."""
    import ast

    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and len(n.value.split()) >= 3]


# Prose still in a page module, by module: only stored data's keys that read as words (flash_attention's probe
# JSON: "ours bwd two_pass"; leaderboard_2026's ratio name in its errors; nsys_profile's NVTX range names).
# Figure and CSV-grid words are templates/figures.toml's. A count may only fall (the test says to lower it).
PROSE_LEFT = {"flash_attention": 4, "leaderboard_2026": 1, "nsys_profile": 1}


@pytest.mark.parametrize("module", sorted(p.stem for p in (ROOT / "src/impl/report/pages").glob("*.py")
                                          if p.stem != "__init__"))
def test_page_modules_hold_no_more_prose_than_before(module):
    found = prose_literals(ROOT / "src/impl/report/pages" / f"{module}.py")
    allowed = PROSE_LEFT.get(module, 0)
    assert len(found) <= allowed, (f"pages/{module}.py has {len(found)} prose literals (at most {allowed}): "
                                   f"words belong in templates/{module}.md.j2: {found}")
    assert len(found) == allowed, f"pages/{module}.py now has {len(found)} prose literals: lower PROSE_LEFT to it"


def test_no_macro_library_called_from_python():
    """Issue 44: the report's Python calls no template's macros: a page renders whole, the figures' words are
    templates/figures.toml's, the gate's and compare's are their log lines; tests of one macro's words use the
    kit's template_macros. An added call fails here."""
    import ast

    calls = {p.relative_to(ROOT).as_posix() for p in (ROOT / "src/impl/report").rglob("*.py")
             for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", None)) == "macros"}
    assert not calls, sorted(calls)
