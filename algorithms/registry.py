"""The catalogue: every algorithm of every collective, by name, with what it needs.

colls' own schedules and a user's plugins register alike, through `register` (the public name is
`colls.algorithm`, which says `keeps_rank_order=` where the catalogue says `commutative_only=`).
Each is checked as it registers: a collective colls knows, a name not taken, and a function that
takes the arguments its collective hands it (`SIGNATURES`). Installed packages add theirs through
the entry-point group `colls.algorithms`, loaded the first time the catalogue is listed or a name
it lacks is looked up.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from transports.errors import InvalidArgument

# What each collective hands its algorithm, after the channel: the arguments a schedule must take.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "all_reduce": ("buf", "op"),                    # in place: buf is the input and the result
    "broadcast": ("buf", "root"),                   # in place: the root's buf ends up everywhere
    "reduce": ("buf", "op", "root"),                # buf is scratch; the root's ends as the result
    "all_gather": ("send", "out"),                  # send: my block; out: size blocks
    "reduce_scatter": ("send", "out", "op"),        # send: size blocks (may be overwritten); out: mine
    "all_to_all": ("send", "out"),                  # block i of send goes to rank i
    "all_to_all_v": ("send", "send_counts", "send_starts", "out", "recv_counts", "recv_starts"),
    "gather": ("send", "out", "root"),              # out: None except on the root
    "scatter": ("send", "out", "root"),             # send: None except on the root
    "barrier": (),
}
ENTRY_POINT_GROUP = "colls.algorithms"


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
    # (size, nbytes, machine) -> seconds: a plugin's declared α-β cost (`algorithms.cost.Machine`),
    # printed by `colls plan` beside the simulated time; colls' own models live in algorithms.cost
    cost: Callable | None = None
    origin: str = ""                 # the module that registered it ("algorithms.x" for colls' own)

    @property
    def plugin(self) -> bool:
        """Whether a user's module registered it (not colls' own catalogue)."""
        return not self.origin.startswith("algorithms.")


CATALOGUE: dict[str, dict[str, Algorithm]] = {}
_entry_points_loaded = False        # set once every entry point has been imported
_entry_points_lock = threading.RLock()   # threads of one process (local ranks) wait for the first
_entry_points_loading = False       # a plugin listing the catalogue as it loads does not recurse


def register(collective: str, name: str, summary: str, *, commutative_only: bool = False,
             reads_input_only: bool = False, takes_source: bool = False, schedule: Callable | None = None,
             cost: Callable | None = None):
    """Decorator adding an algorithm function to the catalogue under (collective, name).

    Raises:
        InvalidArgument: an unknown `collective`, a `name` taken by another function, a function
            that does not take (channel, *SIGNATURES[collective]), or a `cost` that is not callable.
    """
    if collective not in SIGNATURES:
        raise InvalidArgument(f"collective={collective!r} is not a collective colls runs; choose from "
                              f"{list(SIGNATURES)}")
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidArgument(f"name={name!r}: give an algorithm name such as 'my_ring' (letters, digits, _)")
    if cost is not None and not callable(cost):
        raise InvalidArgument(f"cost={cost!r} is not a function (size, nbytes, machine) -> seconds")

    def add(fn: Callable) -> Callable:
        _check_signature(collective, name, fn, takes_source)
        taken = CATALOGUE.get(collective, {}).get(name)
        if taken is not None and _where(taken.run) != _where(fn):   # the same def run again: replaced
            raise InvalidArgument(f"name={name!r}: {collective} already has an algorithm of that name "
                                  f"({_where(taken.run)}); pick another")
        CATALOGUE.setdefault(collective, {})[name] = Algorithm(
            collective, name, fn, summary, commutative_only, reads_input_only, takes_source, schedule,
            cost, getattr(fn, "__module__", "") or "")
        return fn

    return add


def algorithm(collective: str, name: str, *, summary: str, keeps_rank_order: bool = False,
              cost: Callable | None = None):
    """Decorator: register a schedule of your own, run by `algorithm=name` on every transport.

    The function takes the call's `algorithms.channel.Channel` and then the arguments
    `SIGNATURES[collective]` names (all_reduce: `(channel, buf, op)`, in place), and moves data
    only through the channel's verbs (send, recv, recv_reduce, wait, exchange).

    Args:
        collective: "all_reduce", "broadcast", ... (a key of `SIGNATURES`).
        name: what `algorithm=` calls it; not one the collective has already.
        summary: one line saying what moves where (listed beside the catalogue's).
        keeps_rank_order: whether it folds contributions in rank order, so that it may run a
            non-commutative op (the fuzzer then tries such ops on it); default False.
        cost: optionally `(size, nbytes, machine) -> seconds`, its α-β cost model
            (`algorithms.cost.Machine`: alpha, beta, gamma), printed by `colls plan` beside the
            simulated time.

    Returns:
        The decorator, which returns the function unchanged.

    Raises:
        InvalidArgument: an unknown collective, a taken name, a function with the wrong
            arguments, or a cost that is not a function; the message names the argument.
    """
    return register(collective, name, summary, commutative_only=not keeps_rank_order, cost=cost)


def _where(fn: Callable) -> str:
    """`module.function` of `fn`, with its file: what tells one definition from another."""
    code = getattr(fn, "__code__", None)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}" + (
        f" in {code.co_filename}" if code is not None else "")


def _check_signature(collective: str, name: str, fn: Callable, takes_source: bool) -> None:
    """Refuse a function that cannot be called as its collective calls it."""
    wanted = ("channel", *SIGNATURES[collective]) + (("source",) if takes_source else ())
    if not callable(fn):
        raise InvalidArgument(f"{collective} algorithm {name!r}: {fn!r} is not a function")
    try:
        inspect.signature(fn).bind(*wanted)
    except TypeError as error:
        raise InvalidArgument(f"{collective} algorithm {name!r}: {fn.__qualname__} must take "
                              f"({', '.join(wanted)}): {error}") from None
    except ValueError:   # (no signature to inspect: a builtin; trusted)
        pass


def load_entry_points() -> list[str]:
    """Import every installed package's `colls.algorithms` entry point, once per process.

    Returns:
        The entry points' names loaded by this call (empty after the first).

    Raises:
        InvalidArgument: an entry point fails to import, naming it and its package.
    """
    global _entry_points_loaded, _entry_points_loading
    if _entry_points_loaded:
        return []
    with _entry_points_lock:
        if _entry_points_loaded or _entry_points_loading:
            return []
        _entry_points_loading = True
        try:
            from importlib.metadata import entry_points

            loaded = []
            for point in entry_points(group=ENTRY_POINT_GROUP):
                try:
                    point.load()
                except Exception as error:
                    raise InvalidArgument(f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP}) "
                                          f"failed to load: {error!r}") from error
                loaded.append(point.name)
        finally:
            _entry_points_loaded, _entry_points_loading = True, False
        return loaded


def names(collective: str) -> list[str]:
    """The algorithm names `algorithm=` accepts for `collective` (installed plugins included)."""
    if not _entry_points_loaded:
        load_entry_points()
    return list(CATALOGUE.get(collective, {}))


def lookup(collective: str, name: str) -> Algorithm:
    """The algorithm `name` of `collective`, or a KeyError listing the ones that exist."""
    try:
        return CATALOGUE[collective][name]
    except KeyError:
        if not _entry_points_loaded:   # perhaps an installed plugin's name: load them, look again
            load_entry_points()
            found = CATALOGUE.get(collective, {}).get(name)
            if found is not None:
                return found
        raise KeyError(f"no {collective} algorithm named {name!r}; choose from {names(collective)}") from None
