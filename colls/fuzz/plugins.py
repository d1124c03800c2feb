"""`colls fuzz --plugin PATH[:ARGUMENT]`: code of the user's loaded into the fuzzer before it runs.

A plugin is a Python file (or an importable module name) that changes the library in this process
before any communicator exists, e.g. the test suite's planted faults (`tests/planted_faults.py`),
which show that the fuzzer catches real bugs. Where an argument follows the colon, the module's
`setup(argument)` is called. The ranks inherit what the plugin did: threads (local) share the
process, forked ranks (shm) start from it, and mpiexec's ranks are given the same `--plugin`.
The replay command and the printed snippet load the same plugins, so a failure reproduces.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(spec: str) -> ModuleType:
    """Import the plugin `spec` (a .py path or a module name, optionally `:argument`) and set it up.

    Args:
        spec: `path/to/file.py`, `package.module`, either with `:argument` after it.

    Returns:
        The imported module.

    Raises:
        ValueError: the file or module cannot be found, or takes an argument but has no `setup`.
    """
    target, _, argument = spec.partition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"--plugin {spec}: no file {path}")
        name = f"colls_plugin_{path.stem}"
        module = sys.modules.get(name)
        if module is None:
            found = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(found)
            sys.modules[name] = module
            found.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise ValueError(f"--plugin {spec}: {error}") from None
    if argument:
        setup = getattr(module, "setup", None)
        if setup is None:
            raise ValueError(f"--plugin {spec}: {target} has no setup(argument) to take {argument!r}")
        setup(argument)
    return module


def snippet_lines(specs: list[str]) -> list[str]:
    """The lines a printed snippet starts with to load the same plugins."""
    if not specs:
        return []
    return ["from colls.fuzz.plugins import load", *(f"load({spec!r})" for spec in specs)]
