"""One FIFO's layout in shared memory, the shm transport's requests, and how messages match receives.

A rank's segment holds an inbound FIFO from every rank (itself included): a control block (head,
written by the sender; tail and rendezvous acks, written by the receiver; each on its own cache
line), a header per slot (tag, message bytes, offset, chunk bytes) and `slots` data slots of
`chunk` bytes. The sender copies a chunk into a free slot and publishes it by bumping head; the
receiver copies (or reduces) straight out of the slot and frees it by bumping tail.
"""

from __future__ import annotations

import numpy as np

from ..base import Reducer, Request
from ..errors import CollectiveMismatch
from .options import ALIGN

# int64 indices in a FIFO's control block: head (the sender's line), tail and acks (the receiver's),
# a request to help copy (the receiver's line: number, target address, offset, bytes) and the
# number of the last one done (the sender's), see `help`; the bits the receiver flips as it matches
# synchronous messages (its line: 8 words), see `synchronous`
HEAD, TAIL, ACKS, HELP_ASK, HELP_DONE, MATCHED = 0, 8, 16, 24, 32, 40
CONTROL_BYTES = 384
# a synchronous message's first header has this bit in its tag word, and its id above the tag
SYNCHRONOUS = 1 << 62
ID_SHIFT = 32
TAG_MASK = (1 << ID_SHIFT) - 1
HEADER_FIELDS = 4            # tag, message bytes, offset, chunk bytes
# a header's chunk bytes that say the slot holds no chunk but how to read the message whole:
RENDEZVOUS_CHUNK = -1        # the sender's buffer address (cross-memory attach)
RENDEZVOUS_MAPPED = -2       # its place in registered memory: region id, descriptor, offset, region bytes
RENDEZVOUS_PUSHABLE = -3     # the sender's address, and it will write the message all if asked (`help`)
ADDRESSED = (RENDEZVOUS_CHUNK, RENDEZVOUS_PUSHABLE)


class Fifo:
    """Views of one FIFO (one sender, one receiver) inside a segment."""

    __slots__ = ("control", "headers", "data", "ctl", "hdr", "raw", "words")

    def __init__(self, segment: np.ndarray, offset: int, chunk: int, slots: int) -> None:
        self.control = segment[offset:offset + CONTROL_BYTES].view(np.int64)
        offset += CONTROL_BYTES
        header_bytes = slots * HEADER_FIELDS * 8
        self.headers = segment[offset:offset + header_bytes].view(np.int64).reshape(slots, HEADER_FIELDS)
        offset += header_bytes
        self.data = segment[offset:offset + slots * chunk].reshape(slots, chunk)
        # the same memory as memoryviews, for the one-slot path: a word read or written through one
        # costs ~20 ns where numpy's scalar indexing costs ~100 ns
        self.ctl = memoryview(self.control)
        self.hdr = memoryview(self.headers.reshape(-1))
        self.raw = memoryview(self.data.reshape(-1))
        self.words = self.raw.cast("q")   # the slots as int64s: a registered message's region


def fifo_bytes(chunk: int, slots: int) -> int:
    """The bytes one FIFO of `slots` slots of `chunk` bytes takes, page-aligned."""
    raw = CONTROL_BYTES + slots * HEADER_FIELDS * 8 + slots * chunk
    return (raw + ALIGN - 1) // ALIGN * ALIGN


class Out(Request):
    """A posted send: queued chunks, or (`rendezvous`) an address its receiver reads and acks."""

    __slots__ = ("data", "pos", "started", "ack", "rendezvous", "region", "pushable")

    def __init__(self, peer: int, tag: int, buf: np.ndarray, rendezvous: bool, region=None,
                 pushable: bool = False) -> None:
        super().__init__("send", peer, tag, buf.nbytes)
        self.data = buf.view(np.uint8)
        self.pos = 0
        self.started = False
        self.ack = 0          # for a rendezvous send: the peer's ack count that completes it
        self.rendezvous = rendezvous or region is not None
        self.region = region  # a `transports.registered.Region` its receiver maps
        self.pushable = pushable   # its receiver may ask me to write it all (`help`)


class In(Request):
    """A posted receive (or, `stash`, a message taken aside until a receive for its tag comes).

    `data` is where the message's bytes go and `size` how many come: the buffer whole until a
    message is matched (`matching`), then its first bytes for a shorter one, or a scratch buffer
    for one that does not fit. `seq` orders posted receives; a stash `claimed` (by `improbe`, or
    by a receive while it still arrives) goes to its `claimant` only; a stash's `synchronous` is the
    flagged tag word of a synchronous message not yet matched (else 0).
    """

    __slots__ = ("buf", "data", "reducer", "pos", "stash", "carry", "helpable", "size", "seq", "claimed",
                 "claimant", "synchronous")

    def __init__(self, peer: int, tag: int, buf: np.ndarray, reducer: Reducer | None,
                 stash: bool = False, helpable: bool = False) -> None:
        super().__init__("recv", peer, tag, buf.nbytes)
        self.buf = buf
        self.data = buf.view(np.uint8)
        self.size = self.nbytes
        self.reducer = reducer
        self.pos = 0
        self.stash = stash   # (`seq` is set when it is posted; `claimed`, `claimant` for a stash)
        self.helpable = helpable   # its sender may be asked to copy half (not a sendrecv's: `help`)
        self.carry: np.ndarray | None = None   # the bytes of an element split between two chunks

    def take(self, chunk: np.ndarray) -> None:
        """Copy or reduce one chunk of bytes at the current position."""
        n = chunk.shape[0]
        if n:
            if self.reducer is None:
                np.copyto(self.data[self.pos:self.pos + n], chunk)
            elif self.pos % self.buf.dtype.itemsize or n % self.buf.dtype.itemsize:
                self._reduce_split(chunk)
            else:
                dtype = self.buf.dtype
                self.reducer(self.data[self.pos:self.pos + n].view(dtype), chunk.view(dtype))
        self.pos += n

    def _reduce_split(self, chunk: np.ndarray) -> None:
        """Reduce a chunk that begins or ends inside an element (a dtype whose size does not divide
        the slot's, as a 12-byte struct's): the element's bytes wait in `carry` until it is whole."""
        dtype, start, n = self.buf.dtype, self.pos, chunk.shape[0]
        size = dtype.itemsize
        if self.carry is None:
            self.carry = np.empty(size, np.uint8)
        end = start + n
        first = -(-start // size) * size   # the first element boundary at or after the chunk's start
        if start % size:   # the end of an element begun in the chunk before
            have = start % size
            take = min(size - have, n)
            self.carry[have:have + take] = chunk[:take]
            if have + take == size:
                element = first - size
                self.reducer(self.data[element:first].view(dtype), self.carry.view(dtype))
        last = end // size * size          # the last element boundary at or before the chunk's end
        if last > first:
            self.reducer(self.data[first:last].view(dtype), chunk[first - start:last - start].view(dtype))
        if end % size and last >= first:   # an element begun here, finished in the chunk after
            self.carry[:end - last] = chunk[last - start:]


def chunk_mismatch(rank: int, peer: int, request: Request, header: tuple[int, int, int, int]
                   ) -> CollectiveMismatch:
    """The error for a FIFO chunk whose header (tag, message bytes, offset, chunk bytes) does not
    continue `request`, the receive it was matched to, where it stopped."""
    tag, message_bytes, offset, n = header
    return CollectiveMismatch(
        f"rank {rank} expected {request.nbytes} B from rank {peer} (tag {request.tag}) but rank "
        f"{peer} sent a chunk of a {message_bytes} B message (tag {tag}, offset {offset}, {n} B): "
        f"the ranks called different operations")


def take_posted(posted: list, rank: int, peer: int, tag: int, message_bytes: int):
    """The earliest of `posted` (receives from `peer`) with `tag`, taken off the list; None if none.

    Raises:
        CollectiveMismatch: its size is not the message's (MPI's matching: in order, per tag).
    """
    for i, request in enumerate(posted):
        if request.tag == tag:
            if message_bytes != request.nbytes:
                raise CollectiveMismatch(
                    f"rank {rank} posted a receive of {request.nbytes} B from rank {peer} "
                    f"(tag {tag}) but rank {peer} sent {message_bytes} B")
            return posted.pop(i)
    return None


def serve_stashed(stashed: list, posted: list, rank: int, peer: int, deliver) -> None:
    """Hand fully stashed messages from `peer` (oldest first) to posted receives with their tag:
    `deliver(request, stash)` copies and completes; a delivered stash leaves the list."""
    for stash in list(stashed):
        if not stash.done:
            break
        request = take_posted(posted, rank, peer, stash.tag, stash.nbytes)
        if request is not None:
            deliver(request, stash)
            stashed.remove(stash)
