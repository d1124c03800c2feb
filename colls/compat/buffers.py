"""Buffer specifications as mpi4py accepts them, turned into views of the caller's memory.

`buf`, `[buf, MPI.DOUBLE]`, `[buf, count, MPI.DOUBLE]`, `[buf, (count, displ), MPI.DOUBLE]`,
`[buf, count, displ, MPI.DOUBLE]` and, for the vector collectives, `[buf, (counts, displs), type]`.
`buf` is anything with the buffer protocol (numpy arrays, `array.array`, `bytearray`) or `__dlpack__`
(CPU). Nothing is copied: a `Message` holds a byte view of the buffer, so colls writes straight into
the caller's memory, as MPI does. Like mpi4py's `message_simple`/`message_vector` (msgbuffer.pxi),
counts are inferred from the buffer's length when omitted.
"""

from __future__ import annotations

import ctypes
import operator
from dataclasses import dataclass, field

import numpy as np

from . import dlpack
from .datatypes import Datatype, for_dtype, lookup
from .typemap import Layout


class _Constant:
    """A named sentinel (MPI.IN_PLACE, MPI.BOTTOM) that prints as itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"MPI.{self.name}"


IN_PLACE = _Constant("IN_PLACE")
BOTTOM = _Constant("BOTTOM")


def is_in_place(message: object) -> bool:
    """mpi4py reads None as MPI.IN_PLACE wherever in-place is allowed."""
    return message is None or message is IN_PLACE


def raw_bytes(buf: object, writable: bool) -> tuple[np.ndarray, Datatype | None]:
    """(the buffer's bytes as a 1-D uint8 view, the datatype its format implies or None)."""
    if buf is None or buf is BOTTOM:
        return np.empty(0, np.uint8), None
    if isinstance(buf, np.ndarray):
        array = buf
    elif hasattr(buf, "__cuda_array_interface__") and not _has_buffer(buf):
        array = dlpack.cuda_array(buf)
    elif _has_buffer(buf):
        view = memoryview(buf)
        if not view.c_contiguous:
            raise BufferError("message: the buffer is not C-contiguous")
        if writable and view.readonly:
            raise BufferError("message: the buffer is read-only")
        array = np.frombuffer(view, np.uint8) if view.nbytes else np.empty(0, np.uint8)
        return array, _format_type(view.format)
    elif hasattr(buf, "__dlpack__"):
        array = dlpack.host_array(buf)
    else:
        raise TypeError(f"message: expecting a buffer, got {type(buf).__name__}")
    if not array.flags.c_contiguous:
        if not array.flags.f_contiguous:   # (mpi4py takes either order: the bytes in memory order)
            raise BufferError("message: the buffer is not contiguous")
        array = array.T
    if writable and not array.flags.writeable:
        raise BufferError("message: the buffer is read-only")
    datatype = None if array.dtype.fields is not None else for_dtype(array.dtype)
    return array.reshape(-1).view(np.uint8), datatype


def _has_buffer(obj: object) -> bool:
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _format_type(fmt: str) -> Datatype | None:
    try:
        return lookup(fmt)
    except KeyError:
        return None


def _is_buffer_object(msg: object) -> bool:
    if isinstance(msg, (list, tuple)):
        return False
    return isinstance(msg, np.ndarray) or _has_buffer(msg) or hasattr(msg, "__dlpack__") or hasattr(
        msg, "__cuda_array_interface__")


def _is_datatype(obj: object) -> bool:
    return isinstance(obj, (Datatype, str))


def _unpack(msg: object, vector: bool) -> tuple[object, object, object, object]:
    """(buffer, count(s), displacement(s), datatype) from any of mpi4py's message forms."""
    if _is_buffer_object(msg):
        return msg, None, None, None
    if not isinstance(msg, (list, tuple)):
        raise TypeError("message: expecting buffer or list/tuple")
    pair = tuple if vector else (tuple, list)   # vector forms: a list there is the counts
    count = displ = datatype = None
    if len(msg) == 2:
        buf, count = msg
        if _is_datatype(count):
            count, datatype = None, count
        elif isinstance(count, pair):
            count, displ = count
    elif len(msg) == 3:
        buf, count, datatype = msg
        if isinstance(count, pair):
            count, displ = count
    elif len(msg) == 4:
        buf, count, displ, datatype = msg
    else:
        raise ValueError("message: expecting 2 to 4 items")
    return buf, count, displ, datatype


@dataclass(frozen=True)
class Message:
    """Where one rank's data lies: bytes of a buffer, the datatype, and element counts/offsets.

    `count`/`displ` for a simple message (count per block for the block collectives); `counts`/
    `displs` (per rank) for a vector one. Offsets and counts are in elements of `datatype`;
    `origin` is the byte position, in the datatype's coordinates, of `raw[0]` (0 for a buffer, the
    absolute address of `raw[0]` for MPI.BOTTOM, minus a byte displacement for Alltoallw).

    The spans it hands out (`data`, `block`, `typed`) are the packed bytes of the elements: views
    of `raw` where the datatype lays them out contiguously; otherwise copies (packed from `raw`,
    so they also serve as sources), which `received()` unpacks into `raw` once data has landed.
    """

    raw: np.ndarray
    datatype: Datatype
    count: int = 0
    displ: int = 0
    counts: tuple[int, ...] = ()
    displs: tuple[int, ...] = ()
    writable: bool = False
    origin: int = 0
    _landing: list = field(default_factory=list, compare=False, repr=False)

    def received(self) -> None:
        """Call once a receive into `data()` (or `block()`, `typed()`) has completed: a no-op for a
        contiguous layout (the bytes landed in the caller's memory); otherwise this unpacks every
        landing buffer handed out, in the order they were handed out."""
        while self._landing:
            layout, window, packed = self._landing.pop(0)
            layout.unpack(window, packed)

    def window(self, start: int, count: int) -> tuple[Layout, np.ndarray]:
        """(layout, the bytes of `raw` that `count` elements from element `start` span), checked."""
        layout = self.datatype.layout(count)
        begin = start * self.datatype.extent + layout.lo - self.origin
        end = begin + layout.hi - layout.lo
        if layout.size and (begin < 0 or end > self.raw.size):
            name = self.datatype.Get_name() or "a derived datatype"
            raise ValueError(f"message: {count} elements of {name} from element {start} need {end} bytes "
                             f"(from byte {begin}); the buffer has {self.raw.size}")
        return layout, self.raw[max(begin, 0):max(end, 0)]

    def span(self, start: int, count: int) -> np.ndarray:
        """Packed bytes of `count` elements from element `start` (see the class docstring)."""
        layout, window = self.window(start, count)
        if layout.index is None:
            return window
        packed = layout.pack(window)
        if self.writable:
            self._landing.append((layout, window, packed))
        return packed

    def data(self, blocks: int = 1) -> np.ndarray:
        """The bytes of `blocks` consecutive blocks of `count` elements, from `displ`."""
        return self.span(self.displ, self.count * blocks)

    def typed(self, blocks: int = 1) -> np.ndarray:
        """`data(blocks)` as elements of the datatype's basic type (for reductions)."""
        return self.data(blocks).view(self.datatype.basic)

    def block(self, rank: int) -> np.ndarray:
        """Bytes of rank `rank`'s block: block `rank` of a simple message, or its (count, displ)."""
        if self.counts:
            return self.span(self.displs[rank], self.counts[rank])
        return self.span(self.displ + rank * self.count, self.count)


def at_bottom(datatype: Datatype, ranges: list[tuple[int, int]], writable: bool) -> tuple[np.ndarray, int]:
    """(bytes of memory at absolute addresses, the address of the first) covering every
    (start element, count) of `datatype` addressed from MPI.BOTTOM."""
    spans = []
    for start, count in ranges:
        layout = datatype.layout(count)
        if layout.size:
            spans.append((start * datatype.extent + layout.lo, start * datatype.extent + layout.hi))
    return memory_at(spans)


def memory_at(spans: list[tuple[int, int]]) -> tuple[np.ndarray, int]:
    """Bytes of this process's memory covering every [begin, end) address of `spans` (absolute
    addresses, as MPI.Get_address gives them); (empty, 0) if there are none."""
    if not spans:
        return np.empty(0, np.uint8), 0
    low, high = min(b for b, _ in spans), max(e for _, e in spans)
    if low <= 0:
        raise ValueError(f"message: address {low} from MPI.BOTTOM is not a valid address")
    return np.ctypeslib.as_array((ctypes.c_uint8 * (high - low)).from_address(low)), low


def _datatype(given: object, implied: Datatype | None) -> Datatype:
    datatype = lookup(given) if given is not None else implied
    if datatype is None:
        raise ValueError("message: cannot infer the datatype; pass [buf, MPI.<TYPE>]")
    if not datatype:
        raise ValueError("message: the datatype is MPI.DATATYPE_NULL")
    return datatype


def _elements(raw: np.ndarray, datatype: Datatype, skip: int = 0) -> int:
    if datatype.extent <= 0:
        raise ValueError(f"message: cannot infer count from a datatype of extent {datatype.extent}; "
                         "pass [buf, count, datatype]")
    length = raw.size - skip * datatype.extent
    if length % datatype.extent:
        raise ValueError(f"message: cannot infer count, buffer length {length} is not a multiple of "
                         f"datatype extent {datatype.extent}")
    return length // datatype.extent


def simple(msg: object, writable: bool, blocks: int = 0) -> Message:
    """A buffer, count and displacement (mpi4py's `message_simple`); `blocks` > 1 splits an inferred count."""
    buf, count, displ, given = _unpack(msg, vector=False)
    raw, implied = raw_bytes(buf, writable)
    datatype = _datatype(given, implied)
    displ = 0 if displ is None else operator.index(displ)
    if displ < 0:
        raise ValueError(f"message: negative displacement {displ}")
    if buf is BOTTOM and count is None:
        raise ValueError("message: a count is needed with MPI.BOTTOM")
    if displ > 0 and buf is not BOTTOM and displ * datatype.extent > raw.size:
        raise ValueError(f"message: displacement {displ} out of bounds, the buffer holds "
                         f"{raw.size // max(datatype.extent, 1)} elements")
    if count is None:
        total = _elements(raw, datatype, displ)
        if blocks > 1 and total % blocks:
            raise ValueError(f"message: cannot infer count, number of entries {total} is not a multiple "
                             f"of required number of blocks {blocks}")
        count = total // max(blocks, 1)
    count = operator.index(count)
    if count < 0:
        raise ValueError(f"message: negative count {count}")
    origin = 0
    if buf is BOTTOM:
        raw, origin = at_bottom(datatype, [(displ, count * max(blocks, 1))], writable)
    message = Message(raw, datatype, count, displ, writable=writable, origin=origin)
    message.window(displ, count * max(blocks, 1))   # bounds check now, before any rank moves data
    return message


def vector(msg: object, writable: bool, blocks: int) -> Message:
    """Per-rank counts and displacements (mpi4py's `message_vector`) for the v-collectives."""
    buf, counts, displs, given = _unpack(msg, vector=True)
    raw, implied = raw_bytes(buf, writable)
    datatype = _datatype(given, implied)
    if counts is None:
        total = _elements(raw, datatype) if raw.size else 0
        counts = [total // blocks + (total % blocks > i) for i in range(blocks)]
    elif isinstance(counts, (int, np.integer)):
        counts = [operator.index(counts)] * blocks
    counts = [operator.index(c) for c in counts]   # type: ignore[union-attr]
    if displs is None:
        displs = [sum(counts[:i]) for i in range(blocks)]
    elif isinstance(displs, (int, np.integer)):
        displs = [operator.index(displs) * i for i in range(blocks)]
    displs = [operator.index(d) for d in displs]   # type: ignore[union-attr]
    if len(counts) != blocks or len(displs) != blocks:
        raise ValueError(f"message: expecting {blocks} counts and displacements, got {len(counts)} "
                         f"and {len(displs)}")
    if any(c < 0 for c in counts) or any(d < 0 for d in displs):
        raise ValueError("message: negative count or displacement")
    origin = 0
    if buf is BOTTOM:
        raw, origin = at_bottom(datatype, list(zip(displs, counts, strict=True)), writable)
    message = Message(raw, datatype, counts=tuple(counts), displs=tuple(displs), writable=writable,
                      origin=origin)
    for rank in range(blocks):
        message.window(displs[rank], counts[rank])   # bounds check
    return message


def same_shape(send: Message, recv: Message, what: str) -> None:
    """Reductions need equal counts and datatypes on both sides (mpi4py's `chk_cro_args`)."""
    if send.datatype != recv.datatype and (send.datatype.dtype is None
                                           or send.datatype.dtype != recv.datatype.dtype):
        raise ValueError(f"{what}: mismatch in send and receive MPI datatypes")
    if send.count != recv.count:
        raise ValueError(f"{what}: mismatch in send count {send.count} and receive count {recv.count}")
