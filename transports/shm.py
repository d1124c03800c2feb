"""The `shm` transport: processes on one machine exchanging chunks through POSIX shared memory.

Each rank owns one segment holding an inbound FIFO from every rank (itself included): a control
block (head, written by the sender; tail, written by the receiver; each on its own cache line), a
header per slot (tag, message bytes, offset, chunk bytes) and `slots` data slots of `chunk_bytes`.
A message is cut into chunks; the sender copies a chunk into a free slot and publishes it by bumping
head, the receiver copies (or, for `irecv_reduce`, reduces) straight out of the slot and frees it by
bumping tail. With several slots in flight the two sides overlap, so a large message pipelines.
Segments are made once per communicator; nothing is allocated per call on the hot path.

Ordering relies on x86's total store order (data stored before head is seen before head); numpy's
stores are plain stores, so this transport is for x86-64 only until fences are added.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import platform
import struct
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from . import cma, registered
from .adaptive import TIMED, ProtocolChoice
from .base import (
    COLLECTIVE_TAG_BASE,
    Backoff,
    Exchange,
    Reducer,
    Request,
    Transport,
    check_buffer,
    env_number,
    process_alive,
    read_tune_file,
    timeout_error,
)
from .errors import CollectiveMismatch, CommunicatorAborted, PeerLost, TransportError
from .segment import Segment

# a cache line each: head at byte 0 (the sender's), tail at 64 and rendezvous acks at 128 (the
# receiver's), a request to help with a rendezvous copy at 192 (the receiver's: the message's ack
# number, the address to write to, the offset and bytes to write, and where the target lies in
# registered memory: region id, descriptor (-1: not registered), offset, region bytes) and the help
# done at 256 (the sender's: the ack number of the last message it helped with)
CONTROL_BYTES = 320
HELP_ASK, HELP_DONE = 24, 32   # int64 indices of those two lines
HELP_WITHDRAWN = -1            # the bytes word of a request to help that its receiver gave up on
HEADER_FIELDS = 4            # tag, message bytes, offset, chunk bytes
ALIGN = 4096
HEADER_PAGE = 4096           # the segment's first page: the abort and lost-rank words, abort reason
ABORT_REASON_OFFSET = 64     # where in my header page my abort() writes its reason (UTF-8)
# the header page's last bytes, in rank 0's segment: for each kind of call (`begin_call`) a byte,
# 0 while rank 0 has not chosen, else 1 + the way it has chosen for all ranks
CHOICES_OFFSET = HEADER_PAGE - 512
REPORT_OFFSET = CHOICES_OFFSET - 64   # each rank's last two timed calls (`end_call`), a line
ATTACH_ALL_BYTES = 64 << 10  # a call that goes by cross-memory attach (`begin_call`) does so from here
NEVER = 1 << 62              # a size no message reaches
STEADY_GAP_S = 1e-3          # a call this soon after one of its kind is timed for the choice
PER_RANK_BUDGET = 16 << 20   # at most this much inbound FIFO per rank unless told otherwise
LIVENESS_PERIOD_S = 0.2
RENDEZVOUS_CHUNK = -1        # a header whose chunk bytes are -1 carries the sender's buffer address
# a header whose chunk bytes are -2 is a message in registered memory (`transports.registered`):
# its slot holds the region's id, descriptor, the message's offset in it and the region's bytes
RENDEZVOUS_MAPPED = -2
# a header whose chunk bytes are -3 carries the address of an exchange's send in small pages whose
# receiver may ask its sender to write it all (`PUSH_FROM_BYTES`)
RENDEZVOUS_PUSHABLE = -3
ADDRESSED = (RENDEZVOUS_CHUNK, RENDEZVOUS_PUSHABLE)   # the headers that carry the buffer's address
# a send from registered memory goes so from here; below, through the slots (one copy each side, no
# handshake). 2026-12-05, a 2-rank exchange, slots / mapped: 128 KiB 16.7 / 18.2 us and 512 KiB 38.1
# / 31.2 in the machine's fast state, 128 KiB 53.1 / 20.4 and 512 KiB 257.2 / 30.9 in its slow one
# (`transports.registered`); `COLLS_SHM_MAPPED=0` turns it off
MAPPED_BYTES = env_number("COLLS_SHM_MAPPED_BYTES", 128 << 10)
MAPPED_CACHE = 8             # peers' regions a rank keeps mapped, per peer (the least recent goes)
# Slow slots. On a VM whose host sometimes places its two vCPUs far apart, a store to a line the
# other core holds costs ~26 ns, one after another: writing 1 MiB that the peer had read took 430 us
# in that state against 54 us otherwise, and 23 us for memory the peer never read (2026-12-05). A
# FIFO's slots are such memory (the receiver read them last time round); a sender's own buffer,
# read by the receiver by cross-memory attach, is not. So a rank times its copies of 64 KiB or more
# into slots; when SLOW_OF of its last SLOW_WINDOW were slower than 8 GB/s (COLLS_SHM_SLOW_SLOT_GBPS;
# 2.3-2.4 GB/s in the slow state, 35-41 otherwise), it sends its messages of 64 KiB or more by
# cross-memory attach for SLOW_HOLD_S, then tries the slots again (where every rank has a core of
# its own; with more ranks than cores, never: see `ShmTransport.__init__`). Reducing exchanges only from
# SLOW_REDUCE_FROM_BYTES: both ranks then write what the other reads whichever the way (a 2-rank
# 256 KiB all_reduce in the slow state: 142 us through the slots, ~200 by attach; 1 MiB: 545 / 430)
SLOW_FROM_BYTES = 64 << 10
SLOW_REDUCE_FROM_BYTES = 512 << 10
SLOW_WINDOW, SLOW_OF = 8, 5
SLOW_HOLD_S = 0.5
REDUCE_PIECE_BYTES = 256 << 10   # a rendezvous receive-reduce reads the sender's buffer in such pieces
HELP_BYTES = env_number("COLLS_SHM_HELP_BYTES", 1 << 20)   # see ShmTransport._ask_help
# An exchange's message sent from small pages into a buffer in huge pages goes by cross-memory
# attach from this size, written by its sender rather than read by its receiver: a process_vm_*
# call pins the other process's pages, 512 times fewer where they are huge. 2026-12-05, 2 ranks,
# both at once, sends in small pages into receive buffers in huge ones (`bench/push_pull.py`), us:
# read / written 256 KiB 26.1-26.5 / 15.2-15.3, 512 KiB 47.3-47.7 / 27.3-27.6, 1 MiB 86.3-87.2 /
# 47.5, 2 MiB 165.8-166.4 / 83.6-84.0 (MPI's Sendrecv 24.5, 45.5, 84.3-85.2, 162.7-162.9); between
# buffers in huge pages, 4 MiB 163-166 either way. With the send rewritten before each exchange
# (`--fresh`), 256 KiB was slower written: 37.2-37.5 against 28.5-28.7; 512 KiB 43.7 / 49.7-50.0.
PUSH_FROM_BYTES = env_number("COLLS_SHM_PUSH_BYTES", 512 << 10)
# A waiting rank's polls before it first yields when ranks outnumber cores (else `Backoff.SPIN_POLLS`,
# 50: 25-34 us of the general wait's polls, during which a peer sharing the core cannot run). 4 ranks
# on 2 cores, 16 B, slowest rank's median of 300 (us; 50 / 5 polls; MPI 21-29): reduce_scatter
# recursive_halving 198 / 131-140, all_to_all direct 236-239 / 114-119, reduce ring 232 / 108-128,
# all_reduce tree 310-313 / 191-227, recursive_doubling 57-58 / 53-54 (`COLLS_SHM_SPIN_POLLS` sets it)
OVERSUBSCRIBED_SPIN_POLLS = 5
# polls of `ShmTransport._wait_written`'s loop (a few tenths of a microsecond each) with nothing
# moving, before the general wait takes over
WRITE_WAIT_POLLS = 500
ONE_SLOT_POLLS = 200             # polls a one-slot receive makes for its message before it posts one


def exchange_rendezvous_bytes(chunk: int, slots: int, size: int, reducing: bool = False,
                              cores: int | None = None, slots_first: bool = False) -> int:
    """A sendrecv's message at least this large moves by cross-memory attach (`reducing`: one whose
    receive is a reduction; a smaller one too where it is to be written by its sender,
    `PUSH_FROM_BYTES`): when every rank of the group can have a core of its own, from what
    `colls tune` measured (`tuned_exchange_bytes`; `COLLS_SHM_EXCHANGE_CMA_BYTES` and
    `COLLS_SHM_REDUCE_EXCHANGE_CMA_BYTES` override it) or by default from 4 MiB (plain) or 16 MiB
    (reducing), through the FIFO below, however many slots it takes; with more
    ranks than `cores` (default: the cores this process may use), the FIFO's threshold
    (`rendezvous_bytes`: a pull needs its receiver to run, a FIFO send goes out while it waits).

    In an exchange both ranks copy at once. Measured 2026-12-04, 2 ranks on 2 cores, 256 KiB x 4
    slots (`colls.tune.exchange_seconds`, medians of 300, two runs): plain, through the FIFO
    against cross-memory attach, 512 KiB 29 against 50 us, 1 MiB 52 / 87, 2 MiB 100-104 /
    154-159, 4 MiB 203-216 / 197-202, 16 MiB 1295-1362 / 1166-1191; a float32 sum, 1 MiB 77-79 /
    122-123, 2 MiB 151-155 / 233-241, 4 MiB 296-313 / 356-367, 16 MiB 1716-1796 / 1735-1747.
    Two reads at once ran at 11-13 GB/s each where the slots' copies stay in cache. (On
    2026-12-03's machine a plain 512 KiB exchange was the other way round: 68-71 us through the
    FIFO, 35 us by cross-memory attach.)

    `slots_first`: a tuned threshold no lower than the default, for a transport that chooses its
    way per kind of call (`ShmTransport.begin_call`): there the other way is cross-memory attach
    throughout, so the thresholds' way keeps the slots as far as the tune or the default says. (A
    tune measures in the state the machine is in: 2026-12-05, two tunes in the slow state put both
    thresholds at 512 KiB, and the benches after them ran in the fast state, where the slots
    were faster from 512 KiB to 4 MiB.)"""
    fifo = rendezvous_bytes(chunk, slots)
    if size > (cores if cores is not None else len(os.sched_getaffinity(0))):
        return fifo
    kind = "reducing" if reducing else "plain"
    variable = "COLLS_SHM_REDUCE_EXCHANGE_CMA_BYTES" if reducing else "COLLS_SHM_EXCHANGE_CMA_BYTES"
    given = os.environ.get(variable, "").strip()
    if given:   # (set but empty: as if unset)
        try:
            return int(given)
        except ValueError:
            raise ValueError(f"{variable}={given!r}: give the size in bytes, an integer") from None
    tuned = tuned_exchange_bytes().get(kind)
    default = max(fifo, (16 << 20) if reducing else (4 << 20))
    if tuned is None:
        return default
    return max(tuned, default) if slots_first else tuned


def tuned_exchange_bytes() -> dict[str, int]:
    """The exchange thresholds `colls tune` measured on this machine ({"plain": bytes, "reducing":
    bytes, "plain_huge": bytes}; `colls.tune.exchange_crossover`), from the tune file; empty if it
    has none."""
    entry = read_tune_file().get("shm")
    found = entry.get("exchange_cma") if isinstance(entry, dict) else None
    if not isinstance(found, dict):
        return {}
    return {kind: int(found[kind]) for kind in ("plain", "reducing", "plain_huge")
            if isinstance(found.get(kind), int) and found[kind] > 0}


HUGE_EXCHANGE_BYTES = 2 << 20   # `exchange_huge_bytes` where no tune says


def exchange_huge_bytes(chunk: int, slots: int, size: int, cores: int | None = None,
                        slots_first: bool = False) -> int:
    """A plain sendrecv's message at least this large moves by cross-memory attach when it is sent
    from transparent huge pages (`cma.in_huge_pages`), whatever `exchange_rendezvous_bytes` says:
    the receiver's read then pins 512 times fewer pages. From what `colls tune` measured on buffers
    in huge pages ("plain_huge"), else from 2 MiB (`HUGE_EXCHANGE_BYTES`); never above
    `exchange_rendezvous_bytes` (`COLLS_SHM_EXCHANGE_CMA_BYTES` sets both). Measured 2026-12-05,
    2 ranks, slots against cross-memory attach (us): 2 MiB 155 / 98 from huge pages and 152 / 177
    from small ones, 4 MiB 325 / 186 and 331 / 363, 8 MiB 815 / 521 and 884 / 1182; 1 MiB 81 / 98
    either way. Reducing exchanges stayed faster through the slots from huge pages too (2 MiB 154
    / 197), so they have one threshold."""
    plain = exchange_rendezvous_bytes(chunk, slots, size, cores=cores, slots_first=slots_first)
    if (slots_first or os.environ.get("COLLS_SHM_EXCHANGE_CMA_BYTES", "").strip()
            or size > (cores if cores is not None else len(os.sched_getaffinity(0)))):
        return plain
    return min(tuned_exchange_bytes().get("plain_huge", HUGE_EXCHANGE_BYTES), plain)


def rendezvous_bytes(chunk: int, slots: int) -> int:
    """Messages at least this large move by cross-memory attach when every rank can use it: by
    default those that would fill the whole FIFO (1 MiB with 4 slots of 256 KiB), at least 64 KiB.

    Below that, copying through the slots wins on this machine even though it copies twice: the
    two sides pipeline, and a process_vm_readv pins the sender's pages on every call. Measured
    2026-12-03 (bench/RESULTS.md): with the threshold at 64 KiB a 2-rank all_reduce of 128-512 KiB
    ran 0.45-0.75x MPICH, at 1 MiB 0.94-1.17x; 4 ranks at 256 KiB 0.29x, at 1 MiB 0.85x."""
    default = max(64 << 10, chunk * slots)
    return env_number("COLLS_SHM_CMA_BYTES", default)


def fifo_geometry(size: int) -> tuple[int, int]:
    """(chunk_bytes, slots) for a group of `size`: 256 KiB x 4, shrunk so big groups fit /dev/shm."""
    slots = env_number("COLLS_SHM_SLOTS", 4)
    chunk = env_number("COLLS_SHM_CHUNK_BYTES", 0)
    if chunk <= 0:
        chunk = min(256 << 10, PER_RANK_BUDGET // (size * slots))
        chunk = max(16 << 10, chunk // ALIGN * ALIGN)
    if chunk % 64 or slots < 1:
        raise TransportError(f"COLLS_SHM_CHUNK_BYTES must be a multiple of 64 and COLLS_SHM_SLOTS >= 1, "
                             f"got {chunk} and {slots}")
    return chunk, slots


class _Fifo:
    """Views of one FIFO (one sender, one receiver) inside a segment."""

    __slots__ = ("control", "headers", "data", "ctl", "hdr", "raw", "words")

    def __init__(self, segment: np.ndarray, offset: int, chunk: int, slots: int) -> None:
        self.control = segment[offset:offset + CONTROL_BYTES].view(np.int64)   # [0] head [8] tail ...
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


def _fifo_bytes(chunk: int, slots: int) -> int:
    raw = CONTROL_BYTES + slots * HEADER_FIELDS * 8 + slots * chunk
    return (raw + ALIGN - 1) // ALIGN * ALIGN


class _Out(Request):
    __slots__ = ("data", "pos", "started", "ack", "rendezvous", "region", "pushable")

    def __init__(self, peer: int, tag: int, buf: np.ndarray, rendezvous: bool,
                 region: registered.Region | None = None, pushable: bool = False) -> None:
        super().__init__("send", peer, tag, buf.nbytes)
        self.data = buf.view(np.uint8)
        self.pos = 0
        self.started = False
        self.ack = 0          # for a rendezvous send: the peer's ack count that completes it
        # its receiver reads it out of this process: by cross-memory attach, or out of its mapping
        # of `region` (registered memory); or has me write it (`pushable`, `_help`)
        self.rendezvous = rendezvous or region is not None
        self.region = region
        self.pushable = pushable   # its receiver may ask me to write it all (RENDEZVOUS_PUSHABLE)


class _In(Request):
    __slots__ = ("buf", "data", "reducer", "pos", "stash", "helpable", "exchange", "carry")

    def __init__(self, peer: int, tag: int, buf: np.ndarray, reducer: Reducer | None,
                 stash: bool = False, helpable: bool = True, exchange: bool = False) -> None:
        super().__init__("recv", peer, tag, buf.nbytes)
        self.buf = buf
        self.data = buf.view(np.uint8)
        self.reducer = reducer
        self.pos = 0
        self.stash = stash
        self.helpable = helpable   # its sender may be asked to copy half (see ShmTransport._ask_help)
        self.exchange = exchange   # a sendrecv's: its sender, waiting in it too, may be asked to write it all
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


class ShmTransport(Transport):
    """One process's end of a shared-memory group."""

    name = "shm"
    SETUP_ROUNDS = 2   # the exchanges __init__ makes (a rank outside a new group makes them empty)

    def __init__(self, rank: int, size: int, exchange: Exchange, job: str | None = None) -> None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise TransportError(f"the shm transport relies on x86-64 store ordering; this is "
                                 f"{platform.machine()} (use the mpi transport)")
        self.rank, self.size = rank, size
        self.chunk, self.slots = fifo_geometry(size)
        fifo_bytes = _fifo_bytes(self.chunk, self.slots)
        self.segment = Segment.create(HEADER_PAGE + fifo_bytes * size, job)
        self.peers: list[Segment] = []
        try:
            # Everyone learns everyone's segment name and pid, maps them, and says so; only then
            # does each owner unlink its own, so that a crash from here on leaks nothing.
            probe = np.array([os.getpid()], np.int64)   # read by peers to test cross-memory attach
            probe_region = _probe_region()              # and mapped, to test registered memory
            probe_fd = -1 if probe_region is None else registered.region_of(probe_region.ctypes.data, 8).fd
            mine = (struct.pack("<qqqq", os.getpid(), fifo_bytes, probe.ctypes.data, probe_fd)
                    + self.segment.name.encode())
            table = exchange(mine)
            self.pids = [struct.unpack("<qqqq", entry[:32])[0] for entry in table]
            readable = mappable = True
            for peer, entry in enumerate(table):
                pid, peer_fifo_bytes, probe_address, peer_probe_fd = struct.unpack("<qqqq", entry[:32])
                if peer_fifo_bytes != fifo_bytes:
                    raise TransportError(f"rank {peer} uses another FIFO geometry; set COLLS_SHM_* alike")
                name = entry[32:].decode()
                self.peers.append(self.segment if peer == rank
                                  else Segment.attach(name, HEADER_PAGE + fifo_bytes * size))
                readable = readable and (peer == rank or cma.probe(pid, probe_address, pid))
                mappable = mappable and (peer == rank or _probe_mapping(pid, peer_probe_fd))
            # big messages go by cross-memory attach only if every rank can read every peer, and
            # those in registered memory by mapping only if every rank can map every peer's
            # (and which CPUs each rank may run on: the group's cores are their union)
            cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0))).encode()
            verdicts = exchange(b"mapped" + bytes([readable, mappable]) + cpus)
            self.cma = size > 1 and all(entry[6] == 1 for entry in verdicts)
            self.mappable = size > 1 and all(entry[7] == 1 for entry in verdicts)
            self.capabilities = dataclasses.replace(self.capabilities, maps_registered_memory=self.mappable,
                                                    registered_from_bytes=MAPPED_BYTES)
            self.cores = len({cpu for entry in verdicts for cpu in entry[8:].decode().split(",") if cpu})
            del probe_region   # every peer has probed it: the verdicts came after
        finally:
            self.segment.unlink()
        # inbound[p]: the FIFO from p in my segment; outbound[p]: the FIFO to p in p's segment
        # each segment's first page: [0] = 1 + the rank that aborted the group, [1] = 1 + a rank
        # known to have died (0: none)
        self.abort_words = [segment.array[:16].view(np.int64) for segment in self.peers]
        self.inbound = [_Fifo(self.segment.array, HEADER_PAGE + p * fifo_bytes, self.chunk, self.slots)
                        for p in range(size)]
        self.outbound = [_Fifo(self.peers[p].array, HEADER_PAGE + rank * fifo_bytes, self.chunk, self.slots)
                         for p in range(size)]
        self.sent_head = [0] * size      # my copy of outbound head (I am its only writer)
        self.read_tail = [0] * size      # my copy of inbound tail (I am its only writer)
        self.sends: list[deque[_Out]] = [deque() for _ in range(size)]
        self.posted: list[list[_In]] = [[] for _ in range(size)]
        self.current: list[_In | None] = [None] * size
        self.stashed: list[list[_In]] = [[] for _ in range(size)]
        self.active_out: set[int] = set()
        self.active_in: set[int] = set()
        self.rendezvous_bytes = rendezvous_bytes(self.chunk, self.slots) if self.cma else 1 << 62
        # whether a kind of call may go by cross-memory attach throughout, when that has been faster
        # than the thresholds lately (`begin_call`): with COLLS_SHM_ADAPTIVE=1, where every rank has
        # a core (a pull needs its receiver to run)
        # every rank can have a core of its own: as many CPUs as ranks among those the ranks may
        # use (ranks pinned a CPU each count so; four ranks allowed the same two do not)
        own_cores = size <= self.cores
        # polls a waiting rank makes before it first yields its core: with more ranks than cores the
        # rank it waits for may share its core (OVERSUBSCRIBED_SPIN_POLLS)
        self.spin_polls = env_number("COLLS_SHM_SPIN_POLLS",
                                     Backoff.SPIN_POLLS if own_cores else OVERSUBSCRIBED_SPIN_POLLS)
        if self.spin_polls < 1:
            raise ValueError(f"COLLS_SHM_SPIN_POLLS={self.spin_polls}: give a count of at least 1")
        self.adapting = own_cores and self.cma and os.environ.get("COLLS_SHM_ADAPTIVE", "0") == "1"
        # an exchange's sender may be asked to write its message (PUSH_FROM_BYTES): where it has a
        # core, for it runs its part while its peer waits
        self.pushes = own_cores and self.cma
        self.exchange_rendezvous_bytes = (exchange_rendezvous_bytes(self.chunk, self.slots, size,
                                                                    cores=self.cores,
                                                                    slots_first=self.adapting)
                                          if self.cma else 1 << 62)
        self.reduce_exchange_rendezvous_bytes = (exchange_rendezvous_bytes(self.chunk, self.slots, size, True,
                                                                           cores=self.cores,
                                                                           slots_first=self.adapting)
                                                 if self.cma else 1 << 62)
        self.exchange_huge_bytes = (exchange_huge_bytes(self.chunk, self.slots, size, cores=self.cores,
                                                        slots_first=self.adapting)
                                    if self.cma else 1 << 62)
        self.adaptive = ProtocolChoice()
        self.call_kinds: dict = {}      # key -> its byte in rank 0's table, in order of first call
        # this call sends every message from this size by cross-memory attach (`begin_call`; else never)
        self.attach_from = NEVER
        self.timing: tuple | None = None   # a timed call: (its kind, its way, its number, when it began)
        self.last_call = (-1, 0.0)         # the kind of the last call, and when it ended
        self.pending: tuple | None = None  # rank 0: the last timed call (kind, way, number, seconds)
        # each rank's reports of its last timed calls in its header page: kind, number, nanoseconds
        # for calls of even number at [0:3], of odd number at [4:7]
        self.reports = [segment.array[REPORT_OFFSET:REPORT_OFFSET + 64].view(np.int64)
                        for segment in self.peers]
        self.rendezvous_posted = [0] * size         # rendezvous sends I published, per peer
        self.acks_given = [0] * size                # rendezvous messages I consumed, per peer
        self.awaiting: list[list[_Out]] = [[] for _ in range(size)]   # rendezvous sends not yet acked
        self.helping = [0] * size      # per peer: the ack number of a message its sender is helping copy
        self.helped = [0] * size       # per peer: the ack number of the last message I helped it copy
        self.help_writes = [0] * size  # per peer: how many of my messages I wrote (some or all) into it
        self.piece = np.empty(REDUCE_PIECE_BYTES, np.uint8)
        self.last_received = (0, 0)    # the address range of my last sendrecv's big receive buffer
        self.pidfds: dict[int, int] = {}   # per peer, opened when a registered message first comes
        self.slow_until = 0.0   # while time.monotonic() is below it, big messages avoid the slots
        self.slow_trips = 0     # how often the slots were found slow (`colls.tune.profile` records it)
        # (only where every rank has a core: with more ranks than cores a copy's time includes the
        # turns of the ranks it shares a core with, and a pull waits for its reader to get one. 4
        # ranks on 2 cores, a 512 KiB all_reduce: 540-680 us with the switch, 310 without)
        self.slow_slot_bytes_per_s = (env_number("COLLS_SHM_SLOW_SLOT_GBPS", 8, float) * 1e9
                                      if own_cores else 0.0)
        self.slot_copies: deque[bool] = deque(maxlen=SLOW_WINDOW)   # whether each was slow, last first
        # and the same for my writes of whole messages into other processes (`_pushes`)
        self.push_slow_until = 0.0
        self.push_copies: deque[bool] = deque(maxlen=SLOW_WINDOW)
        self.peer_regions: list[dict[int, np.ndarray]] = [{} for _ in range(size)]   # id -> mapping
        self.peer_targets: list[dict[int, np.ndarray]] = [{} for _ in range(size)]   # the same, writable
        self.closed = False

    # -- the way a kind of call goes -------------------------------------------------------------

    def begin_call(self, key: Hashable) -> None:
        """A blocking call of kind `key` begins (every rank makes it, in the same order): send its
        messages by the size thresholds (way 0) or by cross-memory attach from ATTACH_ALL_BYTES (way
        1), whichever has been faster for this kind lately (`transports.adaptive`). Rank 0 chooses
        for all, by the slowest rank's times (`end_call`): two ranks of an exchange that each chose
        on their own took different ways and ran slower than by either. The others read its choice
        from its header page and try the other way on the same calls.
        (Kinds are numbered in the order of their first blocking call; a rank whose numbering
        differs, say one that ran a call asynchronously where the others blocked, reads another
        kind's choice: its messages still arrive, each message's header says how it moves.)

        Off unless COLLS_SHM_ADAPTIVE=1. In the slow state of 2026-12-05 (bench/RESULTS.md) cross-
        memory attach throughout was 3-5x faster for a 2-rank all_to_all or all_gather of 1-4 MiB,
        and the thresholds 1.3x faster for a reduce_scatter of 1 MiB; in the fast state the
        thresholds won, and the choice took the right way at every point of a probe that ran the
        calls in blocks, at a cost of 1.5-2.5 us a call at 256 KiB (7%) and 3-5% at 4 MiB (its
        tries, and 1.3 us for this method and `end_call`). In `colls bench`, between MPI's and
        Gloo's calls, ten launches of each (2026-12-05 03:18) gave the 4 MiB all_gather 3.3-3.8x
        MPI's speed in the three launches that ran slow, where every launch without it was at
        0.95-1.07x, but the 256 KiB all_to_all 0.70x against 0.83x (medians over the launches),
        so it is not the default."""
        if not self.adapting:
            return
        index = self.call_kinds.get(key)
        if index is None:
            if len(self.call_kinds) >= HEADER_PAGE - CHOICES_OFFSET:
                return   # (a table full of kinds: the rest keep the thresholds)
            index = self.call_kinds[key] = len(self.call_kinds)
        if self.rank == 0:
            before = self.adaptive.preferred(index)
            code = self.adaptive.choose(index, 0)
            if before is not None and self.adaptive.preferred(index) != before:   # (it may decide
                self.segment.array[CHOICES_OFFSET + index] = 1 + self.adaptive.preferred(index)   # there)
        else:
            chosen = int(self.peers[0].array[CHOICES_OFFSET + index])
            code = self.adaptive.choose(index, 0, chosen - 1 if chosen else None)
        self.attach_from = ATTACH_ALL_BYTES if code & 1 else NEVER
        now = time.perf_counter()
        # timed only right after a call of the same kind: the first call after other work (compute,
        # another kind of call, another library's calls in `colls bench`'s rounds) pays for what that
        # work did to the caches, whichever the way. And timed from the end of that call: what the
        # caller does before this one is part of its cost. Timed from here, a 2-rank 1 MiB
        # reduce_scatter (which copies its input before the transport sees the call) took 149-220 us
        # by cross-memory attach and 264-329 us through the slots in the slow state, while whole
        # calls took 375 against 299
        last_kind, last_end = self.last_call
        if code & TIMED and last_kind == index and now - last_end < STEADY_GAP_S:
            self.timing = (index, code & 1, self.adaptive.keys[index].calls, last_end)
        self.last_call = (index, now)

    def end_call(self, completed: bool) -> None:
        """The call `begin_call` announced has returned (`completed`: without an error). Every rank
        reports its timed calls' times in its header page; rank 0 takes the slowest rank's time of
        a call at the end of its next one, by when every rank has reported it (its next call needs
        every rank's data, which they send once this one has returned): a call is done when its
        slowest rank is, and a way that speeds rank 0 may slow another."""
        self.attach_from = NEVER
        now = time.perf_counter()
        self.last_call = (self.last_call[0], now)
        timing, self.timing = self.timing, None
        if self.rank == 0:
            self._record_pending()
            if timing is not None and completed:
                index, way, calls, began = timing
                self.pending = (index, way, calls, now - began)
        elif timing is not None and completed:
            index, way, calls, began = timing
            report, at = self.reports[self.rank], 4 * (calls % 2)
            report[at] = -1                    # being written
            report[at + 1] = calls
            report[at + 2] = int((now - began) * 1e9)
            report[at] = index                 # last (x86 keeps the order of stores)

    def _record_pending(self) -> None:
        """Rank 0: record the last timed call by its slowest rank's time, if every rank timed it."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        index, way, calls, seconds = pending
        at = 4 * (calls % 2)   # (a rank may have reported the call after it too, not the one after that)
        for peer in range(1, self.size):
            report = self.reports[peer]
            if report[at] != index or report[at + 1] != calls:
                return   # a rank that did not time it (other work before it)
            seconds = max(seconds, report[at + 2] / 1e9)
        self.adaptive.record(index, way, seconds, 1, calls)
        self.segment.array[CHOICES_OFFSET + index] = 1 + self.adaptive.preferred(index)

    # -- posting ---------------------------------------------------------------------------------

    def isend(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        """A message below the rendezvous size whose slots are free is written and published at
        once (a request born done); anything else is queued and pushed as slots free up."""
        check_buffer(buf, "shm send")
        n = buf.nbytes
        slow = n >= SLOW_FROM_BYTES and self._slots_slow()
        region = self._registered(buf)   # (looked up once: a registered message goes by its region)
        if not slow and region is None and self._send_now(buf, peer, tag):
            sent = Request("send", peer, tag, n)
            sent.done = True
            return sent
        return self._isend(buf, peer, tag, n >= self.rendezvous_bytes or n >= self.attach_from or slow,
                           region)

    def _isend(self, buf: np.ndarray, peer: int, tag: int, rendezvous: bool,
               region: registered.Region | None = None, pushable: bool = False) -> Request:
        request = _Out(peer, tag, buf, rendezvous, region, pushable)
        if request.rendezvous and not self.sends[peer] and self._post_address(request):
            return request
        self.sends[peer].append(request)
        self.active_out.add(peer)
        self._push(peer)  # start right away: the first chunks go out before anyone waits
        return request

    def _post_address(self, send: _Out) -> bool:
        """Publish the header of a rendezvous send (its buffer's address, or its place in registered
        memory) in the next slot to its peer, if one is free; the send then waits for the peer's
        ack (`_collect_acks`). `_push` does this for a send at the head of the queue, `_isend` for
        one with nothing queued before it, without the queue's round (a big exchange's post)."""
        peer = send.peer
        fifo = self.outbound[peer]
        ctl = fifo.ctl
        head = self.sent_head[peer]
        if head - ctl[8] >= self.slots:
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
        ctl[0] = head + 1                  # publish (x86 keeps the stores above before this one)
        send.started = True
        send.pos = send.nbytes
        posted = self.rendezvous_posted[peer] + 1
        self.rendezvous_posted[peer] = posted
        send.ack = posted
        self.awaiting[peer].append(send)
        self.active_out.add(peer)
        return True

    def irecv(self, buf: np.ndarray, peer: int, tag: int) -> Request:
        check_buffer(buf, "shm receive")
        return self._post(_In(peer, tag, buf, None))

    def irecv_reduce(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer) -> Request:
        check_buffer(buf, "shm receive-reduce")
        return self._post(_In(peer, tag, buf, reducer))

    def _post(self, request: _In) -> Request:
        self.posted[request.peer].append(request)
        self.active_in.add(request.peer)
        self._serve_stash(request.peer)
        return request

    def recv_wait(self, buf: np.ndarray, peer: int, tag: int, deadline: float,
                  reducer: Reducer | None = None) -> None:
        """A message below the rendezvous size, from an idle FIFO, is taken straight out of its
        slots as they land; anything else (or a peer slow to send) through a posted receive."""
        check_buffer(buf, "shm receive")
        taken = buf.ndim == 1 and self._receive_now(buf, peer, tag, reducer)   # (schedules pass flat ones)
        if taken is not True:   # not begun (false), or begun and waiting for its last pieces
            self.wait_all([taken or self._post(_In(peer, tag, buf, reducer))], deadline)

    splits_exchanges = True

    def sendrecv(self, send_buf: np.ndarray | None, dst: int, recv_buf: np.ndarray | None, src: int,
                 tag: int, deadline: float, reducer: Reducer | None = None) -> None:
        """`Transport.sendrecv`. A message below the rendezvous size, to or from an idle FIFO, goes
        without a request: the send is written and published at once, the receive taken straight
        out of the slots as they land. A message by cross-memory attach whose address is there is
        read at once. In place (`recv_buf is send_buf`), a message of one slot is copied into the
        slot before the receive, so it needs no scratch copy. Anything else (queued behind other
        messages, another tag first) takes the general path."""
        if recv_buf is None:
            if send_buf is not None:
                self.wait_all([self.isend(send_buf, dst, tag)], deadline)
            return
        check_buffer(recv_buf, "shm receive")   # (before any byte moves)
        if send_buf is None:
            self.recv_wait(recv_buf, src, tag, deadline, reducer)
        elif recv_buf is send_buf:
            self._sendrecv_in_place(recv_buf, dst, src, tag, deadline, reducer)
        else:
            self._finish(self.sendrecv_post(send_buf, dst, tag, reducer is not None, recv_buf),
                         recv_buf, src, tag, deadline, reducer)

    def sendrecv_post(self, send_buf: np.ndarray, dst: int, tag: int, reducing: bool = False,
                      into: np.ndarray | None = None) -> Request | None:
        """`sendrecv`'s send: by the exchange thresholds, written into the slots now (None) or
        posted as a request. A plain send in small pages, `into` (my own receive) in huge ones,
        goes by address, for the peer to have me write it (`_pushes`): its receive buffer is most
        likely laid out as mine."""
        check_buffer(send_buf, "shm send")
        n = send_buf.nbytes
        if (not reducing and into is not None and n >= max(PUSH_FROM_BYTES, 1)
                and tag >= COLLECTIVE_TAG_BASE and not cma.in_huge_pages(send_buf) and self._pushes(into)
                and self._registered(send_buf) is None):
            return self._isend(send_buf, dst, tag, True, pushable=True)
        # an exchange has thresholds of its own (both ranks copy at once: `exchange_rendezvous_bytes`)
        if n >= self.attach_from or (n >= (SLOW_REDUCE_FROM_BYTES if reducing else SLOW_FROM_BYTES)
                                     and self._slots_slow()):
            rendezvous = True   # this kind of call goes by cross-memory attach (`begin_call`), or slow slots
        elif reducing:
            rendezvous = n >= self.reduce_exchange_rendezvous_bytes
        else:
            rendezvous = n >= self.exchange_rendezvous_bytes or (n >= self.exchange_huge_bytes
                                                                 and cma.in_huge_pages(send_buf))
            if rendezvous and n < self.rendezvous_bytes:
                # below the messages' threshold, not by cross-memory attach if it sends what my last
                # big sendrecv received: those lines are dirty in my cache, and the peer's read of
                # them was slower than the FIFO (2026-12-03: a 512 KiB all-gather step after a
                # reducing one, 117 us against 85 us)
                start = cma.address_of(send_buf)
                low, high = self.last_received
                rendezvous = not (start < high and low < start + n)
        region = self._registered(send_buf)
        if not rendezvous and region is None and self._send_now(send_buf, dst, tag):
            return None
        return self._isend(send_buf, dst, tag, rendezvous, region)

    def sendrecv_finish(self, send: Request | None, recv_buf: np.ndarray, src: int, tag: int, deadline: float,
                        reducer: Reducer | None = None) -> None:
        """`sendrecv`'s receive, straight out of the slots or the sender where it can, and the wait."""
        check_buffer(recv_buf, "shm receive")
        self._finish(send, recv_buf, src, tag, deadline, reducer)

    def _finish(self, send: Request | None, recv_buf: np.ndarray, src: int, tag: int, deadline: float,
                reducer: Reducer | None) -> None:
        if recv_buf.nbytes > self.chunk:
            address = cma.address_of(recv_buf)
            self.last_received = (address, address + recv_buf.nbytes)
            taken = False if reducer is not None else self._read_exchange_now(recv_buf, src, tag)
            if taken is True:
                if send is not None:
                    if not send.done and send.ack:
                        self._spin_for_ack(send)
                    self.wait_all([send], deadline)
                return
            if taken is not False:
                self._wait_written(send, taken, deadline)
                return
        taken = self._receive_now(recv_buf, src, tag, reducer, helpable=False, exchange=True)
        if taken is True:
            if send is not None:
                self.wait_all([send], deadline)
            return
        # its sender is exchanging too, with a receive of its own to make: asked to help, it would
        # copy my half instead of reading its own message (see `_ask_help`); asked to write all of
        # a message marked for it, it does that instead of nothing (`_pushes`)
        receive = taken or self._post(_In(src, tag, recv_buf, reducer, helpable=False, exchange=True))
        self.wait_all([receive] if send is None else [send, receive], deadline)

    def _sendrecv_in_place(self, buf: np.ndarray, dst: int, src: int, tag: int, deadline: float,
                           reducer: Reducer | None) -> None:
        """`sendrecv(buf, dst, buf, src, ...)`: a message that fits one slot is copied into it at
        once, which frees `buf` to receive into; anything else goes through a scratch copy."""
        if buf.nbytes > self.chunk or self._registered(buf) is not None or not self._send_now(buf, dst, tag):
            self.sendrecv(buf.copy(), dst, buf, src, tag, deadline, reducer)
            return
        taken = self._receive_now(buf, src, tag, reducer)
        if taken is not True:
            receive = taken or (self.irecv(buf, src, tag) if reducer is None
                                else self.irecv_reduce(buf, src, tag, reducer))
            self.wait_all([receive], deadline)

    def sendrecv_replace(self, buf: np.ndarray, dst: int, src: int, tag: int, deadline: float,
                         reducer: Reducer | None = None,
                         scratch: np.ndarray | None = None) -> np.ndarray | None:
        """Old spelling of `sendrecv(buf, dst, buf, src, ...)`, kept while callers move."""
        check_buffer(buf, "shm sendrecv")
        self._sendrecv_in_place(buf, dst, src, tag, deadline, reducer)
        return scratch

    def persistent_exchange(self, dtype: np.dtype, count: int, peer: int,
                            reducer: Reducer | None) -> Callable[..., None]:
        """`sendrecv_replace`'s one-slot step (`sendrecv`'s, given `into`) with its views of the
        slots made once: numpy views of
        `count` `dtype`s at each slot of both FIFOs with `peer`, so that a call copies in and out
        of them with no view made, no cast and no checks (the plan checked the buffer). Anything
        the one-slot step would not take goes the general way (`Transport.persistent_exchange`)."""
        general = super().persistent_exchange(dtype, count, peer, reducer)
        n = count * dtype.itemsize
        if not 0 < n <= self.chunk or n >= self.rendezvous_bytes or peer == self.rank or dtype.hasobject:
            return general
        chunk, slots, spin = self.chunk, self.slots, self.spin_polls
        outbound, inbound = self.outbound[peer], self.inbound[peer]
        outgoing = [np.frombuffer(outbound.raw, dtype, count, slot * chunk) for slot in range(slots)]
        incoming = [np.frombuffer(inbound.raw, dtype, count, slot * chunk) for slot in range(slots)]
        out_ctl, out_hdr, in_ctl, in_hdr = outbound.ctl, outbound.hdr, inbound.ctl, inbound.hdr
        sends, posted, stashed = self.sends[peer], self.posted[peer], self.stashed[peer]
        current, sent_head, read_tail = self.current, self.sent_head, self.read_tail

        def run(buf: np.ndarray, tag: int, deadline: float, into: np.ndarray | None = None) -> None:
            head = sent_head[peer]
            if (sends or posted or stashed or current[peer] is not None or n >= self.attach_from
                    or head - out_ctl[8] >= slots):
                return general(buf, tag, deadline, into)
            slot = head % slots   # send: as `_send_now`
            field = slot * HEADER_FIELDS
            out_hdr[field] = tag
            out_hdr[field + 1] = n
            out_hdr[field + 2] = 0
            out_hdr[field + 3] = n
            outgoing[slot][...] = buf
            sent_head[peer] = head + 1
            out_ctl[0] = head + 1
            if into is not None:
                buf = into
            tail = read_tail[peer]   # receive: as `_receive_now`
            polls = 0
            while in_ctl[0] <= tail:
                if self.active_out or self.active_in:
                    self.progress()
                polls += 1
                if polls >= spin:
                    if polls >= ONE_SLOT_POLLS:
                        break
                    os.sched_yield()
            else:
                slot = tail % slots
                field = slot * HEADER_FIELDS
                if in_hdr[field] == tag and in_hdr[field + 1] == n and in_hdr[field + 3] == n:
                    if reducer is None:
                        buf[...] = incoming[slot]
                    else:
                        reducer(buf, incoming[slot])
                    read_tail[peer] = tail + 1
                    in_ctl[8] = tail + 1
                    return None
            # a slow peer, or another message first: the general path's receive sorts it out
            self.wait_all([self.irecv(buf, peer, tag) if reducer is None
                           else self.irecv_reduce(buf, peer, tag, reducer)], deadline)
            return None

        return run

    def _slots_slow(self) -> bool:
        """Whether my copies into slots have been slow lately (see SLOW_FROM_BYTES): then my
        big messages go by cross-memory attach, where peers may read this process."""
        return self.slow_until > 0.0 and self.cma and time.monotonic() < self.slow_until

    def _timed_slot_copy(self, nbytes: int, seconds: float, pushed: bool = False) -> None:
        """A copy of `nbytes` into a slot (or, `pushed`, a message's write into its receiver) took
        `seconds`: after enough slow ones, avoid the slots (or pushes) a while (one slow copy is
        no sign: a rank may lose its core in the middle of any)."""
        copies = self.push_copies if pushed else self.slot_copies
        copies.append(nbytes < seconds * self.slow_slot_bytes_per_s)   # slower than that
        if len(copies) >= SLOW_OF and sum(copies) >= SLOW_OF:
            if pushed:
                self.push_slow_until = time.monotonic() + SLOW_HOLD_S
            else:
                self.slow_until = time.monotonic() + SLOW_HOLD_S
                self.slow_trips += 1
            copies.clear()   # after the hold, they must show it again

    def _registered(self, buf: np.ndarray) -> registered.Region | None:
        """The registered region `buf` lies in, if it is big enough to go so and peers can map it."""
        n = buf.nbytes
        if n < MAPPED_BYTES or not self.mappable or not registered.held():   # (no address wanted then)
            return None
        return registered.region_of(cma.address_of(buf), n)

    def _send_now(self, buf: np.ndarray, peer: int, tag: int) -> bool:
        """Write a message below the rendezvous size to `peer` now if nothing is queued before it
        and the slots it takes are free (`_send_pieces_now` beyond one slot). (Callers send one in
        registered memory by its region instead: `_registered`.)"""
        n = buf.nbytes
        if self.sends[peer] or n >= self.rendezvous_bytes or n >= self.attach_from:
            return False
        if n > self.chunk:
            return self._send_pieces_now(buf, peer, tag)
        fifo = self.outbound[peer]
        head = self.sent_head[peer]
        if head - fifo.ctl[8] >= self.slots:
            return False
        slot = head % self.slots
        hdr, field = fifo.hdr, slot * HEADER_FIELDS
        hdr[field] = tag
        hdr[field + 1] = n
        hdr[field + 2] = 0
        hdr[field + 3] = n
        if n:
            start = slot * self.chunk
            began = time.perf_counter() if n >= SLOW_FROM_BYTES else 0.0
            try:
                fifo.raw[start:start + n] = buf.data.cast("B")   # half the cost of a uint8 view
            except ValueError:                                  # a dtype with no buffer format
                fifo.raw[start:start + n] = buf.view(np.uint8)
            if began:
                self._timed_slot_copy(n, time.perf_counter() - began)
        self.sent_head[peer] = head + 1
        fifo.ctl[0] = head + 1             # publish (x86 keeps the stores above before this one)
        return True

    def _send_pieces_now(self, buf: np.ndarray, peer: int, tag: int) -> bool:
        """`_send_now` for a message of several slots: every piece written and published in turn
        (the receiver starts on the first while the next is copied in), as `_push` writes them."""
        n, chunk, slots = buf.nbytes, self.chunk, self.slots
        fifo = self.outbound[peer]
        head = self.sent_head[peer]
        if head - fifo.ctl[8] > slots - -(-n // chunk):
            return False
        data, headers, control = buf.reshape(-1).view(np.uint8), fifo.headers, fifo.control
        for offset in range(0, n, chunk):
            size = min(chunk, n - offset)
            slot = head % slots
            headers[slot] = (tag, n, offset, size)
            began = time.perf_counter()
            fifo.data[slot, :size] = data[offset:offset + size]
            if size >= SLOW_FROM_BYTES:
                self._timed_slot_copy(size, time.perf_counter() - began)
            head += 1
            control[0] = head              # publish each piece at once
        self.sent_head[peer] = head
        return True

    def _receive_pieces_now(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer | None,
                            helpable: bool = True, exchange: bool = False) -> bool | _In:
        """`_receive_now` for a message of several slots: each piece taken as it lands. False if the
        first does not land within the one-slot spin (nothing taken); a request, installed as the
        message being received from `peer`, if a later one does not (wait for it: `_pull` goes on
        from there, with deadlines); true once the whole message is in."""
        fifo = self.inbound[peer]
        ctl, headers, slots = fifo.ctl, fifo.headers, self.slots
        tail = self.read_tail[peer]
        request = None   # made once the first piece is there (a slow peer costs no allocation)
        n = buf.nbytes
        while request is None or request.pos < n:
            polls = 0
            while ctl[0] <= tail:
                if self.active_out or self.active_in:
                    self.progress()
                polls += 1
                if polls >= self.spin_polls:
                    if polls >= ONE_SLOT_POLLS:
                        if request is None:
                            return False
                        self.current[peer] = request
                        self.active_in.add(peer)
                        return request
                    os.sched_yield()
            slot = tail % slots
            got_tag, message_bytes, offset, size = headers[slot].tolist()
            if request is None and size in ADDRESSED:
                return self._read_now(buf, peer, tag, reducer, helpable, exchange, fifo, tail,
                                      got_tag, message_bytes, offset, size)
            if (got_tag != tag or message_bytes != n or offset != (0 if request is None else request.pos)
                    or not 0 < size <= self.chunk or offset + size > n):
                if request is None:
                    return False           # another message first: _pull sorts it out
                raise chunk_mismatch(self.rank, peer, request, (got_tag, message_bytes, offset, size))
            if request is None:
                request = _In(peer, tag, buf, reducer, helpable=False)
            request.take(fifo.data[slot, :size])
            tail += 1
            self.read_tail[peer] = tail    # (kept as it goes: an error above leaves the FIFO consistent)
            ctl[8] = tail                  # the slot is free again
        return True

    def _receive_now(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer | None,
                     helpable: bool = True, exchange: bool = False) -> bool | _In:
        """Take a message below the rendezvous size from `peer` with `tag` straight out of its slot
        (`_receive_pieces_now` beyond one slot), if nothing else is being received from `peer` and
        it lands within a short spin; false: post a receive instead. A message whose sender posted
        its address (a rendezvous) is read out of the sender then and there (`_read_now`), unless
        its sender is to help copy it (`helpable`: not a sendrecv's receive; see `_ask_help`) or to
        write it all (`exchange`: a sendrecv's; see `_pushes`)."""
        n = buf.nbytes
        if self.posted[peer] or self.current[peer] is not None or self.stashed[peer]:
            return False
        pulled = n >= self.rendezvous_bytes or n >= self.attach_from   # it comes as its address
        if pulled and self._own_share(peer, buf, tag, reducer, helpable) is not None:
            return False   # the general path asks its sender to write half meanwhile (`_ask_help`)
        if n > self.chunk and not pulled:
            return self._receive_pieces_now(buf, peer, tag, reducer, helpable, exchange)
        fifo = self.inbound[peer]
        tail = self.read_tail[peer]
        ctl = fifo.ctl
        polls = 0
        while ctl[0] <= tail:
            if self.active_out or self.active_in:
                self.progress()            # keep my other messages moving, as wait_all would
            polls += 1
            if polls >= self.spin_polls:
                if polls >= ONE_SLOT_POLLS:
                    return False           # a slow peer: the general path waits with deadlines
                os.sched_yield()           # ranks may outnumber cores: let the sender run
        slot = tail % self.slots
        hdr, field = fifo.hdr, slot * HEADER_FIELDS
        if hdr[field + 3] in ADDRESSED:
            return self._read_now(buf, peer, tag, reducer, helpable, exchange, fifo, tail,
                                  hdr[field], hdr[field + 1], hdr[field + 2], hdr[field + 3])
        if pulled or hdr[field] != tag or hdr[field + 1] != n or hdr[field + 3] != n:
            return False                   # another message first, or a mismatch: _pull sorts it out
        if n:
            start = slot * self.chunk
            incoming = np.frombuffer(fifo.raw, buf.dtype, buf.shape[0], start)
            if reducer is None:
                np.copyto(buf, incoming)
            else:
                reducer(buf, incoming)
        self.read_tail[peer] = tail + 1
        ctl[8] = tail + 1                  # the slot is free again
        return True

    def _read_exchange_now(self, buf: np.ndarray, peer: int, tag: int) -> bool | _In:
        """A plain exchange's message sent by address (RENDEZVOUS_CHUNK), read out of its sender
        now if its header is already next in `peer`'s FIFO and nothing else is being received from
        `peer`, then acked; or one marked for writing (RENDEZVOUS_PUSHABLE), its sender asked now
        to write it all (`_pushes`; the receive returned, to wait for in `_wait_written`); false
        (nothing done) otherwise. `_receive_now` and `_read_now` do the same and more (they wait
        for the header, take messages through the slots, ask senders to write half); for this one
        message that is Python around the read: in a 2-rank 4 MiB all_to_all, 4.9-5.0 us from the
        receive's start to the read's and 1.3 us after it (2.1 and 0.7 here), with the caches
        cold from the rank's own 2 MiB copy just before."""
        if self.posted[peer] or self.current[peer] is not None or self.stashed[peer] or not self.cma:
            return False
        fifo = self.inbound[peer]
        ctl = fifo.ctl
        tail = self.read_tail[peer]
        if ctl[0] <= tail:
            return False
        hdr, field = fifo.hdr, tail % self.slots * HEADER_FIELDS
        kind = hdr[field + 3]
        if hdr[field] != tag or hdr[field + 1] != buf.nbytes:
            return False
        if kind == RENDEZVOUS_PUSHABLE and tag >= COLLECTIVE_TAG_BASE and self._pushes(buf):
            request = _In(peer, tag, buf, None, helpable=False, exchange=True)
            self.current[peer] = request
            self.active_in.add(peer)
            self._request_share(peer, request, hdr[field + 2], None, 0)   # write it all, please
            return request
        if kind != RENDEZVOUS_CHUNK:
            return False
        try:
            cma.read(self.pids[peer], hdr[field + 2], buf)
        except (ProcessLookupError, TransportError) as error:
            self._raise_if_lost(peer, buf.nbytes, error)
            raise
        self.read_tail[peer] = tail + 1
        ctl[8] = tail + 1                  # the slot is free again
        acks = self.acks_given[peer] + 1
        self.acks_given[peer] = acks
        ctl[16] = acks                     # the sender's buffer is free again
        return True

    def _wait_written(self, send: _Out | None, request: _In, deadline: float) -> None:
        """Wait for the receive `request` whose sender I asked to write it all (`_read_exchange_now`),
        writing my own `send` into its peer when that peer asks, in a loop that polls those two
        words alone, for up to WRITE_WAIT_POLLS polls without either; then the general wait (its
        deadline, yields and liveness checks). Through the general wait, a 2-rank 4 MiB all_gather
        took 5 us from the wait's start to its write and 6 us from its write's end to the return,
        against 2 us for both in a plain loop of flags."""
        peer = request.peer
        in_ctl = self.inbound[peer].ctl
        number = self.helping[peer]
        out_ctl = self.outbound[send.peer].ctl if send is not None else None
        polls = 0
        try:
            while polls < WRITE_WAIT_POLLS:
                if out_ctl is not None and out_ctl[HELP_ASK] > self.helped[send.peer]:
                    self._help(send.peer, out_ctl)   # (all of mine, or what its receiver asked for)
                    polls = 0
                if in_ctl[HELP_DONE] >= number:
                    self._finish_helped(peer)
                    break
                polls += 1
        except BaseException:   # (as `wait_all`: my buffer is given back, so no one may write it)
            self._withdraw_help([request])
            raise
        self.wait_all([request] if send is None else [send, request], deadline)

    def _spin_for_ack(self, send: _Out) -> None:
        """Poll the ack of my rendezvous `send` alone for up to `spin_polls` polls, then collect it
        (the caller's wait does the rest, with its deadline and yields): its peer is most likely
        reading it as I read its message. The general wait's progress passes took 5 us there
        where the ack came 2.2 us after my read in a plain loop (2 ranks, 4 MiB all_to_all). A
        help asked meanwhile ends the spin (`_collect_acks` gives it)."""
        peer = send.peer
        ctl = self.outbound[peer].ctl
        helped, ack = self.helped[peer], send.ack
        for _ in range(self.spin_polls):
            if ctl[16] >= ack or ctl[HELP_ASK] > helped:
                break
        self._collect_acks(peer)

    def _read_now(self, buf: np.ndarray, peer: int, tag: int, reducer: Reducer | None, helpable: bool,
                  exchange: bool, fifo: _Fifo, tail: int, got_tag: int, message_bytes: int, address: int,
                  kind: int) -> bool | _In:
        """The message at `tail` of `peer`'s FIFO is its sender's address (a rendezvous): if it is
        this receive's, read it out of the sender now, with no receive posted and no progress pass
        before the read, and ack it (or ask its sender to write it all, `_pushes`, and return the
        receive, installed as the one from `peer` to wait for); false (post a receive) otherwise.
        2 ranks, a 512 KiB exchange by cross-memory attach: the read began 6 us after the peer's
        header landed, and took 45 us of the exchange's 62-65 (MPI's Sendrecv 49)."""
        if got_tag != tag or message_bytes != buf.nbytes or not self.cma:
            return False
        pushable = exchange and kind == RENDEZVOUS_PUSHABLE
        share = self._own_share(peer, buf, tag, reducer, helpable, pushable)
        if share is not None and share > 0:
            return False   # the general path asks its sender to write half meanwhile
        request = _In(peer, tag, buf, reducer, helpable=helpable, exchange=exchange)
        if share == 0:   # its sender is to write it all: ask now, and wait for it as `_pull` does
            self.current[peer] = request
            self.active_in.add(peer)
            if self._ask_help(peer, request, address, pushable=True):
                return request
            self.current[peer] = None   # (it asks whenever `_own_share` says so: not reached)
        self._read_rendezvous(peer, request, address)
        self._consume_rendezvous(peer, fifo, request, tail)
        return True

    # -- progress --------------------------------------------------------------------------------

    def _push(self, peer: int) -> bool:
        """Copy as many chunks of queued sends to `peer` as there are free slots.

        A send of at least `rendezvous_bytes` (an exchange's marked for writing, `_pushes`, from
        `PUSH_FROM_BYTES`) takes one slot holding its buffer's address instead;
        the receiver reads it straight out of this process and acks, which completes the send (or
        asks me to write some or all of it: `_collect_acks`).
        """
        fifo, queue = self.outbound[peer], self.sends[peer]
        head, chunk, slots = self.sent_head[peer], self.chunk, self.slots
        moved = self._collect_acks(peer)
        while queue:
            send = queue[0]
            free = slots - (head - int(fifo.control[8]))
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
                    began = time.perf_counter()
                    fifo.data[slot, :n] = send.data[send.pos:send.pos + n]
                    if n >= SLOW_FROM_BYTES:
                        self._timed_slot_copy(n, time.perf_counter() - began)
                send.pos += n
                send.started = True
                head += 1
                free -= 1
                fifo.control[0] = head   # publish each chunk at once so the receiver can start
                moved = True
            if send.pos < send.nbytes or not send.started:
                break
            send.done = True
            queue.popleft()
        self.sent_head[peer] = head
        if not queue and not self.awaiting[peer]:
            self.active_out.discard(peer)
        return moved

    def _collect_acks(self, peer: int) -> bool:
        """Complete the rendezvous sends to `peer` that it has finished reading, after copying my
        share of one it asked me to help with."""
        awaiting = self.awaiting[peer]
        if not awaiting:
            return False
        ctl = self.outbound[peer].ctl
        moved = False
        if ctl[HELP_ASK] > self.helped[peer]:
            self._help(peer, ctl)
            moved = True
        acked = ctl[16]
        while awaiting and awaiting[0].ack <= acked:
            awaiting.pop(0).done = True
            moved = True
        return moved

    def _help(self, peer: int, ctl: memoryview) -> None:
        """Write the part of a rendezvous send that its receiver asked me for straight into its
        buffer, while it reads the rest: two cores copy one message (a sender waiting for its ack
        has nothing better to do); or all of it (`_pushes`), while it writes mine into me. Nothing
        where the receiver withdrew the request (`_withdraw_help`): that send then never completes."""
        number, address, offset, nbytes, *target = (ctl[HELP_ASK + i] for i in range(8))
        if nbytes == HELP_WITHDRAWN:
            self.helped[peer] = number
            return
        send = next((s for s in self.awaiting[peer] if s.ack == number), None)
        if send is None or offset < 0 or nbytes <= 0 or offset + nbytes > send.nbytes:
            raise TransportError(f"rank {self.rank}: rank {peer} asked for help with rendezvous message "
                                 f"{number} ({offset}+{nbytes} B), which rank {self.rank} has not sent")
        try:
            share = send.data[offset:offset + nbytes]
            if target[1] >= 0:   # its buffer is registered: write through my mapping of its region
                np.copyto(self._mapped(peer, target, nbytes, writable=True), share)
            else:
                began = time.perf_counter()
                cma.write(self.pids[peer], address, share)
                if offset == 0:   # the whole message (`_pushes`): as slow as a slot's in the VM's slow state
                    self._timed_slot_copy(nbytes, time.perf_counter() - began, pushed=True)
        except ProcessLookupError as error:
            raise self._lost(peer, f"rank {peer} (pid {self.pids[peer]}) died while rank {self.rank} was "
                                   f"writing its share of a {send.nbytes} B message to it") from error
        self.helped[peer] = number
        ctl[HELP_DONE] = number          # after the write (a system call): the bytes are there
        self.help_writes[peer] += 1
        if nbytes == send.nbytes:
            # I wrote it all (`_pushes`): my buffer is free now, not once the receiver's ack comes
            # back (that ack still completes its place among my sends awaiting one)
            send.done = True

    def _ask_help(self, peer: int, request: _In, address: int, words: list[int] | None = None,
                  pushable: bool = False) -> bool:
        """Have the sender write the second half of a big plain collective message while I read the
        first (by cross-memory attach, or out of my mapping of its region: `words`, a registered
        message's), or all of an exchange's message it sent as `pushable` (see `_pushes`); false
        (read it all myself) where that does not apply. Reductions read it all: the
        sender cannot combine into my buffer. User messages too: their sender may be off computing,
        not waiting for the ack. And a sendrecv's receive (unless its sender is to write it all,
        `_pushes`: then neither rank reads): its sender is receiving too, and helping puts its copy
        for me before its own read (measured 2026-12-03, 2-rank all_to_all, colls
        bench A/B, two runs each: 2 MiB 242 -> 233 us, 16 MiB 1359 -> 1322 us without help). Nor
        a receive from a peer I am sending a big message to myself, posted apart (the `direct`
        all_to_all's): it is reading mine meanwhile (2026-12-05, 2 ranks, buffers mapped for each:
        a 2 MiB receive and send posted together 110 us helped, 96 us not; MPI's Sendrecv 83).

        A receiver that gives up on a helped message (its deadline, an abort, a lost peer) withdraws
        the request (`_withdraw_help`), so that a sender that comes to it later writes nothing (a
        sendrecv's sender may be late by the whole deadline). Known gap: without an atomic exchange
        a sender that read the request just before may still write its share into that buffer for
        the moment its write takes after the error was raised."""
        half = self._own_share(peer, request.buf, request.tag, request.reducer, request.helpable,
                               pushable and request.exchange)
        if half is None:
            return False
        self._request_share(peer, request, address, words, half)
        return True

    def _request_share(self, peer: int, request: _In, address: int, words: list[int] | None,
                       half: int) -> None:
        """`_ask_help`'s request, once it knows my share (`half` bytes, read now; 0: none)."""
        nbytes = request.nbytes
        number = self.acks_given[peer] + 1   # the ack that will complete this message
        ctl = self.inbound[peer].ctl
        target = cma.address_of(request.data[half:])
        ctl[HELP_ASK + 1] = target
        ctl[HELP_ASK + 2] = half
        ctl[HELP_ASK + 3] = nbytes - half
        # my buffer in registered memory: the sender writes its share through a mapping of it
        region = registered.region_of(target, nbytes - half) if self.mappable else None
        ctl[HELP_ASK + 4] = 0 if region is None else region.id
        ctl[HELP_ASK + 5] = -1 if region is None else region.fd
        ctl[HELP_ASK + 6] = 0 if region is None else target - region.base
        ctl[HELP_ASK + 7] = 0 if region is None else region.size
        ctl[HELP_ASK] = number               # publish the request last
        if not half:
            pass                             # the sender writes it all
        elif words is None:
            self._read_rendezvous(peer, request, address, half)
        else:
            self._read_mapped(peer, request, words, half)
        request.pos = half
        self.helping[peer] = number

    def _own_share(self, peer: int, buf: np.ndarray, tag: int, reducer: Reducer | None, helpable: bool,
                   pushable: bool = False) -> int | None:
        """The bytes of such a receive that I read myself where `_ask_help` would have its sender
        write the rest: half, or none (`_pushes`); None where it would not ask."""
        if reducer is not None or tag < COLLECTIVE_TAG_BASE:
            return None
        if pushable and self._pushes(buf):
            return 0
        if buf.nbytes < HELP_BYTES or not helpable or self.awaiting[peer] or self.sends[peer]:
            return None
        return buf.nbytes // 2 // 64 * 64

    def _pushes(self, buf: np.ndarray) -> bool:
        """Whether I ask the sender of an exchange's message that it sent from small pages
        (RENDEZVOUS_PUSHABLE) to write it all into `buf`: where `buf` lies in huge pages. Its write
        pins my pages and my read would pin its (PUSH_FROM_BYTES). Both ranks of an exchange wait in
        it, so each writes the other's message while the other does the same. Not for a while
        after my own such writes ran slow (`_timed_slot_copy`): in one state of the VM, a 2 MiB
        write of data its sender had just written took 884-892 us against a read's 310
        (2026-12-05), where one of data written long before took 84 against 167."""
        return self.pushes and time.monotonic() >= self.push_slow_until and cma.in_huge_pages(buf)

    def _finish_helped(self, peer: int) -> bool:
        """Complete the helped rendezvous receive from `peer` once the sender's share has landed."""
        fifo = self.inbound[peer]
        if fifo.ctl[HELP_DONE] < self.helping[peer]:
            return False
        self.helping[peer] = 0
        self._consume_rendezvous(peer, fifo, self.current[peer], self.read_tail[peer])
        return True

    def _consume_rendezvous(self, peer: int, fifo: _Fifo, request: _In, tail: int) -> int:
        """Free the slot of a rendezvous header at `tail` whose message is in, ack it (the sender's
        buffer is free again) and complete the receive; returns the new tail."""
        tail += 1
        self.read_tail[peer] = tail
        fifo.control[8] = tail
        self.acks_given[peer] += 1
        fifo.control[16] = self.acks_given[peer]
        request.pos = request.nbytes
        request.done = True
        self.current[peer] = None
        if request.stash:
            self._serve_stash(peer)
        return tail

    def _read_rendezvous(self, peer: int, request: _In, address: int, nbytes: int | None = None) -> None:
        """Copy (or reduce) a rendezvous message (its first `nbytes`) straight out of the sender's memory."""
        try:
            self._read_from(peer, request, address, request.nbytes if nbytes is None else nbytes)
        except (ProcessLookupError, TransportError) as error:
            self._raise_if_lost(peer, request.nbytes, error)
            raise

    def _raise_if_lost(self, peer: int, nbytes: int, error: Exception) -> None:
        """After `error` in a read of `peer`'s `nbytes` B message: raise PeerLost if `peer` has
        died (else the caller raises `error` again)."""
        if not isinstance(error, ProcessLookupError):
            time.sleep(0.05)                 # a dying process may not look dead for a moment
            if process_alive(self.pids[peer]):
                return
        raise self._lost(peer, f"rank {peer} (pid {self.pids[peer]}) died while rank {self.rank} was "
                               f"reading its {nbytes} B message") from error

    def _read_mapped(self, peer: int, request: _In, words: list[int], nbytes: int | None = None) -> None:
        """Copy (or reduce) a message in `peer`'s registered memory (its first `nbytes`: a helped
        copy's) out of my mapping of its region."""
        source = self._mapped(peer, words, request.nbytes)
        if nbytes is not None:
            np.copyto(request.data[:nbytes], source[:nbytes])
        elif request.reducer is None:
            np.copyto(request.data, source)
        else:
            dtype = request.buf.dtype
            request.reducer(request.data.view(dtype), source.view(dtype))

    def _mapped(self, peer: int, words: Sequence[int], nbytes: int, writable: bool = False) -> np.ndarray:
        """The `nbytes` that `words` (region id, descriptor, offset, region bytes) locate in `peer`'s
        registered memory, through my mapping of the region: made on first use, kept for the
        `MAPPED_CACHE` regions of the peer used last (writable ones apart, for a helped copy)."""
        region_id, fd, offset, size = words
        regions = (self.peer_targets if writable else self.peer_regions)[peer]
        view = regions.pop(region_id, None)
        if view is None:
            view = self._map_region(peer, fd, size, writable)
            if len(regions) >= MAPPED_CACHE:
                del regions[next(iter(regions))]   # the least recently used
        regions[region_id] = view                  # (re)inserted last: the most recent
        if not 0 <= offset <= view.shape[0] - nbytes:
            raise TransportError(f"rank {self.rank}: rank {peer} named {nbytes} B at offset {offset} "
                                 f"of a registered region of {view.shape[0]} B")
        return view[offset:offset + nbytes]

    def _map_region(self, peer: int, fd: int, size: int, writable: bool) -> np.ndarray:
        try:
            pidfd = self.pidfds.get(peer)
            if pidfd is None:
                pidfd = self.pidfds[peer] = registered.open_pidfd(self.pids[peer])
            return registered.map_peer(pidfd, fd, size, writable)
        except OSError as error:
            if not process_alive(self.pids[peer]):
                raise self._lost(peer, f"rank {peer} (pid {self.pids[peer]}) died while rank {self.rank} "
                                       f"was mapping its registered memory") from error
            raise TransportError(f"rank {self.rank}: cannot map rank {peer}'s registered memory "
                                 f"(descriptor {fd}, {size} B): {error}") from error

    def _read_from(self, peer: int, request: _In, address: int, nbytes: int) -> None:
        if request.reducer is None:
            cma.read(self.pids[peer], address, request.data[:nbytes])
        else:
            dtype, piece = request.buf.dtype, self.piece
            step = REDUCE_PIECE_BYTES // dtype.itemsize * dtype.itemsize   # whole elements a piece
            if step == 0:   # an element bigger than a piece
                step, piece = dtype.itemsize, np.empty(dtype.itemsize, np.uint8)
            for start in range(0, request.nbytes, step):
                n = min(step, request.nbytes - start)
                cma.read(self.pids[peer], address + start, piece[:n])
                request.reducer(request.data[start:start + n].view(dtype), piece[:n].view(dtype))

    def _pull(self, peer: int) -> bool:
        """Consume the chunks that `peer` has published, into matching receives."""
        fifo = self.inbound[peer]
        moved = False
        if self.helping[peer]:
            if not self._finish_helped(peer):
                return False
            moved = True
        tail = self.read_tail[peer]
        head = int(fifo.control[0])
        while tail < head:
            slot = tail % self.slots
            tag, message_bytes, offset, n = fifo.headers[slot].tolist()
            request = self.current[peer]
            if request is None:
                request = self._match(peer, tag, message_bytes)
                if request is None:
                    break                  # nobody wants it yet: leave it in the FIFO
                self.current[peer] = request
            if n in ADDRESSED and self.cma and request.pos == 0 and message_bytes == request.nbytes:
                moved = True
                if self._ask_help(peer, request, offset, pushable=n == RENDEZVOUS_PUSHABLE):
                    break                  # the header stays until the sender's share has landed
                self._read_rendezvous(peer, request, offset)
                tail = self._consume_rendezvous(peer, fifo, request, tail)
                continue
            if n == RENDEZVOUS_MAPPED and request.pos == 0 and message_bytes == request.nbytes:
                moved = True
                at = slot * self.chunk // 8
                words = fifo.words[at:at + 4].tolist()
                if self.cma and self._ask_help(peer, request, offset, words):
                    break                  # as above
                self._read_mapped(peer, request, words)
                tail = self._consume_rendezvous(peer, fifo, request, tail)
                continue
            if (offset != request.pos or n < 0 or n > self.chunk or offset + n > message_bytes
                    or message_bytes != request.nbytes or tag != request.tag):   # inline: every chunk
                raise chunk_mismatch(self.rank, peer, request, (tag, message_bytes, offset, n))
            request.take(fifo.data[slot, :n])
            tail += 1
            fifo.control[8] = tail
            moved = True
            if request.pos >= request.nbytes:
                request.done = True
                self.current[peer] = None
                if request.stash:
                    self._serve_stash(peer)
        self.read_tail[peer] = tail
        if not self.posted[peer] and self.current[peer] is None:
            self.active_in.discard(peer)
        return moved

    def _match(self, peer: int, tag: int, message_bytes: int) -> _In | None:
        """The earliest posted receive for a new message; stash it if receives wait for other tags."""
        posted = self.posted[peer]
        request = take_posted(posted, self.rank, peer, tag, message_bytes)
        if request is not None or not posted:
            return request
        # Receives wait on other tags behind this message: take it aside (the rare, allocating path:
        # point-to-point messages out of tag order) so the FIFO keeps moving.
        stash = _In(peer, tag, np.empty(message_bytes, np.uint8), None, stash=True)
        self.stashed[peer].append(stash)
        return stash

    def _serve_stash(self, peer: int) -> None:
        """Complete posted receives from fully stashed messages with their tag, oldest first."""
        if not self.stashed[peer]:
            return   # the usual case, on every posted receive: nothing was taken aside

        def deliver(request: _In, stash: _In) -> None:
            request.take(stash.data)
            request.done = True

        serve_stashed(self.stashed[peer], self.posted[peer], self.rank, peer, deliver)

    def progress(self) -> bool:
        """One pass over every active FIFO; true if anything moved."""
        moved = False
        for peer in tuple(self.active_out):
            moved |= self._push(peer)
        for peer in tuple(self.active_in):
            moved |= self._pull(peer)
        return moved

    def wait_all(self, requests: Sequence[Request], deadline: float) -> None:
        # nothing to wait for (a one-slot send born done, a rank that only receives): no progress
        # pass and no clock. A 2-rank 1 KiB broadcast's root spent 0.5 us of its 3.2 here
        for request in requests:
            if not request.done:
                break
        else:
            return
        backoff = Backoff(self.spin_polls)
        next_liveness = time.monotonic() + LIVENESS_PERIOD_S
        try:
            while True:
                if self.progress():
                    backoff.reset()
                if all(r.done for r in requests):
                    return
                now = time.monotonic()
                if now >= deadline:
                    raise timeout_error(requests, deadline)
                if now >= next_liveness:
                    next_liveness = now + LIVENESS_PERIOD_S
                    self.check_aborted()
                    self._check_alive(requests)
                backoff.pause()
        except BaseException:
            # help is asked for collective messages only (`_own_share`), and a collective's wait
            # that fails gives its call up: its deadline may have passed before this wait began,
            # with help asked in the first pass (a poll, `Test`'s, waits on user messages: no help)
            self._withdraw_help(requests)
            raise

    def _withdraw_help(self, requests: Sequence[Request]) -> None:
        """After an error in a wait for `requests`: tell the sender of each of them that I asked to
        write into my buffer not to, if it has not begun (`_help`; the gap of `_ask_help`
        otherwise). The pair's FIFO stays held by that message."""
        for request in requests:
            peer = request.peer
            if self.helping[peer] and self.current[peer] is request:
                self.inbound[peer].ctl[HELP_ASK + 3] = HELP_WITHDRAWN

    def abort(self, reason: str) -> None:
        self.aborted = reason
        # the reason goes into my own header page first, then the word into every peer's (x86 keeps
        # the order of stores, so a peer that sees the word reads the whole reason)
        text = reason.encode()[:REPORT_OFFSET - ABORT_REASON_OFFSET - 1]
        page = self.segment.array
        page[ABORT_REASON_OFFSET:ABORT_REASON_OFFSET + len(text)] = np.frombuffer(text, np.uint8)
        page[ABORT_REASON_OFFSET + len(text):REPORT_OFFSET] = 0
        for word in self.abort_words:
            word[0] = self.rank + 1          # every peer sees it at its next liveness check

    def check_aborted(self) -> None:
        word = self.abort_words[self.rank]   # peers write into my segment's word
        if word[0]:
            aborter = int(word[0]) - 1
            page = self.peers[aborter].array[ABORT_REASON_OFFSET:REPORT_OFFSET]
            reason = page.tobytes().split(b"\0", 1)[0].decode(errors="replace")
            raise CommunicatorAborted(f"rank {self.rank}: {reason or f'aborted by rank {aborter}'}")
        if self.watched is not None:
            self.watched.check_aborted()

    def _check_alive(self, requests: Sequence[Request]) -> None:
        """PeerLost if a rank I wait for has died, or if a peer already found one dead.

        The first rank to see a death writes it into every peer's header page (word 1), so ranks
        waiting on that first rank (which has then left) still name the rank that really died.
        """
        known = int(self.abort_words[self.rank][1])
        if known:
            dead = known - 1
            raise PeerLost(f"rank {dead} (pid {self.pids[dead]}) has died; rank {self.rank} learned it "
                           f"from a peer while waiting", dead)
        for request in requests:
            if not request.done and not process_alive(self.pids[request.peer]):
                raise self._lost(request.peer, f"rank {request.peer} (pid {self.pids[request.peer]}) has "
                                               f"died; rank {self.rank} was waiting for its {request!r}")

    def _lost(self, peer: int, message: str) -> PeerLost:
        """Record `peer`'s death in every peer's header page (if nobody has yet) and make the error;
        a group already aborted raises that instead (a peer that aborted and left is not the cause)."""
        self.check_aborted()
        for word in self.abort_words:
            if not word[1]:
                word[1] = peer + 1
        return PeerLost(message, peer)

    # -- groups and teardown ---------------------------------------------------------------------

    def subgroup(self, ranks: Sequence[int], exchange: Exchange) -> Transport | None:
        return shm_group(self.rank, ranks, exchange)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.inbound = self.outbound = self.abort_words = []
        self.peer_regions = [{} for _ in range(self.size)]
        self.peer_targets = [{} for _ in range(self.size)]
        for pidfd in self.pidfds.values():
            os.close(pidfd)
        self.pidfds = {}
        for segment in self.peers:
            if segment is not self.segment:
                segment.close()
        self.segment.close()


def _probe_region() -> np.ndarray | None:
    """A registered int64 holding my pid, for peers to map (`_probe_mapping`); None if registered
    memory cannot be made here or is turned off (COLLS_SHM_MAPPED=0)."""
    if os.environ.get("COLLS_SHM_MAPPED", "1") == "0":
        return None
    try:
        probe = registered.alloc(1, np.int64)
    except TransportError:
        return None
    probe[0] = os.getpid()
    return probe


def _probe_mapping(pid: int, fd: int) -> bool:
    """Whether this process can map process `pid`'s registered memory (its probe at `fd`)."""
    if fd < 0 or os.environ.get("COLLS_SHM_MAPPED", "1") == "0":
        return False
    try:
        pidfd = registered.open_pidfd(pid)
        try:
            view = registered.map_peer(pidfd, fd, mmap.PAGESIZE)
        finally:
            os.close(pidfd)
        return int(view[:8].view(np.int64)[0]) == pid
    except (OSError, AttributeError, ValueError):
        return False


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
    """The earliest of `posted` (receives from `peer`) with `tag`, taken off the list; None if none;
    CollectiveMismatch if its size is not the message's (MPI's matching: in order, per tag)."""
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


def shm_group(rank: int, ranks: Sequence[int], exchange: Exchange, kind: type[ShmTransport] | None = None,
              **options) -> ShmTransport | None:
    """A shared-memory transport (or one of `kind`, a subclass) for the group `ranks` of a parent
    group (of any transport) in which this process is rank `rank`; collective over the parent,
    whose `exchange` carries the new group's setup rounds, each member picking out its group's
    entries. None outside."""
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
