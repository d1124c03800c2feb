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
    # all_reduce: (rank, size, op) -> the schedule as ((peer, fold), ...) exchanges in place, or None
    # where it is more than that; what a planned call runs without the algorithm's frames
    exchanges: Callable | None = None
    # all_gather, all_to_all: (rank, size, count) -> `blocks.BlockSchedule` over the flat buffers
    # (count: the elements of send), or None where it is more than a copy and sendrecvs; a planned
    # call works it out once and runs it without the algorithm's frames
    schedule: Callable | None = None


CATALOGUE: dict[str, dict[str, Algorithm]] = {}


def register(collective: str, name: str, summary: str, *, commutative_only: bool = False,
             reads_input_only: bool = False, takes_source: bool = False, exchanges: Callable | None = None,
             schedule: Callable | None = None):
    """Decorator adding an algorithm function to the catalogue under (collective, name)."""

    def add(fn: Callable) -> Callable:
        CATALOGUE.setdefault(collective, {})[name] = Algorithm(collective, name, fn, summary,
                                                               commutative_only, reads_input_only,
                                                               takes_source, exchanges, schedule)
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
