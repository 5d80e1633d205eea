"""The report's words live in jinja2 templates (impl/report/templates/<page>.md.j2); a page's code
computes a facts object and renders it through `render(name, **facts)`."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import jinja2

from impl.report import markdown, runs

TEMPLATES = Path(__file__).resolve().parent / "templates"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                             autoescape=False, extensions=["jinja2.ext.do"])
    env.filters.update(ms=markdown.ms, gib=markdown.gib, pct=markdown.pct, num=markdown.num, fmt=format,
                       gb=markdown.gb, mib=markdown.mib, files=runs.files_text,
                       gib1=lambda x: markdown.gib(x, 1), format_code=lambda x: f"`{x}`", mb0=markdown.mb0)
    env.globals.update(table=markdown.table)
    return env


def render(name: str, **facts) -> str:
    """The template `name` (e.g. "index.md.j2") filled from `facts`; surrounding blank lines trimmed."""
    return environment().get_template(name).render(**facts).strip()


def render_page(name: str, **facts) -> str:
    """A whole page from its template: a template line is a sentence, so each paragraph's lines are
    joined; a table, a list or a code block keeps its lines."""
    paragraphs = re.split(r"\n\s*\n", render(name, **facts))
    return "\n\n".join(p for p in (_paragraph(par) for par in paragraphs) if p) + "\n"


def _paragraph(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if text.lstrip().startswith("```"):  # a code block keeps its lines and indentation
        return "\n".join(x for x in text.strip().splitlines() if x.strip())
    return "\n".join(lines) if any(x.startswith(("|", "- ")) for x in lines) else " ".join(lines)
