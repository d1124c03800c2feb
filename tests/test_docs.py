"""The user docs stay true to the code and short: the algorithm table, the page lengths, the links."""

from __future__ import annotations

import re
import shlex
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


def test_every_page_the_readme_links_to_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = set(re.findall(r"\]\(([^)#\s:]+\.md)(?:#[^)]*)?\)", readme))
    assert any(target.startswith("docs/") for target in targets), "the README links to no docs/ page"
    missing = sorted(target for target in targets if not (ROOT / target).is_file())
    assert not missing, f"README.md links to pages that do not exist: {missing}"


def test_links_between_docs_pages_resolve():
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s:]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).resolve().is_file(), f"{page.name} links to missing {target}"


def shell_lines(text: str) -> list[str]:
    """The lines of the ```bash and ```sh blocks of a Markdown page, backslash continuations joined."""
    lines, inside, fenced, pending = [], False, False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            inside, pending = fenced and line.strip()[3:] in ("bash", "sh"), ""
            continue
        if inside:
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            lines.append(pending)
            pending = ""
    return lines


def shown_commands() -> list[tuple[str, str]]:
    """(page, command line) for every `colls ...` command in a code block of the user docs."""
    pages = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "CALIBRATION.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    commands = []
    for page in pages:
        for line in shell_lines(page.read_text(encoding="utf-8")):
            words = shlex.split(re.sub(r"\$\{?\w+\}?", "2", line.split(" #")[0]))   # $n, ${i}: 2
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):      # VAR=value before the command
                words.pop(0)
            if words[:1] == ["colls"]:
                commands.append((page.relative_to(ROOT).as_posix(), " ".join(words[1:])))
    return commands


def test_the_docs_show_colls_commands():
    assert len(shown_commands()) >= 20


@pytest.mark.parametrize("page, command", shown_commands())
def test_every_colls_command_the_docs_show_parses(page, command):
    """Each option a page shows exists and takes the value given (parsed only, nothing runs)."""
    from colls.cli import build_parser

    try:
        build_parser().parse_args(shlex.split(command))
    except SystemExit as error:
        pytest.fail(f"{page}: `colls {command}` does not parse (exit {error.code})")


def python_blocks_text() -> str:
    """Every ```python block of the README and the docs pages, as one text (but mpi4py.md's, whose
    `comm` is an mpi4py communicator)."""
    text = ""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name == "mpi4py.md":
            continue
        text += "\n".join(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S))
    return text


def test_every_colls_name_and_comm_method_the_docs_use_exists():
    """`colls.X` and `comm.X` in the docs' Python examples name things the library has."""
    import importlib

    import colls

    text = python_blocks_text()
    missing = []
    for name in sorted(set(re.findall(r"\bcolls\.(\w+)", text))):
        if not hasattr(colls, name) and importlib.util.find_spec(f"colls.{name}") is None:
            missing.append(f"colls.{name}")
    comm = colls.init(transport="local")   # a world of one rank, in this thread
    try:
        missing += [f"comm.{name}" for name in sorted(set(re.findall(r"\bcomm\.(\w+)", text)))
                    if not hasattr(comm, name)]
    finally:
        comm.close()
    assert not missing, f"the docs use names the library lacks: {missing}"
