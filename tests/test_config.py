"""colls.config: the one table of COLLS_* variables, its docs page, and that nothing reads around it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from colls import config
from transports.errors import InvalidArgument

REPO_ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("colls", "transports", "algorithms")
# a whole name: `COLLS_SHM_*` in a sentence names a family, not a variable
NAME = re.compile(r"\bCOLLS_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")
USER_FACING_LIMIT = 12
# read by the test suite itself (tests/), not by colls: named in the docs that describe the tests
TEST_SUITE_VARIABLES = {"COLLS_KILL_RUNS"}


def library_files() -> list[Path]:
    return sorted(path for package in LIBRARY for path in (REPO_ROOT / package).rglob("*.py"))


def test_the_docs_page_is_generated_from_the_table() -> None:
    page = (REPO_ROOT / "docs" / "configuration.md").read_text()
    assert page == config.markdown(), \
        "docs/configuration.md is stale: colls config --markdown > docs/configuration.md"
    for variable in config.VARIABLES:
        assert f"`{variable.name}`" in page


def test_every_declaration_is_complete() -> None:
    names = [variable.name for variable in config.VARIABLES]
    assert len(names) == len(set(names))
    for variable in config.VARIABLES:
        assert NAME.fullmatch(variable.name), variable.name
        assert variable.section in {section for section, _, _ in config.SECTIONS}
        assert variable.kind in ("text", "int", "float", "bool", "path", "choice")
        assert variable.meaning and "\n" not in variable.meaning and "|" not in variable.meaning
        assert variable.kind != "choice" or variable.choices


def test_at_most_twelve_knobs_face_the_user() -> None:
    facing = [variable.name for variable in config.VARIABLES if variable.section != "launcher"]
    assert len(facing) <= USER_FACING_LIMIT, facing


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
           (isinstance(node, ast.Name) and node.id == "environ")


def _colls_constant(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
        return node.value
    return None


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every place that reads a COLLS_ variable from the environment by name:
    os.environ[...], os.environ.get/pop/setdefault(...), os.getenv(...), env_number(...), `in os.environ`."""
    found = []
    for node in ast.walk(tree):
        names: list[str | None] = []
        if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            names = [_colls_constant(node.slice)]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if (called in ("get", "pop", "setdefault") and isinstance(func, ast.Attribute)
                    and _is_environ(func.value)) or called in ("getenv", "env_number"):
                names = [_colls_constant(arg) for arg in node.args[:1]]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_is_environ(side) for side in node.comparators):
            names = [_colls_constant(node.left)]
        found += [(node.lineno, name) for name in names if name]
    return found


def test_nothing_outside_colls_config_reads_a_colls_variable() -> None:
    """The rule: only colls/config.py reads COLLS_* from the environment (through `config.get`).
    Elsewhere a name may be written into a child's environment (the launchers) or named in text."""
    offenders = []
    for path in library_files():
        if path == REPO_ROOT / "colls" / "config.py":
            continue
        for line, name in environment_reads(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(REPO_ROOT)}:{line} reads {name}")
    assert not offenders, "read these through colls.config.get:\n" + "\n".join(offenders)


def test_the_read_finder_finds_reads() -> None:
    source = ('import os\nos.environ["COLLS_A"]\nos.environ.get("COLLS_B", "")\n"COLLS_C" in os.environ\n'
              'os.getenv("COLLS_D")\nenv_number("COLLS_E", 1)\nos.environ["COLLS_F"] = "1"\n'
              'dict(COLLS_G="1")\n{"COLLS_H": "1"}\n')
    found = sorted(name for _, name in environment_reads(ast.parse(source)))
    assert found == ["COLLS_A", "COLLS_B", "COLLS_C", "COLLS_D", "COLLS_E"]   # reads, not writes


def test_every_name_the_library_and_its_docs_mention_is_declared() -> None:
    """A variable named in code, a docstring, a message or the user docs exists in the table (so no
    undeclared knob, and no mention of one that was removed)."""
    texts = [*library_files(), REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    undeclared = sorted({f"{name} ({path.relative_to(REPO_ROOT)})" for path in texts if path.exists()
                         for name in NAME.findall(path.read_text())
                         if name not in config.BY_NAME and name not in TEST_SUITE_VARIABLES})
    assert not undeclared, undeclared


def test_get_reads_the_environment_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLLS_TIMEOUT", raising=False)
    assert config.get("COLLS_TIMEOUT") == 300.0
    monkeypatch.setenv("COLLS_TIMEOUT", " 2.5 ")
    assert config.get("COLLS_TIMEOUT") == 2.5
    monkeypatch.setenv("COLLS_TIMEOUT", "")
    assert config.get("COLLS_TIMEOUT") == 300.0 and not config.is_set("COLLS_TIMEOUT")
    monkeypatch.setenv("COLLS_DEBUG", "yes")
    assert config.get("COLLS_DEBUG") is True
    monkeypatch.setenv("COLLS_TRANSPORT", "SHM")
    assert config.get("COLLS_TRANSPORT") == "shm"
    monkeypatch.delenv("COLLS_HOST", raising=False)
    assert config.get("COLLS_HOST") is None and config.get("COLLS_HOST", "elsewhere") == "elsewhere"


@pytest.mark.parametrize("name,value,what", [
    ("COLLS_TIMEOUT", "nan", "give a finite number"), ("COLLS_TIMEOUT", "0", "> 0"),
    ("COLLS_TIMEOUT", "soon", "give a number"), ("COLLS_DEBUG", "2", "give 1 or 0"),
    ("COLLS_TRANSPORT", "carrier-pigeon", "choose one of local, shm, mpi, cuda_ipc"),
    ("COLLS_RANK", "-1", "at least 0"), ("COLLS_WORLD_SIZE", "1.5", "give an integer"),
])
def test_a_bad_value_names_the_variable_and_what_to_give(monkeypatch: pytest.MonkeyPatch, name: str,
                                                          value: str, what: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgument, match=re.escape(f"{name}={value!r}: ") + ".*" + re.escape(what)):
        config.get(name)


def test_an_undeclared_name_is_an_error_of_colls_own(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KeyError, match="COLLS_NOPE is not declared"):
        config.get("COLLS_NOPE")
    monkeypatch.setenv("COLLS_TIMEOUTS", "3")   # a user's misspelling
    with pytest.raises(InvalidArgument, match="COLLS_TIMEOUTS is not a colls variable"):
        config.check_all()


@pytest.mark.timeout(60)
def test_the_command_prints_the_page_and_checks_the_environment() -> None:
    done = subprocess.run([sys.executable, "-m", "colls.cli", "config", "--markdown"], capture_output=True,
                          text=True, timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0 and done.stdout == config.markdown()
    env = {"PATH": "/usr/bin:/bin", "COLLS_TIMEOUT": "-1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "colls.cli", "config"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO_ROOT)
    assert done.returncode == 1 and "COLLS_TIMEOUT='-1'" in done.stderr
