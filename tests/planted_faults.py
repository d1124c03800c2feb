"""Planted faults: deliberate bugs that show the fuzzer and the tests have teeth. Test code only.

Each fault is a monkeypatch of the library, made in this process: in a test with `planted(...)`,
or in a `colls fuzz` run with `--plugin tests/planted_faults.py:NAME[,NAME]` (the fuzzer calls
`setup`; its forked ranks inherit the patch, its replay line and snippet load it again). Nothing in
`algorithms/` or `colls/` knows about them. Plant before a communicator describes its calls: a
signature compiled before keeps the schedule it was compiled with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from algorithms import (
    CATALOGUE,
    allgather,
    allreduce,
    blocks,
    broadcast,
    hierarchical,
    reduce,
    reduce_scatter,
)
from algorithms.ops import Op

FAULTS = {
    "block_boundary": "blocks.bounds ends the last block one element early (count > parts), so one "
                      "element is never reduced or moved",
    "ring_wrong_peer": "the ring reduce-scatter phase takes its first step from rank r-2 instead of "
                       "r-1 (n >= 3): every rank waits for a message nobody sends",
    "odd_skip_reduction": "the binomial reduce receives but does not fold in the last rank's buffer "
                          "when n is odd",
    "op_order": "Op.into_left puts the incoming (higher-rank) operand on the left: wrong for "
                "non-commutative operators only",
}

# the modules that hold each patched name (imported by name, so each holds its own reference)
BOUNDS_HOLDERS = (blocks, allgather, allreduce, broadcast, hierarchical, reduce, reduce_scatter)
PHASE_HOLDERS = (reduce_scatter, allreduce, hierarchical, reduce)
CACHED = (allgather.ring_steps, allgather.ring_schedule, allgather.doubling_schedule)


def _short_bounds(count: int, parts: int) -> list[int]:
    starts = [count * i // parts for i in range(parts + 1)]
    if count > parts:
        starts[-1] -= 1   # the fault: the last block loses its last element
    return starts


class _FirstFromWrongPeer:
    """A channel whose first exchange receives from rank r-2 instead of the peer asked for."""

    def __init__(self, channel) -> None:
        self._channel, self._first = channel, True

    def __getattr__(self, name: str):
        return getattr(self._channel, name)

    def exchange(self, send_buf, dst, recv_buf, src, reducer=None) -> None:
        if self._first:
            self._first = False
            src = (self._channel.rank - 2) % self._channel.size
        self._channel.exchange(send_buf, dst, recv_buf, src, reducer)


def _discard(accumulator, incoming) -> None:
    """A reducer that drops what arrives."""


class _SkipLastOddFold:
    """A channel that drops the fold of the last rank's buffer when the group size is odd."""

    def __init__(self, channel) -> None:
        self._channel = channel

    def __getattr__(self, name: str):
        return getattr(self._channel, name)

    def exchange(self, send_buf, dst, recv_buf, src, reducer=None) -> None:
        size = self._channel.size
        if reducer is not None and size % 2 and src == size - 1:
            reducer = _discard
        self._channel.exchange(send_buf, dst, recv_buf, src, reducer)


def _plant(name: str, undo: list) -> None:
    if name == "block_boundary":
        for module in BOUNDS_HOLDERS:
            undo.append((module, "bounds", module.bounds))
            module.bounds = _short_bounds
    elif name == "ring_wrong_peer":
        phase = reduce_scatter.ring_reduce_scatter_phase

        def wrong_peer(channel, buf, starts, op, source=None):
            wrong = _FirstFromWrongPeer(channel) if channel.size >= 3 else channel
            return phase(wrong, buf, starts, op, source)

        for module in PHASE_HOLDERS:
            undo.append((module, "ring_reduce_scatter_phase", module.ring_reduce_scatter_phase))
            module.ring_reduce_scatter_phase = wrong_peer
    elif name == "odd_skip_reduction":
        entry = CATALOGUE["reduce"]["binomial"]
        undo.append((CATALOGUE["reduce"], "binomial", entry))
        CATALOGUE["reduce"]["binomial"] = dataclasses.replace(
            entry, run=lambda channel, buf, op, root: entry.run(_SkipLastOddFold(channel), buf, op, root))
    elif name == "op_order":
        from_source = Op.from_source
        undo.append((Op, "into_left", Op.__dict__["into_left"]))
        undo.append((Op, "from_source", Op.__dict__["from_source"]))
        Op.into_left = lambda self, accumulator, incoming: self.combine(incoming, accumulator, accumulator)
        Op.from_source = lambda self, source, lower=False: from_source(self, source, lower=True)
    else:
        raise ValueError(f"unknown fault {name!r}; choose from {sorted(FAULTS)}")


def _restore(undo: list) -> None:
    for holder, name, value in reversed(undo):
        if isinstance(holder, dict):
            holder[name] = value
        else:
            setattr(holder, name, value)
    for function in CACHED:
        function.cache_clear()


def setup(argument: str) -> None:
    """Plant the faults named in `argument` (comma-separated) for the rest of this process:
    what `colls fuzz --plugin tests/planted_faults.py:NAMES` calls."""
    undo: list = []
    for name in filter(None, (part.strip() for part in argument.split(","))):
        _plant(name, undo)
    for function in CACHED:
        function.cache_clear()


@contextmanager
def planted(*names: str) -> Iterator[None]:
    """Plant `names` for the duration of a `with` block, then restore the library."""
    undo: list = []
    try:
        for name in names:
            _plant(name, undo)
        for function in CACHED:
            function.cache_clear()
        yield
    finally:
        _restore(undo)



def in_every_process(directory, names: str) -> str:
    """A `sitecustomize.py` in `directory` that plants `names` in every Python process started
    with `directory` on its PYTHONPATH (Python imports it at startup): for ranks that a launcher
    starts (`colls bench` under mpiexec), where no `--plugin` reaches. Returns the directory."""
    from pathlib import Path

    path = Path(directory) / "sitecustomize.py"
    path.write_text("import importlib.util\n"
                    f"spec = importlib.util.spec_from_file_location('planted_faults', {__file__!r})\n"
                    "module = importlib.util.module_from_spec(spec)\n"
                    "spec.loader.exec_module(module)\n"
                    f"module.setup({names!r})\n")
    return str(directory)
