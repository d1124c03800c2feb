"""Synchronous sends over the shm transport (MPI_Issend): complete once the receiver matched them.

The sender numbers its synchronous messages to each peer with ids it reuses (at most SYNC_IDS
unmatched at once per peer) and sends them as any other message, but the tag word of the first
header carries SYNCHRONOUS and the id. Such a header matches no receive as it is, so the direct
paths leave it to the general one, and the receiver's matching (`matching`) decodes it only where a
new message found no receive. The flag then leaves the header (kept with the message if it is taken
aside), and once a receive takes the message (for one `improbe` claimed, its `mrecv`, as MPICH
does) the receiver flips the id's bit in the FIFO's MATCHED words (a cache line only the receiver
writes). The sender's request is done once its bytes are out and that bit differs from what it was
when the id was given. A bit, not a count, says which message was matched: receives may match
messages of different tags out of the order they were sent.
"""

from __future__ import annotations

import numpy as np

from ..base import Request, check_buffer
from ..errors import TransportError
from .fifo import HEADER_FIELDS, ID_SHIFT, MATCHED, SYNCHRONOUS, TAG_MASK, TAIL, Out
from .matching import first_wanting

BITS = 63                    # bits used of each MATCHED word (int64s stay positive)
SYNC_IDS = 8 * BITS          # ids per ordered pair of ranks: the 8 words of the MATCHED line

_TAG, _DONE = Request.tag, Request.done   # the slots SyncOut's properties wrap


def matched_bit(sync_id: int) -> tuple[int, int]:
    """The control word and bit whose flip says message `sync_id` was matched."""
    return MATCHED + sync_id // BITS, sync_id % BITS


class SyncOut(Out):
    """A synchronous send: its first header carries SYNCHRONOUS and its id; done once its bytes are
    out (as any `Out`) and its receiver flipped its id's bit."""

    __slots__ = ("sync_id", "ctl", "word", "bit", "before", "matched")

    def __init__(self, peer: int, tag: int, buf: np.ndarray, rendezvous: bool, region, ctl: memoryview,
                 sync_id: int) -> None:
        super().__init__(peer, tag, buf, rendezvous, region)
        self.sync_id = sync_id
        self.ctl = ctl   # the control block of the FIFO to `peer`
        self.word, self.bit = matched_bit(sync_id)
        self.before = ctl[self.word] >> self.bit & 1
        self.matched = False

    @property
    def tag(self) -> int:   # (what the sender writes into headers: flagged until the first is out)
        tag = _TAG.__get__(self)
        return tag if self.started else tag | SYNCHRONOUS | self.sync_id << ID_SHIFT

    @tag.setter
    def tag(self, value: int) -> None:
        _TAG.__set__(self, value)

    @property
    def done(self) -> bool:
        return _DONE.__get__(self) and self.is_matched()

    @done.setter
    def done(self, value: bool) -> None:   # (bytes out: set by the send's progress, as for an Out)
        _DONE.__set__(self, value)

    def is_matched(self) -> bool:
        """Whether the receiver has matched the message (latched: its id may then be reused)."""
        if not self.matched and (self.ctl[self.word] >> self.bit & 1) != self.before:
            self.matched = True
        return self.matched

    def __repr__(self) -> str:
        return f"synchronous send of {self.nbytes} B to rank {self.peer} (tag {_TAG.__get__(self)})"


class Synchronous:
    """`ShmTransport`'s synchronous sends, and the receiver's side of them (a mixin over the
    transport's FIFOs and queues; `unmatched[peer]`: id -> the SyncOut holding it)."""

    def issend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """`Transport.issend`: queued as a send that cannot go at once is; done once matched.

        Raises:
            TransportError: SYNC_IDS synchronous sends to `peer` are unmatched already.
        """
        check_buffer(buf, "shm synchronous send")
        region = self._registered(buf)
        self._acquire()
        try:
            unmatched = self.unmatched[peer]
            for sync_id, send in list(unmatched.items()):
                if send.is_matched():
                    del unmatched[sync_id]
            sync_id = next((i for i in range(SYNC_IDS) if i not in unmatched), None)
            if sync_id is None:
                raise TransportError(f"rank {self.rank}: {SYNC_IDS} synchronous sends to rank {peer} are "
                                     f"waiting for their receives already (the most the shm transport keeps)")
            request = SyncOut(peer, tag, buf, buf.nbytes >= self.rendezvous_bytes, region,
                              self.outbound[peer].ctl, sync_id)
            unmatched[sync_id] = request
            if request.rendezvous and not self.sends[peer] and self._post_address(request):
                return request
            self.sends[peer].append(request)
            self.active_out.add(peer)
            self._push(peer)
            return request
        finally:
            self._release()

    def _match_synchronous(self, peer: int, flagged: int, message_bytes: int) -> None:
        """A new message from `peer` whose header says its sender waits for the match (`_match`
        found no receive for the flagged tag): if a receive wants it, clear the flag in the header,
        make that receive the one the message goes to and tell the sender, in one step (a receive
        only wanting it could be taken by another peer's message before the next pass); else if
        receives wait behind it, take it aside as `_match` would (the flag kept with the stash,
        cleared in the header); else leave it. The next pass goes on with it (`current`) reading
        the plain header: None."""
        tag = flagged & TAG_MASK
        if first_wanting(self.posted[peer], tag) >= 0 or first_wanting(self.wild, tag) >= 0:
            self._clear_flag(peer, tag)
            self.current[peer] = self._match(peer, tag, message_bytes)
            self._flip_matched(peer, flagged)
        elif self.posted[peer] or self.wild:
            self.current[peer] = self._stash(peer, flagged, message_bytes)
            self.active_in.add(peer)
        return None

    def _clear_flag(self, peer: int, tag: int) -> None:
        """Write the plain `tag` into the header of the message at the head of `peer`'s FIFO."""
        fifo = self.inbound[peer]
        fifo.hdr[int(fifo.ctl[TAIL]) % self.slots * HEADER_FIELDS] = tag

    def _flip_matched(self, peer: int, flagged: int) -> None:
        """Tell `peer` that its synchronous message with the `flagged` tag word is matched."""
        word, bit = matched_bit((flagged & ~SYNCHRONOUS) >> ID_SHIFT)
        ctl = self.inbound[peer].ctl
        ctl[word] = ctl[word] ^ (1 << bit)
