"""`MPI.Status`: what a completed receive got (source, tag, error, count in bytes, cancelled)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .datatypes import PREDEFINED, UNDEFINED, Datatype

ANY_SOURCE = -2
ANY_TAG = -1
SUCCESS = 0
_SOURCE, _TAG, _ERROR, _COUNT, _CANCELLED = range(5)


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
        get.__doc__, put.__doc__ = doc, f"Set: {doc[0].lower()}{doc[1:]}"
        return property(get, put, doc=doc)

    source = _field(_SOURCE, "The rank the message came from.")
    tag = _field(_TAG, "The message's tag.")
    error = _field(_ERROR, "The error code (MPI.SUCCESS: errors are raised as exceptions).")
    count = _field(_COUNT, "Bytes received.")
    cancelled = _field(_CANCELLED, "Whether the request was cancelled.", bool)
    del _field

    Get_source, Set_source = source.fget, source.fset
    Get_tag, Set_tag = tag.fget, tag.fset
    Get_error, Set_error = error.fget, error.fset
    Is_cancelled, Set_cancelled = cancelled.fget, cancelled.fset

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

    def tomemory(self) -> memoryview:
        """The status's fields (source, tag, error, count, cancelled) as writable memory."""
        return memoryview(self._fields)

    def _fill(self, source: int, tag: int, nbytes: int) -> None:
        self._fields[:] = (source, tag, SUCCESS, nbytes, 0)

    def _clear(self) -> None:
        self._fill(ANY_SOURCE, ANY_TAG, 0)
