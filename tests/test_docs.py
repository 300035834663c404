"""The front door: README.md shows the mini suite's compact table as the suite wrote it (results/mini/headline.md)
and docs/results.md its full tables (summary.md, compare.md), so no number is retyped; README stays short;
and the relative links of the pages that show them resolve, to files and to headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
RESULTS_DOC = REPO / "docs" / "results.md"
MINI = REPO / "results" / "mini"


def block(text: str, marker: str) -> str:
    """What stands between ``<!-- marker -->`` and ``<!-- /marker -->`` (exactly one such block)."""
    assert text.count(f"<!-- {marker} -->") == 1 and text.count(f"<!-- /{marker} -->") == 1, marker
    return text.split(f"<!-- {marker} -->\n", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def test_readme_shows_the_headline_table_and_docs_the_full_ones_as_the_suite_wrote_them():
    readme, doc = README.read_text(encoding="utf-8"), RESULTS_DOC.read_text(encoding="utf-8")
    assert block(readme, "suite-headline") == (MINI / "headline.md").read_text(encoding="utf-8")
    assert block(doc, "suite-table") == (MINI / "summary.md").read_text(encoding="utf-8")
    assert block(doc, "suite-compare") == (MINI / "compare.md").read_text(encoding="utf-8")
    assert "<!-- suite-table -->" not in readme and "<!-- suite-compare -->" not in readme  # moved to docs
    assert len(readme.splitlines()) <= 250


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", [README, RESULTS_DOC, REPO / "docs" / "search.md"], ids=lambda p: p.name)
def test_relative_links_resolve_to_files_and_headings(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    links = [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link}: no such file"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name}: {link}: no such heading in {target.name}"
