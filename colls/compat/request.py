"""`MPI.Status`, `MPI.Request` (with the lowercase, object-returning forms), `MPI.Prequest` and
`MPI.Message`, over colls' work handles.

A request holds an operation: a colls `Work` (a posted point-to-point request, an `async_op=True`
collective) or a facade operation with `poll()`/`wait()` (an object receive). `Wait` returns True,
`wait` the received object (None for anything else). A completed request turns null
(`MPI.REQUEST_NULL`, false); a persistent one (`Prequest`) only inactive, until `Free`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from transports.errors import CollectiveTimeout

from .datatypes import PREDEFINED, UNDEFINED, Datatype

ANY_SOURCE = -2
ANY_TAG = -1
PROC_NULL = -1
SUCCESS = 0
_SOURCE, _TAG, _ERROR, _COUNT, _CANCELLED = range(5)
_POLL_PAUSE_S = 1e-3   # longest sleep between progress passes of Waitany/Waitsome


class Status:
    """What a completed receive got: source, tag, error and size in bytes (`count`).

    Args:
        status: another Status to copy, or None for an empty one (MPI.ANY_SOURCE, MPI.ANY_TAG).

    Raises:
        TypeError: `status` is not a Status.
    """

    def __init__(self, status: Status | None = None) -> None:
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"Status: expecting a Status to copy, got {type(status).__name__}")
        self._fields = np.array([ANY_SOURCE, ANY_TAG, SUCCESS, 0, 0], np.int64) if status is None \
            else status._fields.copy()

    def _field(index: int, doc: str, kind: type = int):   # noqa: N805 - a property factory
        def get(self: Status) -> Any:
            return kind(self._fields[index])

        def put(self: Status, value: Any) -> None:
            self._fields[index] = int(value)
        return property(get, put, doc=doc)

    source = _field(_SOURCE, "The rank the message came from.")
    tag = _field(_TAG, "The message's tag.")
    error = _field(_ERROR, "The error code (MPI.SUCCESS: errors are raised as exceptions).")
    count = _field(_COUNT, "Bytes received.")
    cancelled = _field(_CANCELLED, "Whether the request was cancelled.", bool)
    del _field

    def Get_source(self) -> int:
        """The rank the message came from."""
        return self.source

    def Get_tag(self) -> int:
        """The message's tag."""
        return self.tag

    def Get_error(self) -> int:
        """The error code: MPI.SUCCESS unless set."""
        return self.error

    def Get_count(self, datatype: Datatype = PREDEFINED["BYTE"]) -> int:
        """Elements of `datatype` received (MPI.UNDEFINED if the bytes do not divide evenly)."""
        size = datatype.Get_size()
        if size == 0:
            return 0 if self.count == 0 else UNDEFINED
        return self.count // size if self.count % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Set_elements(self, datatype: Datatype, count: int) -> None:
        """Record that `count` elements of `datatype` were received."""
        self.count = int(count) * datatype.Get_size()

    def Is_cancelled(self) -> bool:
        """Whether the request was cancelled (never, unless set)."""
        return self.cancelled

    def Set_cancelled(self, flag: bool) -> None:
        """Set the cancelled flag."""
        self.cancelled = bool(flag)

    def Set_source(self, source: int) -> None:
        """Set the source field."""
        self.source = source

    def Set_tag(self, tag: int) -> None:
        """Set the tag field."""
        self.tag = tag

    def Set_error(self, error: int) -> None:
        """Set the error field."""
        self.error = error

    def tomemory(self) -> memoryview:
        """The status's fields (source, tag, error, count, cancelled) as writable memory."""
        return memoryview(self._fields)

    def _fill(self, source: int, tag: int, nbytes: int) -> None:
        self._fields[:] = (source, tag, SUCCESS, nbytes, 0)

    def _clear(self) -> None:
        self._fill(ANY_SOURCE, ANY_TAG, 0)


StatusFields = tuple[int, int, int]
_Some = tuple[list[int] | None, list[Any] | None]
_NULL = object()   # Request(): a null request, as MPI.Request() is in mpi4py


class Request:
    """A nonblocking operation: colls' `Work`, a facade operation with `poll()`, or nothing.

    Args:
        work: a colls `Work` (or one with `poll()`/`wait()`); None with no `finish`: already done
            (an active request, true until waited for); left out: a null request.
        finish: runs once with the work's result when it completes (to copy blocks into place).
        status_fields: (source, tag, bytes) for the `Status`, or a callable giving them once done.
        returns_object: whether `wait()` returns the work's result (an object receive).

    `MPI.Request()` with no argument is a null request, as in mpi4py; `Request(request)` copies.
    """

    def __init__(self, work: Any = _NULL, finish: Callable[[Any], None] | None = None,
                 status_fields: StatusFields | Callable[[], StatusFields] | None = None,
                 returns_object: bool = False) -> None:
        if isinstance(work, Request):
            self.__dict__.update(work.__dict__)
            return
        self._null = work is _NULL and finish is None and status_fields is None
        work = None if work is _NULL else work
        self._work = work
        self._finish = finish
        self._status_fields = status_fields
        self._returns_object = returns_object
        self._result: Any = None
        self._pending = work is not None or finish is not None

    def __bool__(self) -> bool:
        return not self._null

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        if self._null or other._null:
            return self._null and other._null
        return self.__dict__ is other.__dict__ or self._work is other._work is not None

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        state = "null" if self._null else ("pending" if self._pending else "complete")
        return f"<colls.compat.MPI.{type(self).__name__} {state}>"

    # -- one request -----------------------------------------------------------------------------

    @property
    def _active(self) -> bool:
        """Whether a wait on this request has anything to complete (not null, not inactive)."""
        return not self._null and (self._pending or not self._persistent_inactive())

    def _persistent_inactive(self) -> bool:
        return False

    def _poll(self) -> bool:
        """Drive progress once; whether the operation has completed (not yet concluded)."""
        if not self._pending:
            return True
        work = self._work
        if work is None:
            return True
        if hasattr(work, "poll"):
            return work.poll()
        if work.is_completed():
            return True
        if hasattr(work, "_request"):   # a point-to-point RequestWork: one progress pass
            try:
                work.wait(timeout=0)
            except CollectiveTimeout:
                return False
            return True
        return False

    def _conclude(self) -> None:
        """Finish a completed (or to be waited for) operation: run `finish`, keep the result."""
        if self._pending:
            result = self._work.wait() if self._work is not None else None
            self._pending = False
            if self._finish is not None:
                finish, self._finish = self._finish, None
                finish(result)
            self._result = result if self._returns_object else None

    def _fill(self, status: Status | None) -> None:
        if status is None:
            return
        fields = self._status_fields
        if fields is None or self._null:
            status._clear()
        else:
            status._fill(*(fields() if callable(fields) else fields))

    def _retire(self) -> Any:
        """After completion: a plain request turns null; returns the result once."""
        result, self._result = self._result, None
        self._null = True
        return result

    def _complete(self, status: Status | None) -> Any:
        if self._null:
            self._fill(status)
            return None
        self._conclude()
        self._fill(status)
        return self._retire()

    def Wait(self, status: Status | None = None) -> bool:
        """Block until the operation completes (within its deadline); fills `status` for a receive."""
        self._complete(status)
        return True

    def wait(self, status: Status | None = None) -> Any:
        """As `Wait`; returns the received object (None for anything but an object receive)."""
        return self._complete(status)

    def Test(self, status: Status | None = None) -> bool:
        """Whether the operation has completed (driving progress once); completes it if so."""
        return self.test(status)[0]

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        """(whether the operation has completed, the received object or None)."""
        if self._active and not self._poll():
            return False, None
        return True, self._complete(status)

    def Get_status(self, status: Status | None = None) -> bool:
        """Whether the operation has completed, without freeing the request."""
        done = not self._active or self._poll()
        if done:
            if self._active:
                self._conclude()
            self._fill(status)
        return done

    get_status = Get_status

    def Free(self) -> None:
        """Let the operation finish on its own; the request turns null."""
        self._null = True

    free = Free

    def Cancel(self) -> None:
        """Ask to cancel: colls cannot withdraw a posted message, so the operation goes on and its
        status says not cancelled (as MPI allows)."""

    cancel = Cancel

    # -- many requests ---------------------------------------------------------------------------

    @staticmethod
    def _statuses(requests: Sequence[Request], statuses: Any) -> list[Status | None]:
        """One status (or None) per request; a list given is extended with new Status objects."""
        if statuses is None:
            return [None] * len(requests)
        if isinstance(statuses, list):
            statuses.extend(Status() for _ in range(len(statuses), len(requests)))
        return [statuses[i] if i < len(statuses) else None for i in range(len(requests))]

    @staticmethod
    def _until(done: Callable[[], bool], requests: Sequence[Request]) -> None:
        """Poll until `done()`; each request's own deadline ends a wait that cannot complete."""
        from colls.communicator import default_timeout

        deadline, pause = time.monotonic() + default_timeout(), 0.0
        while not done():
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"Waitany/Waitsome: none of {len(requests)} requests completed "
                                        f"in {default_timeout()} s")
            time.sleep(pause)
            pause = min(2 * pause + 1e-5, _POLL_PAUSE_S)

    @staticmethod
    def Waitall(requests: Sequence[Request], statuses: Any = None) -> bool:
        """Wait for every request, in order; fills `statuses` (a list is extended to one per request)."""
        Request.waitall(requests, statuses)
        return True

    @staticmethod
    def waitall(requests: Sequence[Request], statuses: Any = None) -> list[Any]:
        """As `Waitall`; returns each request's object (None where it has none)."""
        slots = Request._statuses(requests, statuses)
        return [request._complete(slot) for request, slot in zip(requests, slots, strict=True)]

    @staticmethod
    def Testall(requests: Sequence[Request], statuses: Any = None) -> bool:
        """Whether every request has completed; if so completes them all (filling `statuses`)."""
        return Request.testall(requests, statuses)[0]

    @staticmethod
    def testall(requests: Sequence[Request], statuses: Any = None) -> tuple[bool, list[Any] | None]:
        """(whether all completed, their objects or None)."""
        if not all([not request._active or request._poll() for request in requests]):
            return False, None
        return True, Request.waitall(requests, statuses)

    @staticmethod
    def Get_status_all(requests: Sequence[Request], statuses: Any = None) -> bool:
        """Whether every request has completed, freeing none."""
        slots = Request._statuses(requests, statuses)
        flags = [request.Get_status(slot) for request, slot in zip(requests, slots, strict=True)]
        return all(flags)

    get_status_all = Get_status_all

    @staticmethod
    def _first_done(requests: Sequence[Request]) -> int | None:
        """Index of a completed active request (one progress pass each), UNDEFINED if none is active."""
        active = [index for index, request in enumerate(requests) if request._active]
        if not active:
            return UNDEFINED
        for index in active:
            if requests[index]._poll():
                return index
        return None

    @staticmethod
    def Waitany(requests: Sequence[Request], status: Status | None = None) -> int:
        """Wait for any active request to complete; its index (MPI.UNDEFINED if none is active)."""
        return Request.waitany(requests, status)[0]

    @staticmethod
    def waitany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, Any]:
        """As `Waitany`; (index, the request's object)."""
        found: list[int | None] = [None]

        def done() -> bool:
            found[0] = Request._first_done(requests)
            return found[0] is not None
        Request._until(done, requests)
        index = found[0]
        if index == UNDEFINED:
            if status is not None:
                status._clear()
            return UNDEFINED, None
        return index, requests[index]._complete(status)

    @staticmethod
    def Testany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """(index, True) for a completed request, (MPI.UNDEFINED, True) if none is active, else
        (MPI.UNDEFINED, False)."""
        index, flag, _ = Request.testany(requests, status)
        return index, flag

    @staticmethod
    def testany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool, Any]:
        """As `Testany`, with the completed request's object."""
        index = Request._first_done(requests)
        if index is None:
            return UNDEFINED, False, None
        if index == UNDEFINED:
            if status is not None:
                status._clear()
            return UNDEFINED, True, None
        return index, True, requests[index]._complete(status)

    @staticmethod
    def Get_status_any(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """As `Testany`, freeing nothing."""
        index = Request._first_done(requests)
        if index is None:
            return UNDEFINED, False
        if index == UNDEFINED:
            if status is not None:
                status._clear()
            return UNDEFINED, True
        requests[index].Get_status(status)
        return index, True

    get_status_any = Get_status_any

    @staticmethod
    def _done_indices(requests: Sequence[Request]) -> list[int] | None:
        active = [index for index, request in enumerate(requests) if request._active]
        if not active:
            return None
        return [index for index in active if requests[index]._poll()]

    @staticmethod
    def _some(requests: Sequence[Request], indices: list[int] | None, statuses: Any,
              keep: bool = False) -> tuple[list[int] | None, list[Any] | None]:
        if indices is None:
            return None, None
        if isinstance(statuses, list):
            statuses[len(indices):] = []
            statuses.extend(Status() for _ in range(len(statuses), len(indices)))
        slots = [statuses[i] if statuses is not None and i < len(statuses) else None
                 for i in range(len(indices))]
        if keep:
            return indices, [requests[i].Get_status(slot) for i, slot in zip(indices, slots, strict=True)]
        return indices, [requests[i]._complete(slot) for i, slot in zip(indices, slots, strict=True)]

    @staticmethod
    def Waitsome(requests: Sequence[Request], statuses: Any = None) -> list[int] | None:
        """Wait until at least one active request completes; the indices of all that have (None if
        none is active)."""
        return Request.waitsome(requests, statuses)[0]

    @staticmethod
    def waitsome(requests: Sequence[Request], statuses: Any = None) -> _Some:
        """As `Waitsome`; (indices, their objects), or (None, None)."""
        found: list[list[int] | None] = [None]

        def done() -> bool:
            found[0] = Request._done_indices(requests)
            return found[0] is None or bool(found[0])
        Request._until(done, requests)
        return Request._some(requests, found[0], statuses)

    @staticmethod
    def Testsome(requests: Sequence[Request], statuses: Any = None) -> list[int] | None:
        """The indices of the active requests that have completed (None if none is active)."""
        return Request.testsome(requests, statuses)[0]

    @staticmethod
    def testsome(requests: Sequence[Request], statuses: Any = None) -> _Some:
        """As `Testsome`; (indices, their objects), or (None, None)."""
        return Request._some(requests, Request._done_indices(requests), statuses)

    @staticmethod
    def Get_status_some(requests: Sequence[Request], statuses: Any = None) -> list[int] | None:
        """As `Testsome`, freeing nothing."""
        return Request._some(requests, Request._done_indices(requests), statuses, keep=True)[0]

    get_status_some = Get_status_some


class Prequest(Request):
    """A persistent request (`Send_init`, `Recv_init`): `Start` posts its operation again each time.

    Args:
        start: posts the operation; returns its (one-off) Request.
    """

    def __init__(self, start: Callable[[], Request] | None = None) -> None:
        super().__init__(None)
        self._null = start is None
        self._start = start
        self._pending = False

    def _persistent_inactive(self) -> bool:
        return True

    def _retire(self) -> Any:
        result, self._result = self._result, None   # inactive, not null: Start may post it again
        return result

    def Start(self) -> None:
        """Post the operation (the request must be inactive)."""
        if self._null or self._start is None:
            raise ValueError("Prequest.Start: the request is null (freed)")
        if self._pending:
            raise ValueError("Prequest.Start: the request is still active; wait for it first")
        posted = self._start()
        self._work, self._finish, self._status_fields = posted._work, posted._finish, posted._status_fields
        self._pending = True

    start = Start

    @staticmethod
    def Startall(requests: Sequence[Prequest]) -> None:
        """Start every request, in order."""
        for request in requests:
            request.Start()

    startall = Startall


REQUEST_NULL = Request()


class Message:
    """A message claimed by `Mprobe`/`Improbe`: only `Recv`/`recv` of this object receives it.

    Args:
        comm: the facade communicator it was claimed on; or a Message to copy; None:
            MPI.MESSAGE_NULL.
        envelope: the transport's `Envelope` (source, tag, nbytes); None with a communicator:
            a message from MPI.PROC_NULL (MPI.MESSAGE_NO_PROC), which receives nothing.
    """

    def __init__(self, comm: Any = None, envelope: Any = None) -> None:
        if isinstance(comm, Message):
            comm, envelope = comm._comm, comm._envelope
        self._comm = comm
        self._envelope = envelope

    def __bool__(self) -> bool:
        return self._comm is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if self._comm is None or other._comm is None:
            return self._comm is other._comm
        return self._envelope is other._envelope   # None for both: MESSAGE_NO_PROC

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return id(self._envelope)

    def _take(self) -> tuple[Any, Any]:
        if self._comm is None:
            raise ValueError("Message: MPI.MESSAGE_NULL cannot be received")
        comm, envelope = self._comm, self._envelope
        self._comm = self._envelope = None   # received once: now MESSAGE_NULL
        return comm, envelope

    def Recv(self, buf: Any, status: Status | None = None) -> None:
        """Receive the message into `buf` (larger than the message is fine)."""
        self.Irecv(buf).Wait(status)

    def Irecv(self, buf: Any) -> Request:
        """Nonblocking Recv."""
        comm, envelope = self._take()
        if envelope is None:
            return Request(None, status_fields=(PROC_NULL, ANY_TAG, 0))
        return comm._mrecv_buffer(buf, envelope)

    def recv(self, status: Status | None = None) -> Any:
        """Receive the message's object."""
        return self.irecv().wait(status)

    def irecv(self) -> Request:
        """Nonblocking recv: the request's `wait()` returns the object."""
        comm, envelope = self._take()
        if envelope is None:
            return Request(None, status_fields=(PROC_NULL, ANY_TAG, 0), returns_object=True)
        return comm._mrecv_object(envelope)

    @classmethod
    def Probe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Status | None = None) -> Message:
        """`comm.Mprobe(source, tag, status)`."""
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Status | None = None) -> Message | None:
        """`comm.Improbe(source, tag, status)`."""
        return comm.Improbe(source, tag, status)

    probe, iprobe = Probe, Iprobe

    def free(self) -> None:
        """Forget the message (it stays claimed)."""
        self._comm = self._envelope = None

    Free = free


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message(PROC_NULL)   # from MPI.PROC_NULL: Mprobe returns a copy; receiving it gets nothing
