"""One benchmark point's buffers and the exact check of a result against numpy.

Inputs are small integers, so every reduction is exact in every dtype and a result either equals
the oracle or is wrong. Element k of rank r's input is `pattern(r)[k % PERIOD]`; a reduction of
periodic inputs is periodic with the same period, so the oracle is computed on PERIOD elements and
compared against the whole buffer through a (rows, PERIOD) view — no full-size expected array.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .spec import ROOT, element_counts

PERIOD = 13          # prime, so no block size used here lines up with it by accident
SENTINEL = -3        # written into outputs before a checked call; never an expected value
MAPPED_FROM_BYTES = 128 << 10   # `fresh_array`: from here, memory mapped for the array alone
HUGE_FROM_BYTES = 4 << 20       # and from here asking for huge pages, as numpy's own allocator does

_FOLDS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def pattern(op: str, rank: int, dtype: np.dtype) -> np.ndarray:
    """One period of rank `rank`'s input: j+1+16·rank, or 1s and 2s for prod (products stay exact)."""
    j = np.arange(PERIOD)
    values = (j + rank) % 2 + 1 if op == "prod" else j + 1 + 16 * rank
    return values.astype(dtype)


def reduced_pattern(op: str, ranks: int, dtype: np.dtype) -> np.ndarray:
    """One period of the reduction over all ranks, computed as the library's operators define it."""
    result = pattern(op, 0, dtype)
    for rank in range(1, ranks):
        result = _FOLDS[op](result, pattern(op, rank, dtype))
    if op == "avg":
        if result.dtype.kind == "f":
            result = np.divide(result, ranks).astype(dtype)
        else:
            result = np.floor_divide(result, ranks)   # sums are positive here: truncation = floor
    return result


def fill(buffer: np.ndarray, period: np.ndarray, phase: int = 0) -> None:
    """buffer[k] = period[(k + phase) % PERIOD] for every k."""
    rolled = np.roll(period, -(phase % PERIOD))
    whole = buffer.size - buffer.size % PERIOD
    buffer[:whole].reshape(-1, PERIOD)[...] = rolled
    buffer[whole:] = rolled[:buffer.size - whole]


def count_wrong(actual: np.ndarray, period: np.ndarray, phase: int = 0) -> int:
    """How many elements of `actual` differ from the periodic expectation."""
    rolled = np.roll(period, -(phase % PERIOD))
    whole = actual.size - actual.size % PERIOD
    wrong = np.count_nonzero(actual[:whole].reshape(-1, PERIOD) != rolled)
    return int(wrong + np.count_nonzero(actual[whole:] != rolled[:actual.size - whole]))


@dataclass
class Case:
    """One (collective, size) point on this rank: input `x`, output `out`, and what `out` must hold."""

    collective: str
    op: str
    dtype: np.dtype
    rank: int
    ranks: int
    x: np.ndarray
    out: np.ndarray
    nbytes: int

    @property
    def block(self) -> int:
        """Elements per rank's block (all_gather input, reduce_scatter output, all_to_all block)."""
        if self.collective == "all_to_all":
            return self.x.size // self.ranks
        return min(self.x.size, self.out.size)   # all_gather's input, reduce_scatter's output

    def poison(self) -> None:
        """Overwrite the output so that a call which writes nothing cannot pass the check."""
        self.out.fill(SENTINEL)

    def wrong(self, result: np.ndarray | None) -> int:
        """Elements of this rank's result that differ from numpy's answer (0 where none is due)."""
        if result is None:
            return 0
        collective, rank = self.collective, self.rank
        if collective in ("all_reduce", "reduce"):
            if collective == "reduce" and rank != ROOT:
                return 0
            return count_wrong(result, reduced_pattern(self.op, self.ranks, self.dtype))
        if collective == "broadcast":
            return count_wrong(result, pattern(self.op, ROOT, self.dtype))
        if collective == "reduce_scatter":
            return count_wrong(result, reduced_pattern(self.op, self.ranks, self.dtype), rank * self.block)
        block = self.block
        wrong = 0
        for source in range(self.ranks):   # block `source` of the result came from rank `source`
            piece = result[source * block:(source + 1) * block]
            phase = rank * block if collective == "all_to_all" else 0
            wrong += count_wrong(piece, pattern(self.op, source, self.dtype), phase)
        return wrong


def fresh_array(count: int, dtype) -> np.ndarray:
    """An uninitialised array of `count` elements; from 128 KiB in anonymous memory mapped for it
    alone (unmapped when the array goes), as glibc's malloc gives a process's first big blocks.
    Once a big block is freed, malloc serves the next ones of that size from its heap instead, so
    a bench's later points would run on other memory than its first, measurably slower (a big
    broadcast or copy by tens of percent). (Holding malloc's threshold instead, with mallopt, made
    every temporary buffer MPICH allocates inside MPI_Allreduce a fresh mapping too, and its
    MiB-sized calls about twice as slow.)"""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if nbytes < MAPPED_FROM_BYTES:
        return np.empty(count, dtype)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)   # anonymous, as malloc's (huge pages allowed)
    if nbytes >= HUGE_FROM_BYTES and hasattr(region, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, dtype, count)


def make_case(collective: str, nbytes: int, op: str, dtype: str, rank: int, ranks: int,
              registered: bool = False) -> Case:
    """Allocate and fill this rank's buffers for `collective` at nccl-tests size `nbytes` (each
    in memory of its own: `fresh_array`, or `colls.alloc`'s registered memory)."""
    dt = np.dtype(dtype)
    count_in, count_out = element_counts(collective, nbytes, ranks, dtype)
    allocate = registered_array if registered else fresh_array
    x = allocate(count_in, dt)
    fill(x, pattern(op, rank, dt))
    out = allocate(count_out, dt)
    out.fill(SENTINEL)   # touch every page now, not inside the first timed call
    return Case(collective, op, dt, rank, ranks, x, out, max(count_in, count_out) * dt.itemsize)


def registered_array(count: int, dtype: np.dtype) -> np.ndarray:
    """`count` elements of `dtype` in registered memory (`colls.alloc`)."""
    from transports.registered import alloc

    return alloc(count, dtype)


def colls_call(comm, case: Case, algorithm: str | None) -> tuple[Callable[[], object], np.ndarray | None]:
    """(the colls call for `case` on `comm`, writing into the case's output; where its result lands)."""
    x, out, op, kind = case.x, case.out, case.op, case.collective
    if kind == "all_reduce":
        return (lambda: comm.all_reduce(x, op=op, out=out, algorithm=algorithm)), out
    if kind == "broadcast":
        # the buffers MPI's Bcast gets (baselines.py): in place on the root, `out` elsewhere
        target = x if case.rank == ROOT else out
        return (lambda: comm.broadcast(x, root=ROOT, out=target, algorithm=algorithm)), target
    if kind == "reduce":
        given = out if case.rank == ROOT else None
        return (lambda: comm.reduce(x, root=ROOT, op=op, out=given, algorithm=algorithm)), given
    if kind == "all_gather":
        return (lambda: comm.all_gather(x, out=out, algorithm=algorithm)), out
    if kind == "reduce_scatter":
        return (lambda: comm.reduce_scatter(x, op=op, out=out, algorithm=algorithm)), out
    if kind == "all_to_all":
        return (lambda: comm.all_to_all(x, out=out, algorithm=algorithm)), out
    raise ValueError(f"colls bench has no case for {kind}")
