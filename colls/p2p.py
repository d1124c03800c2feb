"""The point-to-point calls of a `Communicator` (a mixin): send and recv with MPI's rules.

A receive may name `ANY_SOURCE` and `ANY_TAG` and may be larger than the message; the handle of an
`async_op=True` call tells, once waited, what arrived (`work.status`). A message longer than the
buffer raises `MessageTruncated` from the wait, on the receiver only, and leaves the communicator
usable. Probes find a message without receiving it (`iprobe`, `probe`) or claim it for `mrecv`
(`improbe`, `mprobe`).

Over the transports that keep MPI's point-to-point contract (local, shm, mpi: wildcards, probes, and
verbs that several threads may call at once) a point-to-point call posts and waits in the caller's
thread, beside a collective another thread or the communicator's worker may be running; over the
others (cuda_ipc) it takes its turn with them, and wildcards are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from transports.base import (
    ANY_SOURCE,
    ANY_TAG,
    COLLECTIVE_TAG_BASE,
    RESERVED_TAG_BASE,
    Backoff,
    Envelope,
    Traffic,
)
from transports.errors import CollectiveTimeout

from .collectives import Result
from .device import is_cupy
from .executor import RequestWork

# transports that keep MPI's point-to-point contract: ANY_SOURCE, ANY_TAG, shorter messages, probes,
# verbs called from several threads at once
MPI_POINT_TO_POINT = frozenset({"local", "shm", "mpi"})


class PointToPoint:
    """`send`, `recv`, the probes and `mrecv`; the class using it provides `transport`, `rank`,
    `size`, `name`, `timeout`, `closed`, `_check`, `_executor` and `_traffic`."""

    def send(self, x, dst: int, tag: int = 0, async_op: bool = False, timeout: float | None = None,
             synchronous: bool = False) -> Result:
        """Send `x` to rank `dst`; matched by a receive on `dst` from this rank (or ANY_SOURCE)
        with the same tag (or ANY_TAG, for a user tag).

        Args:
            x: the array to send (any shape; its bytes travel).
            dst: the receiving rank.
            tag: a point-to-point tag: a user tag, 0 .. the transport's limit - 1, or from
                `RESERVED_TAG_BASE` (2**31) up to 2**32 - 1, colls' own protocols' tags (the mpi4py
                facade's object frames), which only a receive naming the same tag matches.
            async_op: post the send and return a handle at once (MPI_Isend); `x` must not change
                until `wait()` returns.
            timeout: seconds the send may wait; the communicator's timeout by default.
            synchronous: complete only once `dst` has matched the message to a receive (MPI_Ssend,
                with `async_op` MPI_Issend); a probe does not, nor `improbe` until its `mrecv`.

        Returns:
            None, or with `async_op=True` a handle whose `wait()` returns None.

        Raises:
            InvalidArgument: a bad `x`, `dst`, `tag` or `timeout`, named with this rank.
            CollectiveTimeout: the receiver did not take (or, synchronous, match) the message in time.
            NotImplementedError: `synchronous` over a transport without synchronous sends (cuda_ipc).
        """
        x = self._check.array("send", x)
        dst = self._check.peer("send", dst, "dst")
        tag = self._user_tag("send", tag)
        flat = x.reshape(-1)
        post = self.transport.issend if synchronous else self.transport.isend
        return self._point_to_point("send", lambda: post(flat, dst, tag), dst, flat.nbytes,
                                    None, async_op, timeout)

    def recv(self, x: np.ndarray, src: int, tag: int = 0, async_op: bool = False,
             timeout: float | None = None) -> Result:
        """Receive into `x` (in place) a message from `src` with `tag`.

        Args:
            x: a writable C-contiguous array (over cuda_ipc, a cupy array), at least as large as
                the message; bytes past the message are left as they were.
            src: the sending rank, or `colls.ANY_SOURCE`.
            tag: a point-to-point tag (as for `send`), or `colls.ANY_TAG`, which matches only user
                tags (never colls' own from 2**31, nor a collective's message).
            async_op: post the receive and return a handle at once (MPI_Irecv); its `status`,
                once `wait()` has returned, is the `Envelope` of what arrived (source, tag, nbytes).
            timeout: seconds the receive may wait; the communicator's timeout by default.

        Returns:
            `x`, or with `async_op=True` a handle whose `wait()` returns `x`.

        Raises:
            InvalidArgument: a bad `x`, `src`, `tag` or `timeout`, named with this rank.
            MessageTruncated: the message was longer than `x` (it was consumed; nothing else is
                affected).
            CollectiveTimeout: no message came in time.
        """
        flat = self._receive_buffer("recv", x)
        src = self._source("recv", src)
        tag = self._user_tag("recv", tag, wildcard=True)
        return self._point_to_point("recv", lambda: self.transport.irecv(flat, src, tag), src, flat.nbytes,
                                    x, async_op, timeout)

    def iprobe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Envelope | None:
        """The message a `recv(_, src, tag)` would receive now, left in place (MPI_Iprobe).

        Args:
            src: a rank, or `colls.ANY_SOURCE`.
            tag: a point-to-point tag, or `colls.ANY_TAG`.

        Returns:
            Its `Envelope` (source, tag, nbytes), or None if no such message has arrived.

        Raises:
            InvalidArgument: a bad `src` or `tag`, named with this rank.
        """
        return self._probe("iprobe", self.transport.iprobe, src, tag)

    def improbe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Envelope | None:
        """As `iprobe`, but the message is claimed: only `mrecv` of the returned envelope receives
        it (MPI_Improbe).

        Args:
            src: a rank, or `colls.ANY_SOURCE`.
            tag: a point-to-point tag, or `colls.ANY_TAG`.

        Returns:
            The claimed message's `Envelope`, or None if no such message has arrived.

        Raises:
            InvalidArgument: a bad `src` or `tag`, named with this rank.
        """
        return self._probe("improbe", self.transport.improbe, src, tag)

    def probe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, timeout: float | None = None) -> Envelope:
        """Wait for a message `recv(_, src, tag)` would receive, and leave it in place (MPI_Probe).

        Args:
            src: a rank, or `colls.ANY_SOURCE`.
            tag: a point-to-point tag, or `colls.ANY_TAG`.
            timeout: seconds to wait; the communicator's timeout by default.

        Returns:
            The message's `Envelope` (source, tag, nbytes).

        Raises:
            InvalidArgument: a bad `src`, `tag` or `timeout`, named with this rank.
            CollectiveTimeout: no such message came in time.
        """
        return self._probe("probe", self.transport.iprobe, src, tag, timeout)

    def mprobe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, timeout: float | None = None) -> Envelope:
        """Wait for a message as `probe` does, and claim it for `mrecv` (MPI_Mprobe).

        Args:
            src: a rank, or `colls.ANY_SOURCE`.
            tag: a point-to-point tag, or `colls.ANY_TAG`.
            timeout: seconds to wait; the communicator's timeout by default.

        Returns:
            The claimed message's `Envelope`.

        Raises:
            InvalidArgument: a bad `src`, `tag` or `timeout`, named with this rank.
            CollectiveTimeout: no such message came in time.
        """
        return self._probe("mprobe", self.transport.improbe, src, tag, timeout)

    def mrecv(self, x: np.ndarray, message: Envelope, async_op: bool = False,
              timeout: float | None = None) -> Result:
        """Receive into `x` the message `improbe` or `mprobe` claimed (MPI_Mrecv), as `recv` does.

        Args:
            x: a writable C-contiguous array at least `message.nbytes` long.
            message: the claimed message's `Envelope`; it can be received once.
            async_op: return a handle at once; its `status` is the message's envelope.
            timeout: seconds the receive may wait; the communicator's timeout by default.

        Returns:
            `x`, or with `async_op=True` a handle whose `wait()` returns `x`.

        Raises:
            InvalidArgument: a bad `x` or `message`, named with this rank.
            MessageTruncated: the message was longer than `x`.
        """
        flat = self._receive_buffer("mrecv", x)
        if not isinstance(message, Envelope) or message.handle is None:
            raise self._check.fail("mrecv", f"message must be an Envelope that improbe or mprobe claimed "
                                            f"and that was not received yet, got {message!r}")
        return self._point_to_point("recv", lambda: self.transport.mrecv(flat, message), message.source,
                                    flat.nbytes, x, async_op, timeout)

    # -- shared steps --------------------------------------------------------------------------------

    def _receive_buffer(self, what: str, x: Any) -> Any:
        """`x` flattened, once it is known to be a buffer this transport can receive into."""
        on_device = type(x) is not np.ndarray and is_cupy(x) and self.transport.capabilities.device_buffers
        if not (isinstance(x, np.ndarray) or on_device) or not x.flags.c_contiguous or not (
                on_device or x.flags.writeable):
            raise self._check.fail(what, "x must be a writable C-contiguous numpy array (or, over "
                                         "cuda_ipc, cupy array) to receive into")
        if x.dtype.hasobject:   # references to objects of this process: no bytes to receive into
            raise self._check.fail(what, f"x has dtype {x.dtype}, which holds Python objects")
        return x.reshape(-1)

    def _source(self, what: str, src: object) -> int:
        if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or not (
                0 <= src < self.size or src == ANY_SOURCE):
            raise self._check.fail(what, f"src={src!r} is not a rank of this group of {self.size} "
                                         f"(nor colls.ANY_SOURCE)")
        if src == ANY_SOURCE:
            self._wildcard(what, "src=colls.ANY_SOURCE")
        return int(src)

    def _wildcard(self, what: str, given: str) -> None:
        if self.transport.name not in MPI_POINT_TO_POINT:
            raise self._check.fail(what, f"{given}: the {self.transport.name} transport matches messages "
                                         f"by source and tag only (local, shm and mpi take wildcards)")

    def _user_tag(self, what: str, tag: object, wildcard: bool = False) -> int:
        """A user tag (below the transport's limit) or one of colls' own (RESERVED_TAG_BASE up to
        COLLECTIVE_TAG_BASE), and ANY_TAG where `wildcard`."""
        limit = self.transport.user_tag_limit
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not (
                0 <= tag < limit or RESERVED_TAG_BASE <= tag < COLLECTIVE_TAG_BASE
                or (wildcard and tag == ANY_TAG)):
            anything = " or colls.ANY_TAG" if wildcard else ""
            raise self._check.fail(what, f"tag={tag!r} must be an int in 0..{limit - 1} (the "
                                         f"{self.transport.name} transport's range){anything}, or colls' "
                                         f"own from {RESERVED_TAG_BASE} to {COLLECTIVE_TAG_BASE - 1}")
        if tag == ANY_TAG:
            self._wildcard(what, "tag=colls.ANY_TAG")
        return int(tag)

    def _probe(self, what: str, probe: Callable[[int, int], Envelope | None], src: object, tag: object,
               timeout: float | None = None) -> Envelope | None:
        """Probe once (`iprobe`, `improbe`), or until a message is found or the deadline passes."""
        src = self._source(what, src)
        tag = self._user_tag(what, tag, wildcard=True)
        if self.closed:
            raise self._check.fail(what, "the communicator is closed")
        if what in ("iprobe", "improbe"):
            return probe(src, tag)
        limit = self.timeout if timeout is None else self._check.timeout(what, timeout)
        deadline = time.monotonic() + limit
        backoff = Backoff()
        while True:
            found = probe(src, tag)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                who = "any rank" if src == ANY_SOURCE else f"rank {src}"
                which = "any tag" if tag == ANY_TAG else f"tag {tag}"
                raise CollectiveTimeout(f"rank {self.rank}: {self.name} {what}: no message from {who} "
                                        f"with {which} within {limit} s",
                                        tuple(range(self.size)) if src == ANY_SOURCE else (src,))
            self.transport.check_aborted()
            backoff.pause()

    def _point_to_point(self, what: str, post: Callable[[], Any], peer: int, nbytes: int, result: Any,
                        async_op: bool, timeout: float | None) -> Result:
        """Post now (over a transport not in MPI_POINT_TO_POINT, in issue order, behind queued
        asynchronous work), then wait now or on `wait()`.

        Point-to-point calls take no collective sequence number: only some ranks make them, and
        the collectives' tags must stay the same on every rank.
        """
        if self.closed:
            raise self._check.fail(what, "the communicator is closed")
        limit = self.timeout if timeout is None else self._check.timeout(what, timeout)
        traffic = self._traffic.get(what) or self._traffic.setdefault(what, Traffic(self.size))
        traffic.calls += 1
        if what == "send":
            traffic.messages_sent[peer] += 1
            traffic.bytes_sent[peer] += nbytes
        if self.transport.name in MPI_POINT_TO_POINT:
            request, turn = post(), None
        else:
            request, turn = self._executor.run(what, False, post), self._executor.exclusive()
        work = RequestWork(f"{self.name} {what} ({request!r})", self.transport, request,
                           time.monotonic() + limit, result, turn, traffic)
        return work if async_op else work.wait()
