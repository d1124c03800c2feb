"""mpi4py's lowercase, pickle-based methods of `MPI.Comm`, and `MPI.pickle`.

Point to point, an object travels as mpi4py sends it, one message holding its pickle (so an
`Isend` of a pickle is received by `recv` and the other way round), unless it holds large buffers
(numpy arrays): those travel out of band, as messages of their own on colls' own tags
(`colls.compat.frames`). `irecv` posts a real receive, as mpi4py does; `recv` claims the message
with a matched probe (so its size needs no guess). The collectives are colls' own object
collectives (`colls.objects`) with `MPI.pickle` as the pickler.

Unpickling runs code named by the sender, as in mpi4py: use among ranks you trust.
"""

from __future__ import annotations

import operator
import pickle as _stdlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from transports.base import RESERVED_TAG_BASE

from . import ops
from .frames import MARKER, _comm_lock_table, _lock, _ObjectReceive, _receive_space, _Sends, frames
from .memory import buffer
from .request import ANY_SOURCE, ANY_TAG, PROC_NULL, Request, Status

__all__ = ["MARKER", "ObjectMethods", "Pickle", "_comm_lock_table", "_fold", "_lock", "frames", "pickle"]


class Pickle:
    """How the lowercase methods turn objects into bytes (mpi4py's `MPI.Pickle`).

    Args:
        dumps: `dumps(obj, protocol)` -> bytes (default `pickle.dumps`).
        loads: `loads(data)` -> object (default `pickle.loads`).
        protocol: the protocol passed to `dumps` (default: the highest, for `pickle.dumps`).
        threshold: buffers of at least this many bytes travel out of band (default 256 KiB).
    """

    def __init__(self, dumps: Callable[..., bytes] | None = None, loads: Callable[..., Any] | None = None,
                 protocol: int | None = None, threshold: int | None = None) -> None:
        self._dumps = _stdlib.dumps if dumps is None else dumps
        self._loads = _stdlib.loads if loads is None else loads
        self.PROTOCOL = protocol
        self.THRESHOLD = threshold

    @property
    def PROTOCOL(self) -> int | None:   # noqa: N802 - mpi4py's name
        """The pickle protocol (None: the `dumps` function's default)."""
        return self._protocol

    @PROTOCOL.setter
    def PROTOCOL(self, protocol: int | None) -> None:   # noqa: N802
        if protocol is None and self._dumps is _stdlib.dumps:
            protocol = _stdlib.HIGHEST_PROTOCOL
        self._protocol = protocol

    @property
    def THRESHOLD(self) -> int:   # noqa: N802 - mpi4py's name
        """Buffers of at least this many bytes travel out of band."""
        return self._threshold

    @THRESHOLD.setter
    def THRESHOLD(self, threshold: int | None) -> None:   # noqa: N802
        self._threshold = (1 << 18) if threshold is None else int(threshold)

    def dumps(self, obj: Any) -> bytes:
        """Serialize `obj` to one pickle stream."""
        return self._dumps(obj) if self._protocol is None else self._dumps(obj, self._protocol)

    def loads(self, data: Any) -> Any:
        """The object of a pickle stream."""
        return self._loads(data)

    def dumps_oob(self, obj: Any) -> tuple[bytes, list[Any]]:
        """(pickle stream, out-of-band buffers): protocol 5 where `dumps` is the standard library's;
        a custom `dumps` gives its stream and no buffers."""
        if self._dumps is not _stdlib.dumps:
            return self.dumps(obj), []
        buffers: list[Any] = []
        threshold = self._threshold

        def out_of_band(pickled: _stdlib.PickleBuffer) -> bool:
            if pickled.raw().nbytes < threshold:
                return True
            buffers.append(buffer(pickled.raw()))   # MPI.buffer, as mpi4py gives
            return False
        return _stdlib.dumps(obj, max(self._protocol or 5, 5), buffer_callback=out_of_band), buffers

    def loads_oob(self, data: Any, buffers: Sequence[Any]) -> Any:
        """The object of a pickle stream and its out-of-band buffers."""
        return self._loads(data, buffers=buffers)


pickle = Pickle()


def _fold(op: Any, values: Sequence[Any]) -> Any:
    """values[0] op values[1] op ... in rank order, with the Python meaning mpi4py gives objects."""
    combine = _PYTHON_OPS.get(id(op))
    if combine is None:
        combine = op if callable(op) else None
    if combine is None:
        raise TypeError(f"reduction: expecting an MPI.Op or a callable, got {op!r}")
    result = values[0]
    for value in values[1:]:
        result = combine(result, value)
    return result


def _maxloc(x: Any, y: Any) -> Any:
    (u, i), (v, j) = x, y
    return (u, i) if u > v else (v, j) if v > u else (u, min(i, j))


def _minloc(x: Any, y: Any) -> Any:
    (u, i), (v, j) = x, y
    return (u, i) if u < v else (v, j) if v < u else (u, min(i, j))


_PYTHON_OPS: dict[int, Callable[[Any, Any], Any]] = {
    id(ops.SUM): operator.add, id(ops.PROD): operator.mul, id(ops.MAX): max, id(ops.MIN): min,
    id(ops.LAND): lambda x, y: x and y, id(ops.LOR): lambda x, y: x or y,
    id(ops.LXOR): lambda x, y: bool(x) != bool(y), id(ops.BAND): operator.and_,
    id(ops.BOR): operator.or_, id(ops.BXOR): operator.xor, id(ops.MAXLOC): _maxloc,
    id(ops.MINLOC): _minloc, id(ops.REPLACE): lambda x, y: y, id(ops.NO_OP): lambda x, y: x,
}


class ObjectMethods:
    """The lowercase methods of `Comm` (a mixin: `self._comm` is the colls `Communicator`)."""

    def _pickler(self) -> Pickle:
        """How this communicator's objects become bytes: `MPI.pickle`."""
        return pickle

    # -- point to point ----------------------------------------------------------------------------

    def _post_object(self, obj: Any, dest: int, tag: int, synchronous: bool = False) -> Request:
        """Send `obj`'s frames: the first on `tag` (synchronous: complete once matched), the
        buffers after it on `tag + RESERVED_TAG_BASE`, which no user receive matches."""
        if dest == PROC_NULL:
            return Request(None)
        dest, tag = int(dest), int(tag)
        parts = frames(obj, self._pickler())
        send = self._comm.send
        with _lock(self, "send"):   # one object's buffers follow its first frame at (dest, tag)
            works = [send(parts[0], dest, tag, async_op=True, synchronous=synchronous)]
            works += [send(part, dest, tag + RESERVED_TAG_BASE, async_op=True) for part in parts[1:]]
        return Request(works[0] if len(works) == 1 else _Sends(self, works))

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send a picklable object to `dest` (blocking until its buffers may be reused)."""
        self._post_object(obj, dest, tag).Wait()

    bsend = send

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Synchronous send: returns once `dest` has matched the object to a receive."""
        self._post_object(obj, dest, tag, synchronous=True).Wait()

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking send of an object."""
        return self._post_object(obj, dest, tag)

    ibsend = isend

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Nonblocking synchronous send: complete once `dest` has matched the object to a receive."""
        return self._post_object(obj, dest, tag, synchronous=True)

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> Any:
        """Receive an object from `source` with `tag` (wildcards allowed); MPI.PROC_NULL gives None.

        `buf` is deprecated (mpi4py warns too) and not needed: the message is probed, so it may be
        of any size.
        """
        if buf is not None:
            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=2)
        if source == PROC_NULL:
            return self._object_request(None).wait(status)
        return self._object_request(_ObjectReceive(self, int(source), int(tag))).wait(status)

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Nonblocking receive of an object, posted now into `buf` (or `buf` bytes if an int, or
        mpi4py.rc.irecv_bufsz bytes, 32768 by default): the request's `wait()` returns the object;
        a larger pickle raises MPI.Exception (MPI.ERR_TRUNCATE)."""
        if source == PROC_NULL:
            return self._object_request(None)
        receive = _ObjectReceive(self, int(source), int(tag))
        receive.post(_receive_space(buf))
        return self._object_request(receive)

    def _mrecv_object(self, envelope: Any) -> Request:
        receive = _ObjectReceive(self, envelope.source, envelope.tag)
        receive.claim(envelope)
        return self._object_request(receive)

    @staticmethod
    def _object_request(receive: _ObjectReceive | None) -> Request:
        if receive is None:   # from MPI.PROC_NULL
            return Request(None, status_fields=(PROC_NULL, ANY_TAG, 0), returns_object=True)
        return Request(receive, status_fields=lambda: receive.fields, returns_object=True)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> Any:
        """Send `sendobj` to `dest` and receive an object from `source`; returns the one received."""
        send = self._post_object(sendobj, dest, sendtag)
        received = self.recv(None, source, recvtag, status)
        send.Wait()
        return received

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Block until a message from `source` with `tag` can be received; True."""
        return self.Probe(source, tag, status)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Whether a message from `source` with `tag` can be received now."""
        return self.Iprobe(source, tag, status)

    def mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:
        """Claim the next message from `source` with `tag`; its `recv()` gives the object."""
        return self.Mprobe(source, tag, status)

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Status | None = None) -> Any:
        """As `mprobe`, without blocking: None if no message is there yet."""
        return self.Improbe(source, tag, status)

    # -- collectives -------------------------------------------------------------------------------

    def barrier(self) -> None:
        """Wait until every rank has entered the barrier."""
        self._comm.barrier()

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """The root's object on every rank."""
        with _lock(self, "bcast"):
            return self._comm.broadcast_object(obj, self._root(root), pickler=self._pickler())

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        """Every rank's object, in rank order, on the root (None elsewhere)."""
        with _lock(self, "gather"):
            return self._comm.gather_object(sendobj, self._root(root), pickler=self._pickler())

    def scatter(self, sendobj: Sequence[Any] | None, root: int = 0) -> Any:
        """Item i of the root's sequence on rank i."""
        with _lock(self, "scatter"):
            return self._comm.scatter_object(sendobj, self._root(root), pickler=self._pickler())

    def allgather(self, sendobj: Any) -> list[Any]:
        """Every rank's object, in rank order, on every rank."""
        with _lock(self, "allgather"):
            return self._comm.all_gather_object(sendobj, pickler=self._pickler())

    def alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """Item i of every rank's sequence to rank i."""
        with _lock(self, "alltoall"):
            return self._comm.all_to_all_object(sendobj, pickler=self._pickler())

    def reduce(self, sendobj: Any, op: Any = ops.SUM, root: int = 0) -> Any:
        """The objects of every rank combined by `op` in rank order, on the root (None elsewhere)."""
        values = self.gather(sendobj, root)
        return None if values is None else _fold(op, values)

    def allreduce(self, sendobj: Any, op: Any = ops.SUM) -> Any:
        """The objects of every rank combined by `op` in rank order, on every rank."""
        return _fold(op, self.allgather(sendobj))

    def scan(self, sendobj: Any, op: Any = ops.SUM) -> Any:
        """Rank i gets the objects of ranks 0..i combined by `op`."""
        return _fold(op, self.allgather(sendobj)[:self._comm.rank + 1])

    def exscan(self, sendobj: Any, op: Any = ops.SUM) -> Any:
        """Rank i gets the objects of ranks 0..i-1 combined by `op` (None on rank 0)."""
        values = self.allgather(sendobj)[:self._comm.rank]
        return _fold(op, values) if values else None

    def _root(self, root: int) -> int:
        size = self._comm.size
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
            raise _root_error(root, size)
        return int(root)


def _root_error(root: object, size: int) -> Exception:
    from .comm import MPIException

    class RootError(MPIException):
        """MPI_ERR_ROOT, with mpi4py's accessors of the error class."""

        error_code = ERR_ROOT

        def Get_error_code(self) -> int:   # noqa: N802 - mpi4py's name
            return ERR_ROOT

        Get_error_class = Get_error_code

    return RootError(f"MPI_ERR_ROOT: invalid root {root!r} for a communicator of {size} ranks")


ERR_ROOT = 7   # MPICH's MPI_ERR_ROOT
