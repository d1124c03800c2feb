"""The facade's point-to-point object protocol (`colls.compat.objects`): an object travels as one
message holding its pickle, or, when it holds large buffers (numpy arrays, pickle protocol 5 out of
band), as a header message (a marker, the buffers' sizes, the pickle) on the user's tag followed by
each buffer as a message of its own on the tag + `RESERVED_TAG_BASE` (colls' own tags: no user
receive, ANY_TAG included, matches them), all posted under one lock so two sends' parts never
interleave.

A receive posts (irecv, as mpi4py does) or claims (recv, by a matched probe) the first frame; once
it has come, the receives of the buffers it announces are posted from its source on the frame tag,
in the order the first frames were matched (`_advance`), so two receives of one source and tag
take their buffers in that order. Waits on frames post them meanwhile (`_wait_advancing`), so a
send of an object to a posted irecv completes however long its buffers are.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import Any

import numpy as np

from colls.objects import as_bytes
from transports.base import RESERVED_TAG_BASE, Backoff
from transports.errors import CollectiveTimeout, MessageTruncated

from .errors import MPIException
from .request import ANY_SOURCE, ANY_TAG, Request, truncated

MARKER = b"\x00\x00colls:pickle5+buffers\x00"   # starts a header: no pickle or empty message does
_SIZE = np.dtype("<u8")


# -- locks per communicator (mpi4py's MPI._comm_lock_table) --------------------------------------

_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


def _comm_lock_table(comm: Any) -> dict[str, Any]:
    """The locks the lowercase methods of `comm` take, by method name (created on first use)."""
    with _tables_lock:
        return _tables.setdefault(comm._comm, {})


def _lock(comm: Any, name: str) -> Any:
    table = _comm_lock_table(comm)
    with _tables_lock:
        return table.setdefault(name, threading.Lock())


# -- frames ------------------------------------------------------------------------------------

def frames(obj: Any, pickler: Any) -> list[np.ndarray]:
    """The messages that carry `obj`: its pickle, or a header and its out-of-band buffers."""
    data, buffers = pickler.dumps_oob(obj)
    if not buffers:
        return [as_bytes(data)]
    parts = [as_bytes(buffer) for buffer in buffers]
    sizes = np.array([len(parts), *(part.size for part in parts)], _SIZE)
    header = np.concatenate([np.frombuffer(MARKER, np.uint8), sizes.view(np.uint8), as_bytes(data)])
    return [header, *parts]


def _split_header(header: np.ndarray) -> tuple[np.ndarray, list[int]] | None:
    """(pickle, buffer sizes) of a header message; None for a plain pickle."""
    start = len(MARKER)
    if header.size < start + _SIZE.itemsize or header[:start].tobytes() != MARKER:
        return None
    count = int(header[start:start + _SIZE.itemsize].view(_SIZE)[0])
    end = start + (count + 1) * _SIZE.itemsize
    sizes = header[start + _SIZE.itemsize:end].view(_SIZE).tolist()
    return header[end:], sizes


class _ObjectReceive:
    """An object receive: the receive of its first frame (the pickle, or a header), then the
    receives of the buffers a header announces, from the same source on the frame tag.

    First frames are matched in the transport's order (MPI's: the earliest-posted receive that
    matches takes the earliest message); the buffers are posted in that order too, under the
    communicator's "recv" lock, by `_advance`, so two receives whose first frames came from one
    source and tag take their buffers in the order they took the headers.
    """

    def __init__(self, comm: Any, source: int, tag: int) -> None:
        self._comm = comm
        self._source, self._tag = source, tag
        self._first: np.ndarray | None = None
        self._header: Any = None   # the first frame's work (None: not posted or claimed yet)
        self._rest_posted = False
        self._error: Exception | None = None
        self._data: np.ndarray | None = None
        self._parts: list[np.ndarray] = []
        self._works: list[Any] = []
        self._done = False
        self._object: Any = None
        self.fields = (source, tag, 0)

    # -- posting -----------------------------------------------------------------------------------

    def post(self, space: np.ndarray) -> None:
        """Post the first frame's receive into `space` (a lowercase irecv, as mpi4py posts it)."""
        with _lock(self._comm, "recv"):
            self._first = space
            self._header = self._comm._comm.recv(space, self._source, self._tag, async_op=True)
            _pending(self._comm).append(self)

    def claim(self, envelope: Any = None) -> bool:
        """Receive a message claimed by a probe: `envelope`'s, else one `improbe` claims now (False
        if none has come)."""
        colls_comm = self._comm._comm
        with _lock(self._comm, "recv"):
            if envelope is None:
                envelope = colls_comm.improbe(self._source, self._tag)
                if envelope is None:
                    return False
            self._first = np.empty(envelope.nbytes, np.uint8)
            self._header = colls_comm.mrecv(self._first, envelope, async_op=True)
            _pending(self._comm).append(self)
        return True

    def _post_rest(self) -> None:
        """The first frame has come: post the receives of the buffers it announces."""
        try:
            self._header.wait()
        except MessageTruncated as error:
            self._error = truncated(error)
            return
        envelope = self._header.status
        first = self._first[:envelope.nbytes]
        split = _split_header(first)
        sizes: list[int] = []
        if split is None:
            self._data = first
        else:
            self._data, sizes = split
            self._parts = [np.empty(size, np.uint8) for size in sizes]
            recv = self._comm._comm.recv
            self._works = [recv(part, envelope.source, envelope.tag + RESERVED_TAG_BASE, async_op=True)
                           for part in self._parts]
        self.fields = (envelope.source, envelope.tag, envelope.nbytes + sum(sizes))
        self._rest_posted = True

    def _header_came(self) -> bool:
        """Whether the first frame has come (or failed), after one progress pass; posts the buffers'
        receives of every first frame that has, in posting order."""
        if not self._rest_posted and self._error is None:
            if not self._header.is_completed():
                try:
                    Request(self._header)._poll()
                except MPIException:
                    pass   # truncated: recorded by _post_rest
            with _lock(self._comm, "recv"):
                _advance(self._comm)
        if self._error is not None:
            raise self._error
        return self._rest_posted

    # -- completion --------------------------------------------------------------------------------

    def poll(self) -> bool:
        if not self._done:
            if self._header is None and not self.claim():
                return False
            if not self._header_came():
                return False
            if not all([Request(work)._poll() for work in self._works]):
                return False
            self._finish()
        return True

    def wait(self) -> Any:
        if not self._done:
            if self._header is None:
                self._claim_by(self._comm._comm.timeout)
            if not self._rest_posted and self._error is None:
                try:
                    _wait_advancing(self._comm, self._header)
                except MessageTruncated:
                    pass   # recorded by _post_rest
            self._header_came()
            for work in self._works:
                _wait_advancing(self._comm, work)
            self._finish()
        return self._object

    def _claim_by(self, limit: float) -> None:
        """A blocking recv: claim the next message (of any size) within `limit` seconds."""
        deadline, backoff = time.monotonic() + limit, Backoff()
        while not self.claim():
            if time.monotonic() >= deadline:
                who = "any rank" if self._source == ANY_SOURCE else f"rank {self._source}"
                which = "any tag" if self._tag == ANY_TAG else f"tag {self._tag}"
                raise CollectiveTimeout(f"rank {self._comm._comm.rank}: recv: no object from {who} "
                                        f"with {which} within {limit} s")
            self._comm._comm.transport.check_aborted()
            backoff.pause()

    def is_completed(self) -> bool:
        return self._done

    def _finish(self) -> None:
        pickler, data = self._comm._pickler(), self._data
        if self._works:
            self._object = pickler.loads_oob(data, self._parts)
        else:
            self._object = pickler.loads(data) if data.size else None
        self._first = self._data = self._parts = self._works = None   # type: ignore[assignment]
        self._done = True


_pending_receives: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pending(comm: Any) -> list[_ObjectReceive]:
    """The object receives of `comm` whose buffers are not posted yet, in posting order (the caller
    holds the "recv" lock)."""
    with _tables_lock:
        return _pending_receives.setdefault(comm._comm, [])


def _advance(comm: Any) -> None:
    """Post the buffers' receives of every pending receive of `comm` whose first frame has come, in
    posting order (the caller holds the "recv" lock). Looked at latest-posted first: a receive
    posted earlier that takes a message of the same stream takes it earlier, so it is seen complete
    too, whatever another thread's progress pass does meanwhile."""
    pending = _pending(comm)
    came = [receive for receive in reversed(pending) if receive._header.is_completed()]
    for receive in reversed(came):
        pending.remove(receive)
        receive._post_rest()


def _receive_space(buf: Any) -> np.ndarray:
    """Where a lowercase irecv receives the first frame: `buf`'s memory, `buf` bytes if an int, or
    mpi4py.rc.irecv_bufsz bytes (32768 by default) if None."""
    if buf is None:
        rc = getattr(sys.modules.get("mpi4py"), "rc", None)
        return np.empty(int(getattr(rc, "irecv_bufsz", 32768)), np.uint8)
    if isinstance(buf, (int, np.integer)) and not isinstance(buf, bool):
        return np.empty(int(buf), np.uint8)
    view = memoryview(buf)
    if view.readonly:
        raise TypeError(f"irecv: the buffer ({type(buf).__name__}) is read-only")
    return np.frombuffer(view.cast("B"), np.uint8)


class _Sends:
    """The sends of one object's frames: complete when all are."""

    def __init__(self, comm: Any, works: list[Any]) -> None:
        self._comm = comm
        self._works = works

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def poll(self) -> bool:
        with _lock(self._comm, "recv"):
            _advance(self._comm)
        return all([Request(work)._poll() for work in self._works])

    def wait(self) -> None:
        for work in self._works:
            _wait_advancing(self._comm, work)


_ADVANCE_EVERY_S = 1e-3


def _wait_advancing(comm: Any, work: Any) -> Any:
    """`work.wait()`, posting meanwhile the buffers' receives of `comm`'s object receives whose
    first frames come (the peer's send of them, or this rank's to itself, may be what `work`
    waits behind)."""
    deadline = time.monotonic() + comm._comm.timeout
    while True:
        with _lock(comm, "recv"):
            _advance(comm)
        try:
            return work.wait(timeout=_ADVANCE_EVERY_S)
        except CollectiveTimeout:
            if work.is_completed():   # another thread's progress pass completed it meanwhile:
                continue              # its wait now returns (or raises its own error)
            if time.monotonic() >= deadline:
                raise
