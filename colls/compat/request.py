"""`MPI.Request` over colls' work handles, and `MPI.Status` for receives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transports.errors import CollectiveTimeout

from .datatypes import PREDEFINED, UNDEFINED, Datatype

ANY_SOURCE = -2
ANY_TAG = -1
PROC_NULL = -1
SUCCESS = 0


class Status:
    """What a completed receive got: source, tag and size in bytes."""

    def __init__(self) -> None:
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        self.error = SUCCESS
        self.nbytes = 0

    def Get_source(self) -> int:
        """The rank the message came from."""
        return self.source

    def Get_tag(self) -> int:
        """The message's tag."""
        return self.tag

    def Get_error(self) -> int:
        """MPI.SUCCESS: errors are raised as exceptions instead."""
        return self.error

    def Get_count(self, datatype: Datatype = PREDEFINED["BYTE"]) -> int:
        """Elements of `datatype` received (MPI.UNDEFINED if the bytes do not divide evenly)."""
        size = datatype.Get_size()
        if size == 0:
            return 0 if self.nbytes == 0 else UNDEFINED
        return self.nbytes // size if self.nbytes % size == 0 else UNDEFINED

    Get_elements = Get_count

    def Is_cancelled(self) -> bool:
        """Always false: requests cannot be cancelled."""
        return False

    def Set_source(self, source: int) -> None:
        """Set the source field."""
        self.source = source

    def Set_tag(self, tag: int) -> None:
        """Set the tag field."""
        self.tag = tag

    def Set_error(self, error: int) -> None:
        """Set the error field."""
        self.error = error

    def _fill(self, source: int, tag: int, nbytes: int) -> None:
        self.source, self.tag, self.nbytes = source, tag, nbytes


class Request:
    """A nonblocking operation: colls' `Work` (or nothing, for one that finished at once).

    `finish` runs once after the work completes (for example, to copy padded blocks into place);
    `status_fields` = (source, tag, bytes) describe a receive for the `Status`.
    """

    def __init__(self, work: Any = None, finish: Callable[[Any], None] | None = None,
                 status_fields: tuple[int, int, int] | None = None) -> None:
        self._work = work
        self._finish = finish
        self._status_fields = status_fields
        self._complete = work is None and finish is None
        self._active = True

    def __bool__(self) -> bool:
        return self._active

    def __repr__(self) -> str:
        state = "null" if not self._active else ("complete" if self._complete else "pending")
        return f"<colls.compat.MPI.Request {state}>"

    def _conclude(self, result: Any) -> None:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish(result)
        self._complete = True

    def Wait(self, status: Status | None = None) -> bool:
        """Block until the operation completes; fills `status` for a receive."""
        if self._active and not self._complete:
            result = self._work.wait() if self._work is not None else None
            self._conclude(result)
        self._fill(status)
        self._active = False
        return True

    def Test(self, status: Status | None = None) -> bool:
        """Whether the operation has completed (driving point-to-point progress once)."""
        if not self._active:
            self._fill(status)
            return True
        if not self._complete:
            if not self._poll():
                return False
            self._conclude(self._work.wait())
        self._fill(status)
        self._active = False
        return True

    def _poll(self) -> bool:
        work = self._work
        if work is None or work.is_completed():
            return True
        if hasattr(work, "_request"):   # a point-to-point RequestWork: one progress pass
            try:
                work.wait(timeout=0)
            except CollectiveTimeout:
                return False
            return True
        return False

    def _fill(self, status: Status | None) -> None:
        if status is not None and self._status_fields is not None:
            status._fill(*self._status_fields)

    def Get_status(self, status: Status | None = None) -> bool:
        """Whether the operation has completed, without freeing the request."""
        done = (not self._active) or self._complete or self._poll()
        if done:
            self._fill(status)
        return done

    def Free(self) -> None:
        """Let the operation finish on its own; the request is no longer usable."""
        self._active = False

    def Cancel(self) -> None:
        """Not supported: colls cannot withdraw a posted message."""
        raise NotImplementedError("Request.Cancel is not supported by the colls mpi4py facade")

    @staticmethod
    def Waitall(requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        """Wait for every request, in order; fills `statuses` (one per request) if given."""
        for index, request in enumerate(requests):
            request.Wait(statuses[index] if statuses is not None and index < len(statuses) else None)
        return True

    @staticmethod
    def Testall(requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        """Whether every request has completed (completing those that have)."""
        return all([request.Test(statuses[index] if statuses is not None and index < len(statuses) else None)
                    for index, request in enumerate(requests)])

    @staticmethod
    def Waitany(requests: Sequence[Request], status: Status | None = None) -> int:
        """Wait for one active request (the first of them, in order) and return its index."""
        for index, request in enumerate(requests):
            if request:
                request.Wait(status)
                return index
        return UNDEFINED

    @staticmethod
    def Testany(requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """(index, True) for a completed active request, else (MPI.UNDEFINED, False)."""
        active = [index for index, request in enumerate(requests) if request]
        for index in active:
            if requests[index].Test(status):
                return index, True
        return UNDEFINED, not active


REQUEST_NULL = Request()
REQUEST_NULL._active = False
