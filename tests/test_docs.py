"""The user docs stay true to the code and short: the algorithm table, the page lengths, the links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from colls.docs import algorithm_table, generated_block

ROOT = Path(__file__).resolve().parent.parent

# The longest each page may grow (issue 39): past this, history belongs in git, not in the page.
LINE_LIMITS = {"README.md": 200, "bench/RESULTS.md": 300, "bench/CALIBRATION.md": 150}


def test_the_algorithm_page_holds_the_table_rendered_from_the_catalogue():
    page = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    assert generated_block(page) == algorithm_table(), (
        "docs/algorithms.md is out of date with the catalogue: run `python -m colls.docs docs/algorithms.md`")


def test_the_algorithm_table_has_a_row_for_every_catalogued_algorithm():
    from algorithms.registry import CATALOGUE

    rows = algorithm_table().splitlines()[2:]
    assert len(rows) == sum(len(by_name) for by_name in CATALOGUE.values())
    assert "| all_to_all_v | `bruck` |" in algorithm_table()


@pytest.mark.parametrize("path, limit", sorted(LINE_LIMITS.items()))
def test_page_is_no_longer_than_its_limit(path, limit):
    lines = (ROOT / path).read_text(encoding="utf-8").count("\n")
    assert lines <= limit, f"{path} has {lines} lines, more than {limit}"


def test_every_docs_page_the_readme_links_to_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = set(re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", readme))
    assert targets, "the README links to no docs/ page"
    missing = sorted(target for target in targets if not (ROOT / target).is_file())
    assert not missing, f"README.md links to pages that do not exist: {missing}"


def test_links_between_docs_pages_resolve():
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s:]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).resolve().is_file(), f"{page.name} links to missing {target}"
