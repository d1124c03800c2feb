"""The shm transport's direct path: a blocking step's message written into free slots at once and
taken straight out of them (or out of its sender) as it lands, with no request made.

Most schedules are sendrecvs of small messages, whose cost is software: a request, a progress
pass over every FIFO and a clock read each cost as much as the copy. Whatever this path cannot
finish at once (a busy FIFO, a late peer, another tag first) it leaves to the general path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from ..base import Reducer
from .fifo import ADDRESSED, HEAD, HEADER_FIELDS, RENDEZVOUS_PUSHABLE, TAIL, In, chunk_mismatch
from .options import NEVER, PUSH_FROM_BYTES

DIRECT_POLLS = 200           # polls the direct path makes for a message before it posts a receive
# and at most this long yielding (on a busy machine each yield may hand the core to another process
# for a whole time slice: 150 of them took seconds, past a 10 ms deadline the direct path never reads)
DIRECT_YIELD_S = 0.001


class DirectPath:
    """`ShmTransport`'s request-free steps (a mixin: it works on the transport's FIFOs and queues)."""


    def _send_now(self, buf: np.ndarray, peer: int, tag: int) -> bool:
        """Write a message below the rendezvous size to `peer` now if nothing is queued before it
        and the slots it takes are free (several slots: each piece published as it is written)."""
        n = buf.nbytes
        if self.sends[peer] or n >= self.rendezvous_bytes:
            return False
        fifo = self.outbound[peer]
        head = self.sent_head[peer]
        if n > self.chunk:
            if head - fifo.ctl[TAIL] > self.slots - -(-n // self.chunk):
                return False
            data, headers, control = buf.reshape(-1).view(np.uint8), fifo.headers, fifo.control
            for offset in range(0, n, self.chunk):
                size = min(self.chunk, n - offset)
                slot = head % self.slots
                headers[slot] = (tag, n, offset, size)
                fifo.data[slot, :size] = data[offset:offset + size]
                head += 1
                control[HEAD] = head       # publish each piece at once
            self.sent_head[peer] = head
            return True
        if head - fifo.ctl[TAIL] >= self.slots:
            return False
        slot = head % self.slots
        hdr, field = fifo.hdr, slot * HEADER_FIELDS
        hdr[field] = tag
        hdr[field + 1] = n
        hdr[field + 2] = 0
        hdr[field + 3] = n
        if n:
            start = slot * self.chunk
            try:
                fifo.raw[start:start + n] = buf.data.cast("B")   # half the cost of a uint8 view
            except ValueError:                                  # a dtype with no buffer format
                fifo.raw[start:start + n] = buf.view(np.uint8)
        self.sent_head[peer] = head + 1
        fifo.ctl[HEAD] = head + 1          # publish (x86 keeps the stores above before this one)
        return True

    def sendrecv_init(self, dtype: np.dtype, send_count: int, dst: int, recv_count: int, src: int,
                      reducer: Reducer | None = None) -> Callable[..., None]:
        """`Transport.sendrecv_init`. Where both messages fit one slot below every size that goes
        by address, the step gets views of the slots they pass through, made once: a call writes
        its message into the next slot to `dst` and takes `src`'s out of the slot it lands in, with
        no view made and no check (the compiled schedule checked the buffers). What it cannot do so
        (a busy FIFO, a late peer, another message first, a pending ANY_SOURCE receive) goes the
        general way. An attempt holds the transport's lock."""
        general = super().sendrecv_init(dtype, send_count, dst, recv_count, src, reducer)
        sent, received = send_count * dtype.itemsize, recv_count * dtype.itemsize
        limit = min(self.chunk + 1, self.rendezvous_bytes, self.exchange_huge_bytes, PUSH_FROM_BYTES,
                    self.options.mapped_bytes if self.mappable else NEVER)
        if dtype.hasobject or not (0 < sent < limit and 0 < received < limit) or self.rank in (dst, src):
            return general
        chunk, slots = self.chunk, self.slots
        outbound, inbound = self.outbound[dst], self.inbound[src]
        outgoing = [np.frombuffer(outbound.raw, dtype, send_count, slot * chunk) for slot in range(slots)]
        incoming = [np.frombuffer(inbound.raw, dtype, recv_count, slot * chunk) for slot in range(slots)]
        out_ctl, out_hdr, in_ctl, in_hdr = outbound.ctl, outbound.hdr, inbound.ctl, inbound.hdr
        sends, posted, stashed, current = self.sends[dst], self.posted[src], self.stashed[src], self.current
        sent_head, read_tail, landed, wild = self.sent_head, self.read_tail, self._landed, self.wild
        acquire, release = self.lock.acquire, self.lock.release   # (a `with` costs twice as much)
        exchange_receive, wait_all = self._exchange_receive, self.wait_all

        def step(send_buf: np.ndarray | None, recv_buf: np.ndarray | None, tag: int, deadline: float) -> None:
            acquire()
            try:
                head = sent_head[dst]
                if (send_buf is None or recv_buf is None or sends or posted or stashed or wild
                        or current[src] is not None or head - out_ctl[TAIL] >= slots):
                    waits = None
                else:
                    slot = head % slots   # the send, as `_send_now`
                    field = slot * HEADER_FIELDS
                    out_hdr[field] = tag
                    out_hdr[field + 1] = sent
                    out_hdr[field + 2] = 0
                    out_hdr[field + 3] = sent
                    outgoing[slot][...] = send_buf
                    sent_head[dst] = head + 1
                    out_ctl[HEAD] = head + 1   # publish (x86 keeps the stores above before this one)
                    tail = read_tail[src]      # the receive, as `_receive_now`
                    if in_ctl[HEAD] > tail or landed(src, tail):
                        slot = tail % slots
                        field = slot * HEADER_FIELDS
                        if (in_hdr[field] == tag and in_hdr[field + 1] == received
                                and in_hdr[field + 3] == received):
                            if reducer is None:
                                recv_buf[...] = incoming[slot]
                            else:
                                reducer(recv_buf, incoming[slot])
                            read_tail[src] = tail + 1
                            in_ctl[TAIL] = tail + 1   # the slot is free again
                            return None
                    # a late peer, or another message first: the general receive sorts it out
                    waits = exchange_receive(None, recv_buf, src, tag, reducer)
            finally:
                release()
            if waits is None:
                return general(send_buf, recv_buf, tag, deadline)
            if waits:
                wait_all(waits, deadline)
            return None
        return step

    def _landed(self, peer: int, tail: int) -> bool:
        """Spin (yielding after `spin_polls`) until `peer`'s FIFO has a slot at `tail`, keeping my
        other messages moving as `wait_all` would; false after DIRECT_POLLS polls. The lock stays
        held (at most DIRECT_YIELD_S): my other threads wait that long at most."""
        ctl = self.inbound[peer].ctl
        polls = 0
        while ctl[HEAD] <= tail:
            if self.active_out or self.active_in:
                self.progress()
            polls += 1
            if polls >= self.spin_polls:
                now = time.monotonic()         # (only once yielding, a syscall dearer than the clock)
                if polls == self.spin_polls:
                    give_up = now + DIRECT_YIELD_S
                if polls >= DIRECT_POLLS or now > give_up:
                    return False           # a slow peer: the general path waits with deadlines
                os.sched_yield()           # ranks may outnumber cores: let the sender run
        return True

    def _receive_now(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer | None,
                     helpable: bool = False) -> bool | In:
        """Take the message from `peer` with `tag` straight out of its slots as they land, or out of
        its sender if its header names its buffer (`helpable`: with its sender's help, `help`), if
        nothing else is being received from `peer`.
        True: done; false: nothing taken (post a receive); a request: begun, installed as the
        message being received from `peer`, to wait for."""
        n = buf.nbytes
        if self.posted[peer] or self.current[peer] is not None or self.stashed[peer] or self.wild:
            return False   # (receives posted before this one come first; ANY_SOURCE ones pull every FIFO)
        fifo = self.inbound[peer]
        ctl, hdr, tail, request = fifo.ctl, fifo.hdr, self.read_tail[peer], None
        while request is None or request.pos < n:
            if ctl[HEAD] <= tail and not self._landed(peer, tail):
                if request is None:
                    return False
                self.current[peer] = request   # `_pull` goes on from there
                self.active_in.add(peer)
                return request
            slot = tail % self.slots
            field = slot * HEADER_FIELDS   # (a memoryview's words: a tenth of numpy's cost to read)
            got_tag, message_bytes, offset, size = hdr[field], hdr[field + 1], hdr[field + 2], hdr[field + 3]
            if request is None and size in ADDRESSED:
                if got_tag != tag or message_bytes != n or not self.cma:
                    return False
                request = In(peer, tag, buf, reducer, helpable=helpable)
                if self._ask_help(peer, request, offset, size == RENDEZVOUS_PUSHABLE):
                    return request         # (installed as `peer`'s current message)
                self.peer_memory.read(peer, request, offset)
                self._consume_rendezvous(peer, fifo, request, tail)
                return True
            if request is None and size == n and got_tag == tag and message_bytes == n:
                if n:   # one slot: no request at all
                    incoming = np.frombuffer(fifo.raw, buf.dtype, buf.shape[0], slot * self.chunk)
                    if reducer is None:
                        np.copyto(buf, incoming)
                    else:
                        reducer(buf, incoming)
                self.read_tail[peer] = tail + 1
                ctl[TAIL] = tail + 1       # the slot is free again
                return True
            if (got_tag != tag or message_bytes != n or offset != (0 if request is None else request.pos)
                    or not 0 < size <= self.chunk or offset + size > n):
                if request is None:
                    return False           # another message first, or a mismatch: _pull sorts it out
                raise chunk_mismatch(self.rank, peer, request, (got_tag, message_bytes, offset, size))
            if request is None:
                request = In(peer, tag, buf, reducer)
            request.take(fifo.data[slot, :size])
            tail += 1
            self.read_tail[peer] = tail    # (kept as it goes: an error above leaves the FIFO consistent)
            ctl[TAIL] = tail               # the slot is free again
        return True
