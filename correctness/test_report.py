"""The report's build: a page module that fails to import fails it."""
import pytest


def test_a_page_module_that_fails_to_import_fails_the_build_naming_it(monkeypatch, tmp_path):
    from impl.report import build

    monkeypatch.setattr(build, "PAGE_MODULES", [*build.PAGE_MODULES, "impl.report.pages.no_such_page"])
    with pytest.raises(build.PageModuleError, match="impl.report.pages.no_such_page failed to import"):
        build.collect(build.context(tmp_path / "data", tmp_path))
