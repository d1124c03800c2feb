"""Buffer specifications as mpi4py accepts them, turned into views of the caller's memory.

`buf`, `[buf, MPI.DOUBLE]`, `[buf, count, MPI.DOUBLE]`, `[buf, (count, displ), MPI.DOUBLE]`,
`[buf, count, displ, MPI.DOUBLE]` and, for the vector collectives, `[buf, (counts, displs), type]`.
`buf` is anything with the buffer protocol (numpy arrays, `array.array`, `bytearray`) or `__dlpack__`
(CPU). Nothing is copied: a `Message` holds a byte view of the buffer, so colls writes straight into
the caller's memory, as MPI does. Like mpi4py's `message_simple`/`message_vector` (msgbuffer.pxi),
counts are inferred from the buffer's length when omitted.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from . import dlpack
from .datatypes import Datatype, for_dtype, lookup


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
        raise NotImplementedError("device (GPU) buffers (__cuda_array_interface__) are not supported by "
                                  "the colls mpi4py facade: pass host memory")
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
        raise BufferError("message: the buffer is not C-contiguous")
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
    `displs` (per rank) for a vector one. Offsets and counts are in elements of `datatype`.
    """

    raw: np.ndarray
    datatype: Datatype
    count: int = 0
    displ: int = 0
    counts: tuple[int, ...] = ()
    displs: tuple[int, ...] = ()

    def received(self) -> None:
        """Call once a receive into `data()` has completed: a no-op for a contiguous buffer (the
        bytes landed in the caller's memory); where the message's datatype is not contiguous, this
        is where the landing buffer is unpacked into it."""

    def span(self, start: int, count: int) -> np.ndarray:
        """Bytes of `count` elements from element `start`, checked against the buffer's end."""
        extent = self.datatype.extent
        end = (start + count) * extent
        if count and end > self.raw.size:
            raise ValueError(f"message: {count} elements of {self.datatype.Get_name()} from element "
                             f"{start} need {end} bytes; the buffer has {self.raw.size}")
        return self.raw[start * extent:end]

    def data(self, blocks: int = 1) -> np.ndarray:
        """The bytes of `blocks` consecutive blocks of `count` elements, from `displ`."""
        return self.span(self.displ, self.count * blocks)

    def typed(self, blocks: int = 1) -> np.ndarray:
        """`data(blocks)` as elements of the datatype (for reductions)."""
        return self.data(blocks).view(self.datatype.dtype)

    def block(self, rank: int) -> np.ndarray:
        """Bytes of rank `rank`'s block: block `rank` of a simple message, or its (count, displ)."""
        if self.counts:
            return self.span(self.displs[rank], self.counts[rank])
        return self.span(self.displ + rank * self.count, self.count)


def _datatype(given: object, implied: Datatype | None) -> Datatype:
    datatype = lookup(given) if given is not None else implied
    if datatype is None:
        raise ValueError("message: cannot infer the datatype; pass [buf, MPI.<TYPE>]")
    if not datatype:
        raise ValueError("message: the datatype is MPI.DATATYPE_NULL")
    return datatype


def _elements(raw: np.ndarray, datatype: Datatype, skip: int = 0) -> int:
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
    if count is None:
        total = _elements(raw, datatype, displ)
        if blocks > 1 and total % blocks:
            raise ValueError(f"message: cannot infer count, number of entries {total} is not a multiple "
                             f"of required number of blocks {blocks}")
        count = total // max(blocks, 1)
    count = operator.index(count)
    if count < 0:
        raise ValueError(f"message: negative count {count}")
    message = Message(raw, datatype, count, displ)
    message.data(max(blocks, 1))   # bounds check now, before any rank starts moving data
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
    message = Message(raw, datatype, counts=tuple(counts), displs=tuple(displs))
    for rank in range(blocks):
        message.block(rank)   # bounds check
    return message


def same_shape(send: Message, recv: Message, what: str) -> None:
    """Reductions need equal counts and datatypes on both sides (mpi4py's `chk_cro_args`)."""
    if send.datatype is not recv.datatype and send.datatype.dtype != recv.datatype.dtype:
        raise ValueError(f"{what}: mismatch in send and receive MPI datatypes")
    if send.count != recv.count:
        raise ValueError(f"{what}: mismatch in send count {send.count} and receive count {recv.count}")
