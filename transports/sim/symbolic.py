"""Symbolic buffers for the `sim` transport: arrays with a size and a dtype but no data.

A `SymbolicArray` is a stride-0 view of one element, so a 1 GiB buffer costs no memory. Copies,
`np.empty_like` and ufuncs on it compute nothing; they charge their cost (γ per byte reduced, a
copy's per byte) to the clock of the rank whose algorithm code runs now (`_RUNNING`), and mark
the buffer written in this run for networks that price reading lines another core wrote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import as_strided

if TYPE_CHECKING:
    from .world import SimWorld


class SymbolicArray(np.ndarray):
    """A buffer with a size and a dtype but no data: every element aliases one element."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        # an Op combining two buffers: charge γ per byte of the result, compute nothing
        target = out[0] if out else next(x for x in inputs if isinstance(x, SymbolicArray))
        _charge(target.nbytes, "gamma")
        if out:
            _written(target)
        return target if out else symbolic(target.size, target.dtype).reshape(target.shape)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.copyto:
            _charge(args[0].nbytes, "copy")
            _written(args[0])
            return None
        if func is np.take:   # a gather of blocks (bruck's packing): a copy of what it takes
            taken = kwargs.get("out")
            if taken is None:   # as symbolic as its source: a shape, no memory
                source, indices = args[0], np.shape(args[1])
                axis = kwargs.get("axis", args[2] if len(args) > 2 else None)
                axis = None if axis is None else axis % source.ndim
                shape = (indices if axis is None
                         else (*source.shape[:axis], *indices, *source.shape[axis + 1:]))
                taken = symbolic(int(np.prod(shape, dtype=np.int64)), source.dtype).reshape(shape)
            _charge(taken.nbytes, "copy")
            _written(taken)
            return taken
        if func in _LIKE:
            prototype = args[0]
            position = 2 if func is np.full_like else 1
            dtype = kwargs.get("dtype") or (args[position] if len(args) > position else None)
            shape = kwargs.get("shape")
            shape = prototype.shape if shape is None else tuple(np.atleast_1d(shape).tolist())
            made = symbolic(int(np.prod(shape, dtype=np.int64)), dtype or prototype.dtype).reshape(shape)
            _charge(made.nbytes, "alloc")   # a fresh buffer's first touch (page faults), if modelled
            return made
        if func in (np.may_share_memory, np.shares_memory):
            return False
        return super().__array_function__(func, types, args, kwargs)

    def __setitem__(self, key, value) -> None:
        _charge(getattr(value, "nbytes", 0), "copy")   # nothing to write into
        _written(self)

    def copy(self, order="C") -> SymbolicArray:  # noqa: ARG002 - numpy's signature
        """Another symbolic buffer of the same shape (no data to copy)."""
        _charge(self.nbytes, "copy")
        return symbolic(self.size, self.dtype).reshape(self.shape)


_LIKE = (np.empty_like, np.zeros_like, np.ones_like, np.full_like)


def symbolic(count: int, dtype=np.float32) -> SymbolicArray:
    """A 1-D symbolic buffer of `count` elements of `dtype`: costs one element of memory."""
    one = np.zeros(1, dtype)
    return as_strided(one, (int(count),), (0,), writeable=True).view(SymbolicArray)


def is_symbolic(buf: np.ndarray) -> bool:
    """Whether `buf` carries no data (a `SymbolicArray`)."""
    return isinstance(buf, SymbolicArray)


_RUNNING: list = [None]   # the _Rank whose algorithm code runs right now (one at a time, per process)


def _charge(nbytes: int, kind: str) -> None:
    rank = _RUNNING[0]
    if rank is not None:
        world = rank.world
        fixed = 0.0
        if world.after_work_bytes is not None and kind != "alloc" and nbytes >= world.after_work_bytes:
            rank.after_work = True
        if kind == "alloc":
            rate = world.alloc_seconds_per_byte(nbytes) if world.alloc_seconds_per_byte else 0.0
        elif kind == "gamma":
            rate, fixed = world.gamma, world.reduce_call_seconds
        else:
            rate, fixed = world.copy_seconds_per_byte, world.copy_call_seconds
        rank.clock = max(rank.clock, world.now) + (nbytes * rate + fixed) * rank.slowdown


def root_of(buf: np.ndarray) -> np.ndarray:
    """The array that owns `buf`'s memory (every view of one buffer has the same root)."""
    while isinstance(buf.base, np.ndarray):
        buf = buf.base
    return buf


def _written(buf: np.ndarray, pays: bool = True) -> None:
    """The running rank has written `buf` in this run (a network with `tracks_writes` routes a
    message from a buffer its sender wrote apart: the receiver reads lines dirty in another cache;
    one with `rewrite_seconds` charges a write to lines that ranks on other cores have read, now
    unless not `pays`: a receive's is charged when its bytes land, `SimWorld.deliver`)."""
    rank = _RUNNING[0]
    if rank is None:
        return
    world = rank.world
    if world.written is not None:
        root = root_of(buf)
        world.written[id(root)] = root
    if pays and world.unpaid:
        rank.clock = max(rank.clock, world.now) + _rewrite_seconds(world, buf) * rank.slowdown


def _rewrite_seconds(world: SimWorld, buf: np.ndarray) -> float:
    """What writing `buf` adds if ranks on other cores read its lines in the call before (the
    world's `unpaid`): each store must first take its line back from the reader's cache. The
    network's price of rewriting as many bytes as were read is shared out over the writes that
    cover them; those lines are the writer's again after."""
    owed = world.unpaid.get(id(root_of(buf)))
    if owed is None or owed[1] <= 0:
        return 0.0
    total, left = owed
    paid = min(buf.nbytes, left)
    owed[1] = left - paid
    return world.rewrite_seconds(total) * paid / total
