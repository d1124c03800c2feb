"""Which receive a message goes to: MPI's matching over the shm transport's FIFOs, and its probes.

A message is matched when its first header is read out of its sender's FIFO (`_pull`): it goes to
the earliest-posted receive that wants it, whether that names its sender (`posted`, per peer) or
ANY_SOURCE (`wild`, one list): a posting number (`In.seq`) orders the two. ANY_TAG wants every
user tag (below RESERVED_TAG_BASE), never colls' own nor a collective's. A synchronous message's
first header is decoded only where no receive took it as it is (`synchronous`). A message no receive wants
stays in its FIFO, unless receives wait behind it (for another tag from that peer, or from any
peer): then it is taken aside into a buffer of its own (`stashed`, per peer, oldest first), so that
later messages from that sender keep moving; a receive posted later looks there first.

A point-to-point message shorter than its receive's buffer fills its first bytes (`count` says how
many); a longer one goes whole into a scratch buffer, so that the sender's FIFO (or its ack) moves
on, and the receive completes with `MessageTruncated`. Collective tags and reducing receives keep
the exact-size rule (`CollectiveMismatch`).

Probes see the messages no posted receive has matched: stashed ones first (they came first), then
the head of each FIFO; to see past a message the probe does not want, it takes it aside.
`improbe` claims the message it finds (taken aside, marked `claimed`), which then goes only to the
receive `mrecv` posts for it.
"""

from __future__ import annotations

import numpy as np

from ..base import (
    ANY_SOURCE,
    ANY_TAG,
    COLLECTIVE_TAG_BASE,
    RESERVED_TAG_BASE,
    Envelope,
    Reducer,
    check_buffer,
)
from ..errors import CollectiveMismatch, MessageTruncated
from .fifo import HEAD, HEADER_FIELDS, SYNCHRONOUS, TAG_MASK, In


def wants(wanted: int, tag: int) -> bool:
    """Whether a receive or probe for tag `wanted` (or ANY_TAG) takes a message with `tag`."""
    return wanted == tag or (wanted == ANY_TAG and tag < RESERVED_TAG_BASE)


def first_wanting(receives: list[In], tag: int) -> int:
    """The index of the earliest of `receives` that wants a message with `tag`; -1 if none."""
    for i, request in enumerate(receives):
        if request.tag == tag or (request.tag == ANY_TAG and tag < RESERVED_TAG_BASE):
            return i
    return -1


class Matching:
    """`ShmTransport`'s posting of receives, message matching and probes (a mixin over its queues:
    `posted`, `wild`, `stashed`, `current`, `active_in`)."""

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> In:
        """`Transport.irecv`: `peer` may be ANY_SOURCE, `tag` ANY_TAG."""
        check_buffer(buf, "shm receive")
        request = In(peer, tag, buf, None, helpable=True)
        self._acquire()   # (a `with` costs twice as much)
        try:
            return self._post(request)
        finally:
            self._release()

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> In:
        """`Transport.irecv_reduce` (exact sizes only: no wildcard takes a collective's message)."""
        check_buffer(buf, "shm receive-reduce")
        request = In(peer, tag, buf, reducer)
        self._acquire()
        try:
            return self._post(request)
        finally:
            self._release()

    def _post(self, request: In) -> In:
        """Post a receive, numbered; a message already taken aside may complete it at once."""
        self.posts += 1
        request.seq = self.posts
        peer = request.peer
        if peer == ANY_SOURCE:
            self.wild.append(request)
            self.active_in.update(range(self.size))   # every FIFO is pulled while it waits
            for source in range(self.size):
                if self.stashed[source] and not request.done:
                    self._serve_stash(source)
            return request
        self.posted[peer].append(request)
        self.active_in.add(peer)
        if self.stashed[peer]:
            self._serve_stash(peer)
        return request

    def _take(self, peer: int, tag: int) -> In | None:
        """The earliest-posted receive that wants a message from `peer` with `tag`, taken off its list."""
        posted, wild = self.posted[peer], self.wild
        i = first_wanting(posted, tag) if posted else -1
        if wild:
            j = first_wanting(wild, tag)
            if j >= 0 and (i < 0 or wild[j].seq < posted[i].seq):
                return wild.pop(j)
        return posted.pop(i) if i >= 0 else None

    def _match(self, peer: int, tag: int, message_bytes: int) -> In | None:
        """The receive a new message goes to; taken aside if receives wait for others behind it;
        None (left in the FIFO) if no receive waits."""
        posted = self.posted[peer]
        if not self.wild:   # the usual case, inlined: receives that name their source
            for i, request in enumerate(posted):
                if request.tag == tag and request.nbytes == message_bytes:
                    del posted[i]
                    return request
                if request.tag == tag or (request.tag == ANY_TAG and tag < RESERVED_TAG_BASE):
                    del posted[i]
                    return self._fit(request, peer, tag, message_bytes)
            if tag >= SYNCHRONOUS:
                return self._match_synchronous(peer, tag, message_bytes)
            return self._stash(peer, tag, message_bytes) if posted else None
        if tag >= SYNCHRONOUS:
            return self._match_synchronous(peer, tag, message_bytes)
        request = self._take(peer, tag)
        if request is not None:
            return self._fit(request, peer, tag, message_bytes)
        return self._stash(peer, tag, message_bytes)

    def _stash(self, peer: int, tag: int, message_bytes: int) -> In:
        """Take the message at the head of `peer`'s FIFO aside, into a buffer of its own (the rare,
        allocating path: messages out of the order of receives). `tag` is the header's word: a
        synchronous message's flag moves from the header to the stash, until a receive or `improbe`
        takes it."""
        synchronous = tag if tag >= SYNCHRONOUS else 0
        if synchronous:
            tag &= TAG_MASK
            self._clear_flag(peer, tag)
        stash = In(peer, tag, np.empty(message_bytes, np.uint8), None, stash=True)
        stash.claimed, stash.claimant, stash.synchronous = False, None, synchronous
        self.stashed[peer].append(stash)
        return stash

    def _fit(self, request: In, peer: int, tag: int, message_bytes: int) -> In:
        """Set `request` up for the message it matched: status, and where a size differs, the
        bytes it takes (module docstring).

        Raises:
            CollectiveMismatch: a collective's (or a reducing) receive of another size.
        """
        request.source = peer
        request.received_tag = tag
        if message_bytes == request.nbytes:
            return request
        if tag >= COLLECTIVE_TAG_BASE or request.reducer is not None:
            raise CollectiveMismatch(
                f"rank {self.rank} posted a receive of {request.nbytes} B from rank {peer} "
                f"(tag {tag}) but rank {peer} sent {message_bytes} B")
        if message_bytes < request.nbytes:
            request.data = request.data[:message_bytes]
            request.count = message_bytes
        else:
            request.error = MessageTruncated(
                f"rank {self.rank}: a message of {message_bytes} B from rank {peer} (tag {tag}) does "
                f"not fit the receive buffer of {request.nbytes} B")
            request.data = np.empty(message_bytes, np.uint8)   # consumed whole, then dropped
        request.size = message_bytes
        return request

    def _serve_stash(self, peer: int) -> None:
        """Hand the messages taken aside from `peer` that are complete (oldest first) to the
        receives that want them: the earliest-posted that matches, or for a claimed one its
        `mrecv`'s (or the receive that matched it while it was still arriving)."""
        stashed = self.stashed[peer]
        for stash in list(stashed):
            if stash.claimed:
                request = stash.claimant
            else:
                request = self._take(peer, stash.tag)
                if request is not None and stash.synchronous:
                    self._flip_matched(peer, stash.synchronous)
                    stash.synchronous = 0
                if request is not None and not stash.done:   # still arriving: it is that receive's
                    stash.claimed, stash.claimant = True, request
            if not stash.done:
                break   # (only the newest can still be arriving)
            if request is None:
                continue
            stashed.remove(stash)
            self._fit(request, peer, stash.tag, stash.size)
            if request.error is None:
                request.take(stash.data)
            request.done = True

    def _unreceived(self, peer: int) -> list[int]:
        """`Transport._unreceived`: the messages from `peer` taken aside, and the one at the head of
        its FIFO if none is being received (call with the lock held)."""
        tags = [stash.tag for stash in self.stashed[peer]]
        tail = self.read_tail[peer]
        if self.current[peer] is None and self.inbound[peer].ctl[HEAD] > tail:
            tags.append(self.inbound[peer].hdr[tail % self.slots * HEADER_FIELDS])
        return [tag for tag in tags if COLLECTIVE_TAG_BASE <= tag < SYNCHRONOUS]

    # -- probes ----------------------------------------------------------------------------------

    def iprobe(self, peer: int, tag: int) -> Envelope | None:
        """`Transport.iprobe`: one progress pass, then the earliest message from `peer` (from each
        peer in turn for ANY_SOURCE) that `tag` wants and no receive has matched."""
        with self.lock:
            self.progress()
            return self._find(peer, tag, False)

    def improbe(self, peer: int, tag: int) -> Envelope | None:
        """`Transport.improbe`: as `iprobe`, the message claimed (taken aside for `mrecv`)."""
        with self.lock:
            self.progress()
            return self._find(peer, tag, True)

    def mrecv(self, buf: np.ndarray, message: Envelope) -> In:
        """`Transport.mrecv`: the receive of a message `improbe` claimed; the size rules of `irecv`.

        Raises:
            ValueError: `message` is not one this transport's `improbe` claimed, or was received.
        """
        check_buffer(buf, "shm matched receive")
        stash = message.handle
        if not isinstance(stash, In) or not stash.stash or not stash.claimed or stash.claimant is not None:
            raise ValueError(f"rank {self.rank}: mrecv needs a message improbe returned, received once; "
                             f"got {message!r}")
        with self.lock:
            if stash.synchronous:   # a synchronous send completes once received (as MPICH does)
                self._flip_matched(stash.peer, stash.synchronous)
                stash.synchronous = 0
            request = stash.claimant = In(stash.peer, stash.tag, buf, None)
            self._serve_stash(stash.peer)
        return request

    def _find(self, peer: int, tag: int, claim: bool) -> Envelope | None:
        for source in (range(self.size) if peer == ANY_SOURCE else (peer,)):
            found = self._find_from(source, tag, claim)
            if found is not None:
                return found
        return None

    def _find_from(self, peer: int, tag: int, claim: bool) -> Envelope | None:
        """The earliest unmatched message from `peer` that `tag` wants: stashed, or at its FIFO's
        head (taken aside to look past one it does not want, or to claim it)."""
        while True:
            for stash in self.stashed[peer]:
                if not stash.claimed and wants(tag, stash.tag):
                    stash.claimed = claim
                    return Envelope(peer, stash.tag, stash.size, stash if claim else None)
            tail = self.read_tail[peer]
            fifo = self.inbound[peer]
            if self.current[peer] is not None or fifo.ctl[HEAD] <= tail:
                return None   # nothing more has arrived (or a message is still being received)
            field = tail % self.slots * HEADER_FIELDS
            got, message_bytes = fifo.hdr[field], fifo.hdr[field + 1]
            if not claim and wants(tag, got):
                return Envelope(peer, got, message_bytes)
            self._take_aside(peer)

    def _take_aside(self, peer: int) -> bool:
        """Take the message at the head of `peer`'s FIFO aside and receive what has come of it, if no
        message from `peer` is being received; false if there was none. (A probe looks past it
        so; and a rank sending to itself frees its full slots so: MPI buffers such a message.)"""
        tail = self.read_tail[peer]
        fifo = self.inbound[peer]
        if self.current[peer] is not None or fifo.ctl[HEAD] <= tail:
            return False
        field = tail % self.slots * HEADER_FIELDS
        self.current[peer] = self._stash(peer, fifo.hdr[field], fifo.hdr[field + 1])
        self.active_in.add(peer)
        self._pull(peer)
        return True
