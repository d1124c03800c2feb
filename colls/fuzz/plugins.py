"""`colls fuzz --plugin PATH[:ARGUMENT]`: code of the user's loaded into the fuzzer before it runs
(`colls.plugins.load`), e.g. a module of `colls.algorithm` schedules to fuzz with `--algorithms`.

A plugin is a Python file (or an importable module name) that changes the library in this process
before any communicator exists, e.g. the test suite's planted faults (`tests/planted_faults.py`),
which show that the fuzzer catches real bugs. Where an argument follows the colon, the module's
`setup(argument)` is called. The ranks inherit what the plugin did: threads (local) share the
process, forked ranks (shm) start from it, and mpiexec's ranks are given the same `--plugin`.
The replay command and the printed snippet load the same plugins, so a failure reproduces.
"""

from __future__ import annotations

from ..plugins import load

__all__ = ["load", "snippet_lines"]


def snippet_lines(specs: list[str]) -> list[str]:
    """The lines a printed snippet starts with to load the same plugins."""
    if not specs:
        return []
    return ["from colls.fuzz.plugins import load", *(f"load({spec!r})" for spec in specs)]
