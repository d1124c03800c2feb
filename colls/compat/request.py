"""`MPI.Request` (with the lowercase, object-returning forms), `MPI.Prequest` and `MPI.Grequest`,
over colls' work handles (`MPI.Status` is in `status`).

A request holds an operation: a colls `Work` (a posted point-to-point request, an `async_op=True`
collective) or a facade operation with `poll()`/`wait()` (an object receive). `Wait` returns True,
`wait` the received object (None for anything else). A completed request turns null
(`MPI.REQUEST_NULL`, false); a persistent one (`Prequest`) only inactive, until `Free`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from transports.errors import CollectiveTimeout, MessageTruncated

from .datatypes import UNDEFINED
from .errors import ERROR_CLASSES, MPIException
from .handles import HandleTable, NumberedHandle
from .status import ANY_SOURCE, ANY_TAG, SUCCESS, Status

__all__ = ["ANY_SOURCE", "ANY_TAG", "PROC_NULL", "REQUEST_NULL", "SUCCESS", "Grequest", "Prequest",
           "Request", "Status", "truncated"]

PROC_NULL = -1
_POLL_PAUSE_S = 1e-3   # longest sleep between progress passes of Waitany/Waitsome


def truncated(error: MessageTruncated) -> MPIException:
    """MPI's truncation error, as mpi4py raises it (MPI.Exception, error class MPI.ERR_TRUNCATE)."""
    exception = MPIException(ERROR_CLASSES["ERR_TRUNCATE"][0], f"Message truncated: {error}")
    exception.__cause__ = error
    return exception


StatusFields = tuple[int, int, int]
_Some = tuple[list[int] | None, list[Any] | None]
_NULL = object()   # Request(): a null request, as MPI.Request() is in mpi4py


class _Operation:
    """What a request handle refers to; copies of a request (`Request(request)`) share it."""

    __slots__ = ("work", "finish", "fields", "returns_object", "result", "pending", "null", "start",
                 "__weakref__")

    def __init__(self, work: Any, finish: Any, fields: Any, returns_object: bool, null: bool) -> None:
        self.work, self.finish, self.fields, self.returns_object = work, finish, fields, returns_object
        self.result: Any = None
        self.pending = not null and (work is not None or finish is not None)
        self.null = null
        self.start: Callable[[], Request] | None = None   # a persistent request's: posts it again


class Request(NumberedHandle):
    """A nonblocking operation: colls' `Work`, a facade operation with `poll()`, or nothing.

    Args:
        work: a colls `Work` (or one with `poll()`/`wait()`); None with no `finish`: already done
            (an active request, true until waited for); left out: a null request; a Request: a
            copy of that handle.
        finish: runs once with the work's result when it completes (to copy blocks into place).
        status_fields: (source, tag, bytes) for the `Status`, or a callable giving them once done.
        returns_object: whether `wait()` returns the work's result (an object receive).
    """

    _numbers = HandleTable()

    def __new__(cls, *args: Any, **kwargs: Any) -> Request:
        # mpi4py's signature, so a subclass's `__new__(cls, request)` may call `super().__new__(cls,
        # request)`; `__init__` then makes the handle from the same arguments
        return super().__new__(cls)

    def __init__(self, work: Any = _NULL, finish: Callable[[Any], None] | None = None,
                 status_fields: StatusFields | Callable[[], StatusFields] | None = None,
                 returns_object: bool = False) -> None:
        if isinstance(work, Request):
            self._op = work._op
            return
        null = work is _NULL and finish is None and status_fields is None
        self._op = _Operation(None if work is _NULL else work, finish, status_fields, returns_object, null)

    def __bool__(self) -> bool:
        return not self._op.null

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self._op is other._op or (self._op.null and other._op.null)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return id(self._op)

    def __repr__(self) -> str:
        op = self._op
        state = "null" if op.null else ("pending" if op.pending else "complete")
        return f"<colls.compat.MPI.{type(self).__name__} {state}>"

    # -- handles ---------------------------------------------------------------------------------

    def _numbered(self) -> _Operation | None:
        return None if self._op.null else self._op

    @classmethod
    def _from_numbered(cls, op: _Operation | None) -> Request:
        request = cls.__new__(cls)
        request._op = REQUEST_NULL._op if op is None else op
        return request

    # -- one request -----------------------------------------------------------------------------

    @property
    def _active(self) -> bool:
        """Whether a wait has anything to complete (not null; not a persistent one left inactive)."""
        op = self._op
        return not op.null and (op.pending or op.start is None)

    def _poll(self) -> bool:
        """Drive progress once; whether the operation has completed (not yet concluded)."""
        op = self._op
        work = op.work
        if not op.pending or work is None:
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
            except MessageTruncated as error:
                raise truncated(error) from error
            return True
        return False

    def _conclude(self) -> None:
        """Finish the operation (waiting if need be): run `finish`, keep the result."""
        op = self._op
        if op.pending:
            try:
                result = op.work.wait() if op.work is not None else None
            except MessageTruncated as error:
                raise truncated(error) from error
            op.pending = False
            if op.finish is not None:   # once per start
                finish, op.finish = op.finish, None
                finish(result)
            op.result = result if op.returns_object else None

    def _fill(self, status: Status | None) -> None:
        if status is None:
            return
        op = self._op
        if op.fields is None or op.null:
            status._clear()
        else:
            status._fill(*(op.fields() if callable(op.fields) else op.fields))

    def _complete(self, status: Status | None) -> Any:
        """Wait, fill `status`, and retire the request (null; a persistent one inactive)."""
        op = self._op
        if op.null:
            self._fill(status)
            return None
        self._conclude()
        self._fill(status)
        result, op.result = op.result, None
        if op.start is None:
            op.null = True
            self._numbers.forget(op)
        return result

    def Wait(self, status: Status | None = None) -> bool:
        """Block until the operation completes (within its deadline); fills `status` for a receive."""
        self._complete(status)
        return True

    def wait(self, status: Status | None = None) -> Any:
        """As `Wait`; returns the received object (None for anything but an object receive)."""
        return self._complete(status)

    def Test(self, status: Status | None = None) -> bool:
        """Whether the operation has completed (driving progress once); completes it if so."""
        return self._test(status)[0]

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        """(whether the operation has completed, the received object or None)."""
        return self._test(status)

    def _test(self, status: Status | None) -> tuple[bool, Any]:
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
        self._op.null = True
        self._numbers.forget(self._op)

    free = Free

    def Cancel(self) -> None:
        """Ask to cancel: colls cannot withdraw a posted message, so the operation goes on and its
        status says not cancelled (as MPI allows)."""

    cancel = Cancel

    # -- many requests ---------------------------------------------------------------------------

    @staticmethod
    def _statuses(count: int, statuses: Any) -> list[Status | None]:
        """`count` statuses (or Nones) from `statuses`; a list given is extended with new ones."""
        if statuses is None:
            return [None] * count
        if isinstance(statuses, list):
            statuses.extend(Status() for _ in range(len(statuses), count))
        return [statuses[i] if i < len(statuses) else None for i in range(count)]

    @staticmethod
    def _until(found: Callable[[], Any], requests: Sequence[Request]) -> Any:
        """Poll until `found()` gives something other than None; a deadline ends the wait."""
        from colls.communicator import default_timeout

        limit = default_timeout()
        deadline, pause = time.monotonic() + limit, 0.0
        while (result := found()) is None:
            if time.monotonic() > deadline:
                raise CollectiveTimeout(f"Waitany/Waitsome: none of {len(requests)} requests completed "
                                        f"in {limit} s")
            time.sleep(pause)
            pause = min(2 * pause + 1e-5, _POLL_PAUSE_S)
        return result

    @staticmethod
    def Waitall(requests: Sequence[Request], statuses: Any = None) -> bool:
        """Wait for every request, in order; fills `statuses` (a list is extended to one per request)."""
        Request.waitall(requests, statuses)
        return True

    @staticmethod
    def waitall(requests: Sequence[Request], statuses: Any = None) -> list[Any]:
        """As `Waitall`; returns each request's object (None where it has none)."""
        slots = Request._statuses(len(requests), statuses)
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
        slots = Request._statuses(len(requests), statuses)
        return all([request.Get_status(slot) for request, slot in zip(requests, slots, strict=True)])

    get_status_all = Get_status_all

    @staticmethod
    def _first_done(requests: Sequence[Request]) -> int | None:
        """Index of a completed active request (one progress pass each); UNDEFINED if none is
        active; None if none has completed."""
        active = [index for index, request in enumerate(requests) if request._active]
        if not active:
            return UNDEFINED
        return next((index for index in active if requests[index]._poll()), None)

    @staticmethod
    def _any(requests: Sequence[Request], index: int | None, status: Status | None,
             keep: bool = False) -> tuple[int, bool, Any]:
        if index is None:
            return UNDEFINED, False, None
        if index == UNDEFINED:
            if status is not None:
                status._clear()
            return UNDEFINED, True, None
        if keep:
            return index, requests[index].Get_status(status), None
        return index, True, requests[index]._complete(status)

    @staticmethod
    def Waitany(requests: Sequence[Request], status: Status | None = None) -> int:
        """Wait for any active request to complete; its index (MPI.UNDEFINED if none is active)."""
        return Request.waitany(requests, status)[0]

    @staticmethod
    def waitany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, Any]:
        """As `Waitany`; (index, the request's object)."""
        index = Request._until(lambda: Request._first_done(requests), requests)
        index, _, obj = Request._any(requests, index, status)
        return index, obj

    @staticmethod
    def Testany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """(index, True) for a completed request, (MPI.UNDEFINED, True) if none is active, else
        (MPI.UNDEFINED, False)."""
        return Request.testany(requests, status)[:2]

    @staticmethod
    def testany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool, Any]:
        """As `Testany`, with the completed request's object."""
        return Request._any(requests, Request._first_done(requests), status)

    @staticmethod
    def Get_status_any(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """As `Testany`, freeing nothing."""
        return Request._any(requests, Request._first_done(requests), status, keep=True)[:2]

    get_status_any = Get_status_any

    @staticmethod
    def _done(requests: Sequence[Request]) -> list[int] | None:
        """Indices of the completed active requests (one progress pass each); None if none is active."""
        active = [index for index, request in enumerate(requests) if request._active]
        return [index for index in active if requests[index]._poll()] if active else None

    @staticmethod
    def _some(requests: Sequence[Request], indices: list[int] | None, statuses: Any,
              keep: bool = False) -> _Some:
        if indices is None:
            return None, None
        if isinstance(statuses, list):
            del statuses[len(indices):]
        slots = Request._statuses(len(indices), statuses)
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
        def found() -> Any:
            indices = Request._done(requests)
            return _NULL if indices is None else (indices or None)
        indices = Request._until(found, requests)
        return Request._some(requests, None if indices is _NULL else indices, statuses)

    @staticmethod
    def Testsome(requests: Sequence[Request], statuses: Any = None) -> list[int] | None:
        """The indices of the active requests that have completed (None if none is active)."""
        return Request.testsome(requests, statuses)[0]

    @staticmethod
    def testsome(requests: Sequence[Request], statuses: Any = None) -> _Some:
        """As `Testsome`; (indices, their objects), or (None, None)."""
        return Request._some(requests, Request._done(requests), statuses)

    @staticmethod
    def Get_status_some(requests: Sequence[Request], statuses: Any = None) -> list[int] | None:
        """As `Testsome`, freeing nothing."""
        return Request._some(requests, Request._done(requests), statuses, keep=True)[0]

    get_status_some = Get_status_some


class Prequest(Request):
    """A persistent request (`Send_init`, `Recv_init`): `Start` posts its operation again each time;
    once complete it is inactive, not null, until `Free`.

    Args:
        start: posts the operation and returns its one-off Request; a Prequest: a copy of that handle.
    """

    def __init__(self, start: Callable[[], Request] | Request | None = None) -> None:
        if isinstance(start, Request):
            if start._op.start is None and not start._op.null:
                raise TypeError("Prequest: the request is not a persistent one")
            super().__init__(start)
            return
        super().__init__(None if start is not None else _NULL)
        self._op.pending = False
        self._op.start = start

    def Start(self) -> None:
        """Post the operation (the request must be inactive)."""
        op = self._op
        if op.null or op.start is None:
            raise ValueError("Prequest.Start: the request is null (freed)")
        if op.pending:
            raise ValueError("Prequest.Start: the request is still active; wait for it first")
        posted = op.start()._op
        op.work, op.finish, op.fields = posted.work, posted.finish, posted.fields
        op.pending = True

    start = Start

    @staticmethod
    def Startall(requests: Sequence[Prequest]) -> None:
        """Start every request, in order."""
        for request in requests:
            request.Start()

    startall = Startall


class Grequest(Request):
    """A generalized request: only copies of another are refused as mpi4py refuses them;
    `Grequest.Start` is not supported."""

    def __init__(self, request: Any = _NULL) -> None:
        if isinstance(request, Request) and not isinstance(request, Grequest) and not request._op.null:
            raise TypeError("Grequest: the request is not a generalized one")
        super().__init__(request)

    @classmethod
    def Start(cls, *args: Any, **kwargs: Any) -> Grequest:
        """Not supported: generalized requests."""
        raise NotImplementedError("generalized requests (MPI.Grequest.Start) are not supported by the "
                                  "colls mpi4py facade")


REQUEST_NULL = Request()
