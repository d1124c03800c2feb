"""The catalogue: every algorithm of every collective, by name, with what it needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One schedule of one collective: its function and the facts selection needs."""

    collective: str
    name: str
    run: Callable
    summary: str
    commutative_only: bool = False   # cannot keep rank order, so refuses non-commutative ops
    reads_input_only: bool = False   # reduce_scatter: never writes its input (no scratch copy needed)
    takes_source: bool = False       # all_reduce: reads the input itself, so it is not copied first
    # (rank, size, count, op) -> a `blocks.Schedule` over the call's flat `send` and `out` (count:
    # the elements of send; op None for a collective without one), or None where this rank's part
    # is more than a copy and sendrecvs: a call compiled once per signature runs the schedule
    # without the algorithm's frames (all_reduce works in place: send and out are its buffer)
    schedule: Callable | None = None


CATALOGUE: dict[str, dict[str, Algorithm]] = {}


def register(collective: str, name: str, summary: str, *, commutative_only: bool = False,
             reads_input_only: bool = False, takes_source: bool = False, schedule: Callable | None = None):
    """Decorator adding an algorithm function to the catalogue under (collective, name)."""

    def add(fn: Callable) -> Callable:
        CATALOGUE.setdefault(collective, {})[name] = Algorithm(collective, name, fn, summary,
                                                               commutative_only, reads_input_only,
                                                               takes_source, schedule)
        return fn

    return add


def names(collective: str) -> list[str]:
    """The algorithm names `algorithm=` accepts for `collective`."""
    return list(CATALOGUE.get(collective, {}))


def lookup(collective: str, name: str) -> Algorithm:
    """The algorithm `name` of `collective`, or a KeyError listing the ones that exist."""
    try:
        return CATALOGUE[collective][name]
    except KeyError:
        raise KeyError(f"no {collective} algorithm named {name!r}; choose from {names(collective)}") from None
