"""The report's build (impl.report.build): it finds the page modules of impl.report.pages by
themselves, so adding a page is one Problem member, the page module, its template and their tests;
a page module that fails to import, or whose facts or template raise, fails the build, naming it."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from impl.report import build, templating
from impl.report import pages as pages_package

FAKE_PAGE = '''
from dataclasses import dataclass

PROBLEMS = ()


@dataclass(frozen=True)
class FakeFacts:
    rows: int
    scores = {}
    index_figures = ()


def facts(ctx):
    return FakeFacts(len(ctx.rows.newest))
'''


@pytest.fixture
def extra_pages(monkeypatch, tmp_path):
    """A folder searched for page modules and templates besides impl.report.pages and its templates;
    `add(name, module_text, template_text=None)` puts a page there."""
    import jinja2

    (tmp_path / "pages").mkdir()
    (tmp_path / "templates").mkdir()
    monkeypatch.setattr(pages_package, "__path__", [*pages_package.__path__, str(tmp_path / "pages")])
    env = templating.environment()
    monkeypatch.setattr(env, "loader", jinja2.ChoiceLoader([env.loader, jinja2.FileSystemLoader(tmp_path / "templates")]))
    build.page_modules.cache_clear()
    added = []

    def add(name: str, module_text: str, template_text: str | None = None):
        (tmp_path / "pages" / f"{name}.py").write_text(module_text)
        if template_text is not None:
            (tmp_path / "templates" / f"{name}.md.j2").write_text(template_text)
        added.append(f"{pages_package.__name__}.{name}")
    yield add
    for name in added:
        sys.modules.pop(name, None)
    build.page_modules.cache_clear()


def test_a_new_page_needs_only_its_module_and_template(extra_pages, tmp_path):
    extra_pages("zz_fake_page", FAKE_PAGE, "# A fake page\n\nIt read {{ f.rows }} rows.\n")
    ctx = build.context(tmp_path / "no-data", tmp_path / "reports")
    pages = {p.slug: p for p in build.collect(ctx)}
    assert pages["zz_fake_page"].text == "# A fake page\n\nIt read 0 rows.\n"
    assert list(pages)[-1] == "zz_fake_page"  # answering no problem, it comes last


def test_a_page_module_that_fails_to_import_fails_the_build_naming_it(extra_pages, tmp_path):
    extra_pages("no_such_page", "import impl.report.no_such_module\n")
    with pytest.raises(build.PageModuleError, match="impl.report.pages.no_such_page failed to import"):
        build.collect(build.context(tmp_path / "data", tmp_path))


def test_a_page_whose_facts_raise_fails_the_build_naming_it(extra_pages, tmp_path):
    extra_pages("raising_page", FAKE_PAGE.replace("return FakeFacts(", "return 1 / 0 or FakeFacts("), "# never\n")
    with pytest.raises(build.PageBuildError, match=r"impl.report.pages.raising_page: facts\(ctx\) raised "
                                                   r"ZeroDivisionError: division by zero") as err:
        build.collect(build.context(tmp_path / "data", tmp_path))
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_a_page_whose_template_fails_fails_the_build_naming_it(extra_pages, tmp_path):
    extra_pages("bad_template_page", FAKE_PAGE, "# A page\n\n{{ f.no_such_fact }}\n")
    with pytest.raises(build.PageBuildError, match="impl.report.pages.bad_template_page: templates/bad_template_page"
                                                   ".md.j2 failed to render its facts: UndefinedError"):
        build.collect(build.context(tmp_path / "data", tmp_path))


def test_a_page_without_a_template_fails_the_build_naming_it(extra_pages, tmp_path):
    extra_pages("no_template_page", FAKE_PAGE)
    with pytest.raises(build.PageBuildError, match="impl.report.pages.no_template_page: .*TemplateNotFound"):
        build.collect(build.context(tmp_path / "data", tmp_path))


def test_the_build_command_fails_on_a_failing_page_and_writes_no_page(extra_pages, tmp_path):
    """`python -m impl.report` stops with the page's error before it writes or deletes a page."""
    extra_pages("raising_page", FAKE_PAGE.replace("return FakeFacts(", "return 1 / 0 or FakeFacts("), "# never\n")
    root = tmp_path / "repo"
    (root / "reports" / "data").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    (root / "reports" / "README.md").write_text("the committed index\n")
    with pytest.raises(build.PageBuildError, match="raising_page"):
        build.main(["--root", str(root)])
    assert sorted(p.name for p in (root / "reports").glob("*.md")) == ["README.md"]
    assert (root / "reports" / "README.md").read_text() == "the committed index\n"


def test_a_page_module_without_problems_fails_the_build_naming_it(extra_pages, tmp_path):
    extra_pages("half_page", "def facts(ctx):\n    return None\n")
    with pytest.raises(build.PageModuleError, match="impl.report.pages.half_page has no PROBLEMS"):
        build.page_modules()


def test_a_problem_answered_by_two_pages_fails_the_build(extra_pages):
    extra_pages("second_fsdp", "from impl.workloads.problems import Problem\nPROBLEMS = (Problem.FSDP,)\n"
                               "def facts(ctx):\n    return None\n")
    with pytest.raises(build.PageModuleError, match="second_fsdp: fsdp is answered by impl.report.pages.fsdp too"):
        build.page_modules()


def test_pages_are_ordered_by_their_first_problems_place_in_the_enum_none_last():
    from enum import StrEnum

    class Fake(StrEnum):
        A = "a"
        B = "b"
        C = "c"

    def page(name, *problems):
        return SimpleNamespace(__name__=name, PROBLEMS=problems)

    mods = [page("smoke"), page("z", Fake.C), page("y", Fake.B, Fake.A), page("x", Fake.A)]
    assert [m.__name__ for m in build.page_order(mods, tuple(Fake))] == ["x", "y", "z", "smoke"]


def test_every_page_module_declares_its_problems_in_the_enums_order():
    from impl.workloads.problems import Problem

    order = build.page_problems()
    assert list(order)[-1] == "cpu_smoke" and order["cpu_smoke"] == ()
    firsts = [list(Problem).index(ps[0]) for ps in order.values() if ps]
    assert firsts == sorted(firsts)
