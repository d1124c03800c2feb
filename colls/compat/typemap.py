"""The typemap of an MPI datatype: where its bytes lie, and how to pack and unpack them with numpy.

A `Typemap` is built from a constructor's blocks (block start in bytes, block length in elements
of a child typemap), never element by element: bounds and size are computed from the blocks, and
the byte runs (start, length) of one element are flattened only when a buffer first needs them.
`Typemap.layout(count)` turns `count` consecutive elements into a `Layout`, cached per count: the
window of bytes the elements span and, where they are not one contiguous run, the index array
(in units of the largest power of two, up to 8 bytes, that divides every run) that gathers them
into a contiguous buffer (`pack`) or scatters one back (`unpack`) with numpy fancy indexing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

_UNITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_CACHE_LIMIT = 32   # layouts kept per typemap (counts differ between calls only rarely)


@dataclass(frozen=True)
class Layout:
    """`count` elements of a datatype: the bytes [lo, hi) they span, relative to the first
    element's position, and `index` (None when the packed bytes are exactly that window)."""

    lo: int
    hi: int
    size: int
    unit: int
    index: np.ndarray | None

    def pack(self, window: np.ndarray) -> np.ndarray:
        """The packed bytes of `window` (the bytes [lo, hi)): a view if contiguous, else a copy."""
        if self.index is None:
            return window
        return window.view(_UNITS[self.unit])[self.index].view(np.uint8)

    def unpack(self, window: np.ndarray, packed: np.ndarray) -> None:
        """Scatter `packed` back into `window` (the inverse of `pack`)."""
        if self.index is None:
            if packed is not window:
                window[...] = packed
            return
        window.view(_UNITS[self.unit])[self.index] = packed.view(_UNITS[self.unit])


class Typemap:
    """Bounds, size, basic element types and (lazily) byte runs of one datatype element.

    Args:
        groups: (starts, lengths, child) triples: `lengths[i]` consecutive child elements (a
            child's extent apart) placed from byte `starts[i]`; None for a predefined type.
        basic: the numpy dtype of a predefined type (with `groups` None).
        bounds: (lb, ub) set explicitly (Create_resized, subarray); otherwise computed.
        align: pad the extent to the largest alignment of the basic types (MPI_Type_create_struct).
    """

    def __init__(self, groups: list[tuple[np.ndarray, np.ndarray, Typemap]] | None = None,
                 basic: np.dtype | None = None, bounds: tuple[int, int] | None = None,
                 align: bool = False) -> None:
        self._groups = groups
        self._runs: tuple[np.ndarray, np.ndarray] | None = None
        self._layouts: dict[int, Layout] = {}
        self._dense: bool | None = None
        self._lock = threading.Lock()
        if groups is None:   # predefined
            assert basic is not None
            self.basics: frozenset[np.dtype] = frozenset([basic])
            self.size = basic.itemsize
            self.lb, self.ub, self.true_lb, self.true_ub = 0, basic.itemsize, 0, basic.itemsize
            self.alignment = basic.alignment
            self.sticky = False
            return
        self.basics = frozenset().union(*(child.basics for _, _, child in groups))
        self.alignment = max((child.alignment for _, _, child in groups), default=1)
        self.size = sum(int(lengths.sum()) * child.size for _, lengths, child in groups)
        lows, highs, true_lows, true_highs = [], [], [], []
        for starts, lengths, child in groups:
            used = lengths > 0
            if not used.any():
                continue
            first, last = starts[used], starts[used] + (lengths[used] - 1) * child.extent
            low, high = np.minimum(first, last), np.maximum(first, last)
            lows.append(int(low.min()) + child.lb)
            highs.append(int(high.max()) + child.ub)
            if child.size:
                true_lows.append(int(low.min()) + child.true_lb)
                true_highs.append(int(high.max()) + child.true_ub)
        self.sticky = bounds is not None or any(child.sticky for _, _, child in groups)
        self.lb, self.ub = (min(lows), max(highs)) if lows else (0, 0)
        self.true_lb, self.true_ub = (min(true_lows), max(true_highs)) if true_lows else (0, 0)
        if bounds is not None:
            self.lb, self.ub = bounds
        elif align and not self.sticky and self.ub > self.lb:
            pad = (-(self.ub - self.lb)) % self.alignment
            self.ub += pad

    @property
    def extent(self) -> int:
        """ub - lb in bytes."""
        return self.ub - self.lb

    @property
    def dense(self) -> bool:
        """Whether one element is one run of bytes starting at 0 and filling the extent."""
        if self._dense is None:
            self._dense = self.size == self.extent and self.lb == 0 and self.runs()[0].size <= 1
        return self._dense

    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) in bytes of one element's data, in typemap order, adjacent runs merged."""
        if self._runs is None:
            if self._groups is None:
                starts, lengths = np.zeros(1, np.int64), np.full(1, self.size, np.int64)
            else:
                parts = [_expand(starts, counts, child) for starts, counts, child in self._groups]
                starts = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
                lengths = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
            self._runs = _merge(starts, lengths)
        return self._runs

    def layout(self, count: int) -> Layout:
        """The `Layout` of `count` consecutive elements (cached)."""
        if self.dense:   # predefined types and their contiguous kin: one run, nothing to cache
            return Layout(0, count * self.size, count * self.size, 1, None)
        layout = self._layouts.get(count)
        if layout is not None:
            return layout
        starts, lengths = self.runs()
        if count == 0 or starts.size == 0:
            layout = Layout(0, 0, 0, 1, None)
        else:
            if count > 1:
                starts = (np.arange(count, dtype=np.int64)[:, None] * self.extent + starts).ravel()
                lengths = np.tile(lengths, count)
                starts, lengths = _merge(starts, lengths)
            lo, hi = int(starts.min()), int((starts + lengths).max())
            total = int(lengths.sum())
            if starts.size == 1:
                layout = Layout(lo, hi, total, 1, None)
            else:
                unit = 8
                while unit > 1 and (np.any((starts - lo) % unit) or np.any(lengths % unit)):
                    unit //= 2
                index = _ranges((starts - lo) // unit, lengths // unit)
                layout = Layout(lo, hi, total, unit, index)
        with self._lock:
            if len(self._layouts) >= _CACHE_LIMIT:
                self._layouts.clear()
            self._layouts[count] = layout
        return layout


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)


def _merge(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop empty runs and join each run to the previous one where it begins at its end."""
    keep = lengths > 0
    starts, lengths = starts[keep].astype(np.int64), lengths[keep].astype(np.int64)
    if starts.size <= 1:
        return starts, lengths
    new = np.ones(starts.size, bool)
    new[1:] = starts[1:] != starts[:-1] + lengths[:-1]
    heads = np.flatnonzero(new)
    merged = np.add.reduceat(lengths, heads)
    return starts[heads], merged


def _expand(starts: np.ndarray, counts: np.ndarray, child: Typemap) -> tuple[np.ndarray, np.ndarray]:
    """Byte runs of blocks of `counts[i]` child elements from `starts[i]`."""
    if child.dense:   # a block of a dense child is one run
        return starts, counts * child.size
    positions = _ranges(np.zeros_like(starts), counts) * child.extent + np.repeat(starts, counts)
    run_starts, run_lengths = child.runs()
    return ((positions[:, None] + run_starts).ravel(),
            np.broadcast_to(run_lengths, (positions.size, run_lengths.size)).ravel())


def blocks(starts: object, lengths: object, child: Typemap, **kwargs: object) -> Typemap:
    """A typemap of one group of blocks of `child` (starts in bytes, lengths in child elements)."""
    return Typemap([(np.asarray(starts, np.int64).reshape(-1), np.asarray(lengths, np.int64).reshape(-1),
                     child)], **kwargs)   # type: ignore[arg-type]


def subarray(sizes: list[int], subsizes: list[int], starts: list[int], fortran: bool,
             child: Typemap) -> Typemap:
    """The elements of a sub-box of an array of `child` elements; the extent is the whole array's."""
    if fortran:
        sizes, subsizes, starts = sizes[::-1], subsizes[::-1], starts[::-1]
    outer = np.indices(subsizes[:-1], dtype=np.int64).reshape(len(sizes) - 1, -1) if len(sizes) > 1 \
        else np.zeros((0, 1), np.int64)
    flat = np.zeros(outer.shape[1], np.int64)
    for axis in range(len(sizes) - 1):
        flat = flat * sizes[axis] + outer[axis] + starts[axis]
    flat = flat * sizes[-1] + starts[-1]
    whole = int(np.prod(sizes, dtype=np.int64)) * child.extent
    return blocks(flat * child.extent, np.full(flat.size, subsizes[-1]), child, bounds=(0, whole))
