"""`ShmTransport`: posting and progress over the FIFOs of `fifo` (which receive a message goes to:
`matching`).

Each rank owns one segment: a header page (`liveness`), then an inbound FIFO from every rank. A
message below the rendezvous size (`options`) is cut into chunks that pipeline through the
receiver's slots; a bigger one goes as one header naming the sender's buffer, read whole by the
receiver (`rendezvous`); a synchronous send waits for its match (`synchronous`). Posted requests
move in `progress` passes, which `wait_all` drives with its deadline and liveness checks; the
blocking `sendrecv` first tries the request-free `direct` path. One lock makes it safe from
several threads. x86-64 only: ordering relies on its total store order (data stored before head is
seen before head), and numpy's stores are plain stores.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from .. import cma, registered
from ..base import Backoff, Exchange, Reducer, Request, Transport, check_buffer, timeout_error
from ..errors import TransportError
from ..segment import Segment
from .direct import DirectPath
from .fifo import (
    ADDRESSED,
    HEAD,
    HEADER_FIELDS,
    RENDEZVOUS_CHUNK,
    RENDEZVOUS_MAPPED,
    RENDEZVOUS_PUSHABLE,
    TAIL,
    Fifo,
    In,
    Out,
    chunk_mismatch,
    fifo_bytes,
)
from .help import Handshake
from .liveness import HEADER_PAGE, LIVENESS_PERIOD_S, GroupLiveness
from .matching import Matching
from .options import (
    DEFAULT_OPTIONS,
    NEVER,
    ShmOptions,
    exchange_huge_bytes,
    exchange_rendezvous_bytes,
    fifo_geometry,
    rendezvous_bytes,
)
from .rendezvous import PeerMemory, probe_mapping, probe_region
from .synchronous import Synchronous

# A waiting rank's polls before it first yields its core when ranks outnumber cores (else
# `Backoff.SPIN_POLLS`): the rank it waits for may be the one that needs the core.
OVERSUBSCRIBED_SPIN_POLLS = 5


class ShmTransport(Matching, Synchronous, DirectPath, Handshake, GroupLiveness, Transport):
    """One process's end of a shared-memory group (x86-64, one machine).

    Safe to use from several threads at once: one lock, held while posting, for each progress
    pass and for the direct path's attempts, never while a wait pauses.
    """

    name = "shm"
    SETUP_ROUNDS = 2   # the exchanges __init__ makes (a rank outside a new group makes them empty)

    def __init__(self, rank: int, size: int, exchange: Exchange,
                 options: ShmOptions = DEFAULT_OPTIONS) -> None:
        """Collective over the group: map every rank's segment and probe how big messages may move.

        Args:
            rank: this process's rank in the group.
            size: the group's size.
            exchange: all-gathers small bytes over the group (the setup's two rounds).
            options: FIFO geometry and protocols; the same on every rank.

        Raises:
            TransportError: not x86-64, /dev/shm too small, or ranks with different geometries.
        """
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise TransportError(f"the shm transport relies on x86-64 store ordering; this is "
                                 f"{platform.machine()} (use the mpi transport)")
        self.rank, self.size, self.options = rank, size, options
        self.chunk, self.slots = fifo_geometry(size, options)
        one_fifo = fifo_bytes(self.chunk, self.slots)
        self.segment = Segment.create(HEADER_PAGE + one_fifo * size, options.job)
        self.peers: list[Segment] = []
        try:
            # Everyone learns everyone's segment name and pid, maps them, and says so; only then
            # does each owner unlink its own, so that a crash from here on leaks nothing.
            probe = np.array([os.getpid()], np.int64)   # read by peers to test cross-memory attach
            region = probe_region(options.map_registered)   # and mapped, to test registered memory
            probe_fd = -1 if region is None else registered.region_of(region.ctypes.data, 8).fd
            mine = (struct.pack("<qqqq", os.getpid(), one_fifo, probe.ctypes.data, probe_fd)
                    + self.segment.name.encode())
            table = exchange(mine)
            self.pids = [struct.unpack("<qqqq", entry[:32])[0] for entry in table]
            readable = mappable = True
            for peer, entry in enumerate(table):
                pid, peer_fifo_bytes, probe_address, peer_probe_fd = struct.unpack("<qqqq", entry[:32])
                if peer_fifo_bytes != one_fifo:
                    raise TransportError(f"rank {peer} uses another FIFO geometry; set COLLS_SHM_* alike")
                self.peers.append(self.segment if peer == rank
                                  else Segment.attach(entry[32:].decode(), HEADER_PAGE + one_fifo * size))
                readable = readable and (peer == rank or (options.cross_memory_attach
                                                          and cma.probe(pid, probe_address, pid)))
                mappable = mappable and (peer == rank or (region is not None
                                                          and probe_mapping(pid, peer_probe_fd)))
            # big messages go by cross-memory attach only if every rank can read every peer, and
            # those in registered memory by mapping only if every rank can map every peer's (and
            # which CPUs each rank may run on: the group's cores are their union)
            cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))).encode()
            verdicts = exchange(b"mapped" + bytes([readable, mappable]) + cpus)
            self.cma = size > 1 and all(entry[6] == 1 for entry in verdicts)
            self.mappable = size > 1 and all(entry[7] == 1 for entry in verdicts)
            self.cores = len({cpu for entry in verdicts for cpu in entry[8:].decode().split(",") if cpu})
            del region   # every peer has probed it: the verdicts came after
        finally:
            self.segment.unlink()
        self.capabilities = dataclasses.replace(self.capabilities, maps_registered_memory=self.mappable,
                                                registered_from_bytes=options.mapped_bytes)
        self.abort_words = [segment.array[:16].view(np.int64) for segment in self.peers]
        # inbound[p]: the FIFO from p in my segment; outbound[p]: the FIFO to p in p's segment
        self.inbound = [Fifo(self.segment.array, HEADER_PAGE + p * one_fifo, self.chunk, self.slots)
                        for p in range(size)]
        self.outbound = [Fifo(self.peers[p].array, HEADER_PAGE + rank * one_fifo, self.chunk, self.slots)
                         for p in range(size)]
        self.sent_head = [0] * size      # my copy of outbound head (I am its only writer)
        self.read_tail = [0] * size      # my copy of inbound tail (I am its only writer)
        self.sends: list[deque[Out]] = [deque() for _ in range(size)]
        self.posted: list[list[In]] = [[] for _ in range(size)]   # receives naming their source
        self.wild: list[In] = []                                   # ANY_SOURCE receives
        self.posts = 0                                             # receives posted (their `seq`)
        self.lock = threading.Lock()
        self._acquire, self._release = self.lock.acquire, self.lock.release
        self.current: list[In | None] = [None] * size
        self.stashed: list[list[In]] = [[] for _ in range(size)]
        self.active_out: set[int] = set()
        self.active_in: set[int] = set()
        self.rendezvous_posted = [0] * size         # rendezvous sends I published, per peer
        self.acks_given = [0] * size                # rendezvous messages I consumed, per peer
        self.awaiting: list[list[Out]] = [[] for _ in range(size)]   # rendezvous sends not yet acked
        self.unmatched: list[dict] = [{} for _ in range(size)]     # synchronous sends by id (`synchronous`)
        self.peer_memory = PeerMemory(rank, self.pids, self._lost)
        self._init_help()
        # more ranks than CPUs among those the ranks may use: they take turns on the cores
        shared_cores = size > self.cores
        self.spin_polls = OVERSUBSCRIBED_SPIN_POLLS if shared_cores else Backoff.SPIN_POLLS
        geometry = (self.chunk, self.slots)
        self.rendezvous_bytes = rendezvous_bytes(*geometry) if self.cma else NEVER
        self.exchange_rendezvous_bytes = (exchange_rendezvous_bytes(*geometry, False, shared_cores)
                                          if self.cma else NEVER)
        self.reduce_exchange_rendezvous_bytes = (exchange_rendezvous_bytes(*geometry, True, shared_cores)
                                                 if self.cma else NEVER)
        self.exchange_huge_bytes = exchange_huge_bytes(*geometry, shared_cores) if self.cma else NEVER
        self.capabilities = dataclasses.replace(
            self.capabilities, spin_polls=self.spin_polls,
            **{name: 0 if value == NEVER else value for name, value in (
                ("send_address_from_bytes", self.rendezvous_bytes),
                ("exchange_address_from_bytes", self.exchange_rendezvous_bytes),
                ("reduce_exchange_address_from_bytes", self.reduce_exchange_rendezvous_bytes),
                ("huge_exchange_address_from_bytes", self.exchange_huge_bytes))})
        self.closed = False

    # -- posting ---------------------------------------------------------------------------------

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """A message below the rendezvous size whose slots are free is written and published at
        once (a request born done); anything else is queued and pushed as slots free up."""
        check_buffer(buf, "shm send")
        region = self._registered(buf)   # (looked up once: a registered message goes by its region)
        self._acquire()
        try:
            if region is None and self._send_now(buf, peer, tag):
                sent = Request("send", peer, tag, buf.nbytes)
                sent.done = True
                return sent
            return self._isend(buf, peer, tag, buf.nbytes >= self.rendezvous_bytes, region)
        finally:
            self._release()

    def _isend(self, buf: np.ndarray, peer: int, tag: int, rendezvous: bool,
               region: registered.Region | None = None, pushable: bool = False) -> Out:
        request = Out(peer, tag, buf, rendezvous, region, pushable)
        if request.rendezvous and not self.sends[peer] and self._post_address(request):
            return request
        self.sends[peer].append(request)
        self.active_out.add(peer)
        self._push(peer)  # start right away: the first chunks go out before anyone waits
        return request

    def _post_address(self, send: Out) -> bool:
        """Publish the header of a rendezvous send (its buffer's address, or its place in registered
        memory) in the next slot to its peer, if one is free; the send then waits for the peer's
        ack (`_collect_acks`)."""
        peer = send.peer
        fifo = self.outbound[peer]
        ctl = fifo.ctl
        head = self.sent_head[peer]
        if head - ctl[TAIL] >= self.slots:
            return False
        address, region, slot = cma.address_of(send.data), send.region, head % self.slots
        hdr, field = fifo.hdr, slot * HEADER_FIELDS
        hdr[field] = send.tag
        hdr[field + 1] = send.nbytes
        hdr[field + 2] = address
        if region is None:
            hdr[field + 3] = RENDEZVOUS_PUSHABLE if send.pushable else RENDEZVOUS_CHUNK
        else:   # the receiver maps the region (once) and copies out of it
            words, at = fifo.words, slot * self.chunk // 8
            words[at] = region.id
            words[at + 1] = region.fd
            words[at + 2] = address - region.base
            words[at + 3] = region.size
            hdr[field + 3] = RENDEZVOUS_MAPPED
        self.sent_head[peer] = head + 1
        ctl[HEAD] = head + 1               # publish (x86 keeps the stores above before this one)
        send.started = True
        send.pos = send.nbytes
        self.rendezvous_posted[peer] += 1
        send.ack = self.rendezvous_posted[peer]
        self.awaiting[peer].append(send)
        self.active_out.add(peer)
        return True

    def _registered(self, buf: np.ndarray) -> registered.Region | None:
        """The registered region `buf` lies in, if it is big enough to go so and peers can map it."""
        n = buf.nbytes
        if n < self.options.mapped_bytes or not self.mappable or not registered.held():   # (no address made)
            return None
        return registered.region_of(cma.address_of(buf), n)

    # -- the blocking step -----------------------------------------------------------------------

    def sendrecv(self, send_buf: np.ndarray | None, dst: int, recv_buf: np.ndarray | None, src: int,
                 tag: int, deadline: float, reducer: Reducer | None = None) -> None:
        """`Transport.sendrecv`, by the direct path where it can (`direct`). In place, a message of
        one slot is copied into the slot before the receive, so it needs no scratch copy."""
        if recv_buf is None:
            if send_buf is not None:
                self.wait_all([self.isend(send_buf, dst, tag)], deadline)
            return
        check_buffer(recv_buf, "shm receive")   # (before any byte moves)
        if send_buf is not None and send_buf is not recv_buf:
            check_buffer(send_buf, "shm send")
        self._acquire()
        try:
            if send_buf is None:
                send = None
            elif send_buf is recv_buf:
                if (recv_buf.nbytes > self.chunk or self._registered(recv_buf) is not None
                        or not self._send_now(recv_buf, dst, tag)):
                    send_buf = recv_buf.copy()
                    send = self._exchange_send(send_buf, dst, tag, reducer is not None)
                else:
                    send = None   # (sent: the buffer is free to receive into)
            else:
                send = self._exchange_send(send_buf, dst, tag, reducer is not None, recv_buf)
            waits = self._exchange_receive(send, recv_buf, src, tag, reducer)
        finally:
            self._release()
        if waits:
            self.wait_all(waits, deadline)

    def _exchange_send(self, send_buf: np.ndarray, dst: int, tag: int, reducing: bool,
                       into: np.ndarray | None = None) -> Out | None:
        """A sendrecv's send, by the exchange thresholds: written into the slots now (None) or
        posted. Both ranks of an exchange copy at once, so the slots win up to larger sizes than
        for a send alone (`options.exchange_rendezvous_bytes`). A plain one in small pages, `into`
        (my receive) in huge ones, goes by address for its receiver to have me write it (`help`):
        its receive buffer is most likely laid out as mine."""
        n = send_buf.nbytes
        if not reducing and into is not None and self._pushes(send_buf, into, tag):
            return self._isend(send_buf, dst, tag, True, pushable=True)
        if reducing:
            rendezvous = n >= self.reduce_exchange_rendezvous_bytes
        else:
            rendezvous = n >= self.exchange_rendezvous_bytes or (n >= self.exchange_huge_bytes
                                                                 and cma.in_huge_pages(send_buf))
        region = self._registered(send_buf)
        if not rendezvous and region is None and self._send_now(send_buf, dst, tag):
            return None
        return self._isend(send_buf, dst, tag, rendezvous, region)

    def _exchange_receive(self, send: Out | None, recv_buf: np.ndarray, src: int, tag: int,
                          reducer: Reducer | None) -> list[Request]:
        """A sendrecv's receive, straight out of the slots or the sender where it can (the lock
        held; from ANY_SOURCE: posted); returns what is left to wait for: the receive, and `send`
        (None: nothing)."""
        taken = src >= 0 and self._receive_now(recv_buf, src, tag, reducer, helpable=send is None)
        if taken is True:
            if send is None:
                return []
            if not send.done and send.ack:
                self._spin_for_ack(send)
            return [] if send.done else [send]
        receive = taken or self._post(In(src, tag, recv_buf, reducer, helpable=send is None))
        return [receive] if send is None else [send, receive]

    # -- the general path ------------------------------------------------------------------------

    def _push(self, peer: int) -> bool:
        """Copy as many chunks of queued sends to `peer` as there are free slots; a rendezvous send
        takes one slot holding where its buffer is, and completes when its receiver acks."""
        fifo, queue = self.outbound[peer], self.sends[peer]
        head, chunk, slots = self.sent_head[peer], self.chunk, self.slots
        moved = self._collect_acks(peer)
        while queue:
            send = queue[0]
            free = slots - (head - int(fifo.control[TAIL]))
            if send.rendezvous and not send.started:
                if free <= 0:
                    break
                self.sent_head[peer] = head
                self._post_address(send)
                head = self.sent_head[peer]
                queue.popleft()
                moved = True
                continue
            while free > 0 and (send.pos < send.nbytes or not send.started):
                n = min(chunk, send.nbytes - send.pos)
                slot = head % slots
                fifo.headers[slot] = (send.tag, send.nbytes, send.pos, n)
                if n:
                    fifo.data[slot, :n] = send.data[send.pos:send.pos + n]
                send.pos += n
                send.started = True
                head += 1
                free -= 1
                fifo.control[HEAD] = head   # publish each chunk at once so the receiver can start
                moved = True
            if send.pos < send.nbytes or not send.started:
                break
            send.done = True
            queue.popleft()
        self.sent_head[peer] = head
        if peer == self.rank and (queue or self.awaiting[peer]):   # I am their receiver: what my
            moved |= self._pull(peer)                                # receives do not take waits aside
            while self._take_aside(peer):
                moved = True
        if not queue and not self.awaiting[peer]:
            self.active_out.discard(peer)
        return moved

    def _pull(self, peer: int) -> bool:
        """Consume the chunks that `peer` has published, into matching receives."""
        fifo = self.inbound[peer]
        moved = self.helping[peer] != 0
        if moved and not self._finish_helped(peer):
            return False
        tail = self.read_tail[peer]
        head = int(fifo.control[HEAD])
        while tail < head:
            slot = tail % self.slots
            tag, message_bytes, offset, n = fifo.headers[slot].tolist()
            request = self.current[peer]
            if request is None:
                request = self._match(peer, tag, message_bytes)
                if request is None:
                    break                  # nobody wants it yet: leave it in the FIFO
                self.current[peer] = request
            whole = request.pos == 0 and message_bytes == request.size
            if n in ADDRESSED and self.cma and whole:
                if self._ask_help(peer, request, offset, n == RENDEZVOUS_PUSHABLE):
                    self.read_tail[peer] = tail
                    return True            # (`_finish_helped` ends it)
                self.peer_memory.read(peer, request, offset)
                tail = self._consume_rendezvous(peer, fifo, request, tail)
                moved = True
                continue
            if n == RENDEZVOUS_MAPPED and whole:
                at = slot * self.chunk // 8
                self.peer_memory.read_mapped(peer, request, fifo.words[at:at + 4].tolist())
                tail = self._consume_rendezvous(peer, fifo, request, tail)
                moved = True
                continue
            if (offset != request.pos or n < 0 or n > self.chunk or offset + n > message_bytes
                    or message_bytes != request.size or tag != request.received_tag):   # inline: every chunk
                raise chunk_mismatch(self.rank, peer, request, (tag, message_bytes, offset, n))
            request.take(fifo.data[slot, :n])
            tail += 1
            fifo.control[TAIL] = tail
            moved = True
            if request.pos >= request.size:
                request.done = True
                self.current[peer] = None
                if request.stash:
                    self._serve_stash(peer)
        self.read_tail[peer] = tail
        if not self.posted[peer] and self.current[peer] is None and not self.wild:
            self.active_in.discard(peer)
        return moved

    def progress(self) -> bool:
        """One pass over every active FIFO; true if anything moved."""
        moved = False
        for peer in tuple(self.active_out):
            moved |= self._push(peer)
        for peer in tuple(self.active_in):
            moved |= self._pull(peer)
        return moved

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        """`Transport.wait_all`; raises a done request's `error` (a truncated receive) once all are
        done. Each progress pass holds the lock, the pauses between them do not."""
        for request in requests:   # nothing to wait for: no progress pass and no clock
            if not request.done:
                break
        else:
            for request in requests:
                if request.error is not None:
                    raise request.error
            return
        backoff = Backoff(self.spin_polls)
        next_liveness = time.monotonic() + LIVENESS_PERIOD_S
        acquire, release = self._acquire, self._release   # (a `with` costs twice as much)
        try:
            while True:
                acquire()
                try:
                    moved = self.progress()
                finally:
                    release()
                if moved:
                    backoff.reset()
                if all(r.done for r in requests):
                    for request in requests:
                        if request.error is not None:
                            raise request.error
                    return
                now = time.monotonic()
                if now >= deadline:
                    raise timeout_error(requests, deadline)
                if now >= next_liveness:
                    next_liveness = now + LIVENESS_PERIOD_S
                    with self.lock:
                        self.check_fingerprints(requests)
                    self.check_aborted()
                    self._check_alive(requests)
                backoff.pause()
        except BaseException:   # my buffers are given back: no helping sender may write them now
            with self.lock:
                self._withdraw_help(requests)
            raise

    # -- groups and teardown ---------------------------------------------------------------------

    def subgroup(self, ranks: Sequence[int], exchange: Exchange) -> Transport | None:
        return shm_group(self.rank, ranks, exchange, options=self.options)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.inbound = self.outbound = self.abort_words = []
        self.peer_memory.close()
        for segment in self.peers:
            if segment is not self.segment:
                segment.close()
        self.segment.close()


def shm_group(rank: int, ranks: Sequence[int], exchange: Exchange, kind: type[ShmTransport] | None = None,
              **options) -> ShmTransport | None:
    """A shared-memory transport (or one of `kind`, a subclass) for the group `ranks` of a parent
    group (of any transport) in which this process is rank `rank`; collective over the parent,
    whose `exchange` carries the new group's setup rounds, each member picking out its group's
    entries. `options`: the keyword arguments of `kind`. None outside.

    Returns:
        The transport for this rank's group, or None if `ranks` is empty.
    """
    kind = ShmTransport if kind is None else kind
    members = list(ranks)

    def group_exchange(data: bytes) -> list[bytes]:
        table = exchange(data if members else b"")
        return [table[r] for r in members]

    if not members:
        for _ in range(kind.SETUP_ROUNDS):   # the rounds the members make (segment names, "mapped", ...)
            group_exchange(b"")
        return None
    return kind(members.index(rank), len(members), group_exchange, **options)
