"""Check the simulator against measured times: `colls plan calibrate --bench FILE.json --profile FILE`.

The measured side is a `colls bench --json` file (median of the slowest rank's time per size); the
predicted side runs the very algorithm each row used on the `sim` transport over a model of one
machine's shared memory whose constants come from a profile that `colls run -n N -m colls.tune
--profile FILE` measured at the same number of ranks (never fitted to the bench):

- a message costs what one of its size took right after a barrier between two ranks pinned to two
  cores: α(n) and a per-byte cost β(n) read off those times, per protocol, since the shm transport
  moves a message below its rendezvous size (the FIFO's capacity) through its FIFO (the sender
  copies in, the receiver copies out) and a larger one by cross-memory attach (the receiver
  copies straight out of the sender); a sendrecv costs the exchange of its size and kind as
  measured (both ranks at once), through the FIFO up to its own thresholds (those in effect when
  the profile was measured: `colls tune`'s, 4 MiB plain and 16 MiB reducing by default, when every
  rank has a core; a plain one sent from huge pages, as the bench's buffers are from 4 MiB, by
  its own table and threshold); a piece of a bigger call moves its bytes no faster than a
  message or exchange of the call's size (its lines come from where the call's bytes live);
- those bytes are CPU work: a FIFO message keeps the sender's CPU busy while it copies in, then
  the receiver's while it copies out (the sender copies its next one in meanwhile), a
  cross-memory one the receiver's, and all flows share the machine's cores, so 4 ranks copying
  at once on 2 cores each get half;
- reductions and copies cost what numpy took per byte at the call's size (in or out of cache) with
  as many ranks working at once as there are cores (the memory bus is shared); a scratch buffer an
  algorithm allocates costs its first touch (page faults when numpy maps a big buffer anew);
- ranks beyond the cores time-share them: a rank that waits polls `spin`, then yields its core,
  and one that takes a yielded core back pays `wake` (both measured); each rank stays on one
  core's run queue (a yield hands the core only to a rank queued there), and the prediction is the
  mean over the even ways to deal the ranks to the cores;
- posting a send or a receive costs the posting rank's own CPU (`post`: an 8 B exchange less one
  message), the rest of α is the route's; a send through the FIFO keeps its sender as long as one
  kept rank 0 in the profile (`send`: posting and copying in, which the transport does inside
  `isend`); two cross-memory reads at once run slower per byte, as much as an exchange of that
  size measured;
- every call pays its software (describe, select, deliver; measured on a one-rank group) and what
  the barrier before it adds to its first message (the ranks leave it at different moments);
- ranks pinned to cores (`colls bench --pin`), which never run a while on another core, also take
  turns at what unpinned ones may spread: two on one core copy through their slots at a local
  copy's rate, and they leave the bench's barrier down MPI's release tree, a rank whose core is
  busy only once it is free, starting its timer then.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, replace

import numpy as np

from algorithms import SUM, lookup
from colls.describe import PLAN_BYTES
from transports.cma import HUGE_FROM_BYTES
from transports.shm import (
    HELP_BYTES,
    SLOW_FROM_BYTES,
    SLOW_REDUCE_FROM_BYTES,
    exchange_rendezvous_bytes,
    fifo_geometry,
    rendezvous_bytes,
)
from transports.sim import Link, Route, SimTransport, TimeSharing, root_of

from .simulate import run_algorithm, run_world

REFERENCE_SECONDS_PER_BYTE = 1e-10   # the links' unit: a route's byte_weight is its β(n) over this
# How several runs of one measurement combine: their median, or the fastest (other jobs on a shared
# machine only ever slow a run down, and the model has no term for them).
COMBINE = {"median": lambda values: float(np.median(values)), "fastest": lambda values: float(min(values))}


def _interpolate(table: list[tuple[int, float]], nbytes: int) -> float:
    """A per-byte cost at `nbytes`, linear in log(size) between measured sizes, flat beyond them."""
    sizes = [size for size, _ in table]
    if nbytes <= sizes[0]:
        return table[0][1]
    if nbytes >= sizes[-1]:
        return table[-1][1]
    i = bisect.bisect_right(sizes, nbytes) - 1
    (low, below), (high, above) = table[i], table[i + 1]
    weight = math.log(nbytes / low) / math.log(high / low)
    return below + (above - below) * weight


def _linear(points: list[tuple[int, float]], nbytes: int) -> float:
    """Seconds at `nbytes` from measured (bytes, seconds): linear in bytes between the sizes around
    it, the last two's slope beyond them, the first size's time below it (never below zero)."""
    sizes = [size for size, _ in points]
    if nbytes <= sizes[0] or len(points) == 1:
        return points[0][1]
    i = min(bisect.bisect_right(sizes, nbytes) - 1, len(points) - 2)
    (low, t_low), (high, t_high) = points[i], points[i + 1]
    return max(0.0, t_low + (nbytes - low) * (t_high - t_low) / (high - low))


@dataclass(frozen=True)
class Profile:
    """One machine at one number of ranks, as `colls.tune.profile` measured it (see there)."""

    ranks: int
    cores: int
    message: tuple[tuple[int, float], ...]     # (bytes, one-way seconds), sorted
    start: float
    call: dict[str, float]
    reduce: tuple[tuple[int, float], ...]      # (bytes, seconds per byte)
    copy: tuple[tuple[int, float], ...]
    spin: float = 0.0
    wake: float = 0.0
    rendezvous: int = 64 << 10
    alloc: tuple[tuple[int, float], ...] = ((1, 0.0),)
    post: float = 0.0
    # (bytes, seconds of both ranks exchanging that many in one sendrecv): below the rendezvous size
    # the whole step as the schedules make it, from it two cross-memory reads at once
    exchange: tuple[tuple[int, float], ...] = ()
    # the same two, from send buffers the sender has just written (dirty in its cache)
    written: tuple[tuple[int, float], ...] = ()
    exchange_written: tuple[tuple[int, float], ...] = ()
    receive_reduce: float = 0.0   # a reducing receive's software beyond a plain receive's
    one_slot_spin: float | None = None   # the spin of a wait in a one-slot sendrecv (None: `spin`)
    one_slot_wake: float | None = None   # and getting the core back from it (None: `wake`)
    # one numpy sum's or copy's own cost (an 8 B one): the tables above less it, per byte, are
    # what a byte adds; the simulator charges it once per call of the algorithm code
    reduce_call: float = 0.0
    copy_call: float = 0.0
    exchange_reduce: tuple[tuple[int, float], ...] = ()   # the exchanges with a float32 sum
    exchange_after_copy: tuple[tuple[int, float], ...] = ()   # right after a copy of as many bytes
    exchange_reduce_source: tuple[tuple[int, float], ...] = ()   # input ∘ incoming (`from_source`)
    # a sendrecv of at least this many bytes moves by cross-memory attach, as a plain message from
    # `rendezvous` (the transport's while the profile was measured, else the shm transport's
    # `exchange_rendezvous_bytes` here; 0: `rendezvous`)
    exchange_rendezvous: int = 0
    reduce_exchange_rendezvous: int = 0
    # (bytes, seconds the sender of one FIFO message spends posting it and copying it in), below
    # the rendezvous size; empty: a send keeps its sender only for `post`
    send: tuple[tuple[int, float], ...] = ()
    # how long a rank waiting in MPI's barrier keeps its core before it yields (`colls bench`'s
    # ranks wait there once their call has returned); None: unmeasured, as long as colls' `spin`
    barrier_hold: float | None = None
    # (bytes, seconds) of plain sendrecvs sent from huge pages, as `colls bench`'s buffers are from
    # 4 MiB (`colls.bench.cases.fresh_array`): they have an exchange threshold of their own
    # (`transports.shm.exchange_huge_bytes`); `exchange` holds them in small pages below 4 MiB
    exchange_huge: tuple[tuple[int, float], ...] = ()
    # (bytes, seconds) a rank's write of that many bytes of a buffer costs on top of a plain one when
    # a rank on another core has just read them by cross-memory attach, both ranks writing at once
    # (`colls.tune.rewrite_after_read_seconds`); empty: unmeasured, nothing
    rewrite: tuple[tuple[int, float], ...] = ()
    # whether the profile's transport sent big messages by cross-memory attach because its slots
    # copied slowly (`ShmTransport.slow_trips`), and the size a plain exchange from huge pages
    # moves so from (`exchange_huge_bytes`; 0: unknown)
    slots_slow: bool = False
    exchange_huge_rendezvous: int = 0
    # (bytes, seconds) of the exchanges a planned small call makes, persistent (`colls.tune.
    # persistent_exchange_seconds`): plain into another buffer, and a float32 sum in place
    exchange_persistent: tuple[tuple[int, float], ...] = ()
    exchange_persistent_reduce: tuple[tuple[int, float], ...] = ()

    @classmethod
    def load(cls, paths: list[str], runs: str = "median") -> Profile:
        """Several profile files (all measured at the same ranks) in one: each number's median over
        them, or (`runs="fastest"`) its smallest."""
        combine = COMBINE[runs]
        entries = [json.loads(open(path).read()) for path in paths]
        ranks = {entry["ranks"] for entry in entries}
        if len(ranks) != 1:
            raise ValueError(f"profiles of different rank counts {sorted(ranks)} given together")

        def median_table(field: str) -> tuple[tuple[int, float], ...]:
            sizes = sorted({int(size) for entry in entries for size in entry[field]})
            return tuple((size, combine([e[field][str(size)] for e in entries if str(size) in e[field]]))
                         for size in sizes)

        calls = {name for entry in entries for name in entry["call_s"]}
        size = ranks.pop()
        cores = int(entries[0]["cores"])
        chunk, slots = fifo_geometry(size)
        return cls(size, cores, median_table("message_s"),
                   combine([entry["start_s"] for entry in entries]),
                   {name: combine([e["call_s"][name] for e in entries if name in e["call_s"]])
                    for name in calls},
                   median_table("reduce_s_per_byte"), median_table("copy_s_per_byte"),
                   combine([entry.get("spin_s", 0.0) for entry in entries]),
                   combine([entry.get("wake_s", 0.0) for entry in entries]),
                   rendezvous_bytes(*fifo_geometry(size)),
                   median_table("alloc_s_per_byte") if all("alloc_s_per_byte" in e for e in entries)
                   else ((1, 0.0),), combine([entry.get("post_s", 0.0) for entry in entries]),
                   median_table("exchange_s") if all(e.get("exchange_s") for e in entries) else (),
                   median_table("message_written_s") if all(e.get("message_written_s") for e in entries)
                   else (),
                   median_table("exchange_written_s") if all(e.get("exchange_written_s") for e in entries)
                   else (),
                   combine([e["receive_reduce_s"] for e in entries])
                   if all("receive_reduce_s" in e for e in entries) else 0.0,
                   *(combine([e[name] for e in entries]) if all(name in e for e in entries) else None
                     for name in ("one_slot_spin_s", "one_slot_wake_s")),
                   *(combine([e.get(name, 0.0) for e in entries])
                     for name in ("reduce_call_s", "copy_call_s")),
                   median_table("exchange_reduce_s") if all(e.get("exchange_reduce_s") for e in entries)
                   else (),
                   median_table("exchange_after_copy_s")
                   if all(e.get("exchange_after_copy_s") for e in entries) else (),
                   median_table("exchange_reduce_source_s")
                   if all(e.get("exchange_reduce_source_s") for e in entries) else (),
                   *(int(combine([e["exchange_cma_bytes"][kind] for e in entries]))
                     if all(kind in e.get("exchange_cma_bytes", {}) for e in entries)
                     else exchange_rendezvous_bytes(chunk, slots, size, kind == "reducing", cores)
                     for kind in ("plain", "reducing")),
                   send=median_table("send_s") if all(e.get("send_s") for e in entries) else (),
                   barrier_hold=combine([e["barrier_hold_s"] for e in entries])
                   if all(e.get("barrier_hold_s") is not None for e in entries) else None,
                   exchange_huge=median_table("exchange_huge_s")
                   if all(e.get("exchange_huge_s") for e in entries) else (),
                   rewrite=median_table("rewrite_after_read_s")
                   if all(e.get("rewrite_after_read_s") for e in entries) else (),
                   slots_slow=combine([float(e.get("slots_slow", False)) for e in entries]) > 0.5,
                   exchange_huge_rendezvous=int(combine([e["exchange_cma_bytes"]["plain_huge"]
                                                         for e in entries]))
                   if all("plain_huge" in e.get("exchange_cma_bytes", {}) for e in entries) else 0,
                   **{name: median_table(f"{name}_s") if all(e.get(f"{name}_s") for e in entries) else ()
                      for name in ("exchange_persistent", "exchange_persistent_reduce")})

    def message_cost(self, nbytes: int) -> tuple[float, float]:
        """(α, β) of one message of `nbytes`: the measured one-way times of its protocol, linear in
        bytes between the two measured sizes around it (the last two beyond them)."""
        fifo = nbytes < self.rendezvous
        points = [(size, t) for size, t in self.message if (size < self.rendezvous) == fifo]
        if len(points) < 2:   # a protocol measured at one size only: all of it is α
            size, seconds = points[0] if points else self.message[0]
            return seconds, 0.0
        sizes = [size for size, _ in points]
        i = min(max(bisect.bisect_right(sizes, nbytes) - 1, 0), len(points) - 2)
        (low, t_low), (high, t_high) = points[i], points[i + 1]
        beta = max(0.0, (t_high - t_low) / (high - low))
        alpha = t_low - low * beta
        if alpha < 0:   # the line through the two points passes below zero: keep the time, drop α
            alpha, beta = 0.0, (t_low + (nbytes - low) * beta) / max(nbytes, 1)
        return alpha, beta

    def send_seconds(self, nbytes: int) -> float | None:
        """How long a FIFO send of `nbytes` keeps its sender busy (posting, copying in): linear in
        bytes between the measured sizes around it; None from the rendezvous size or unmeasured."""
        points = [(size, t) for size, t in self.send if size < self.rendezvous]
        if nbytes >= self.rendezvous or not points:
            return None
        return _linear(points, nbytes)

    def exchange_limit(self, reducing: bool | str = False) -> int:
        """The smallest sendrecv (reducing or plain) that moves by cross-memory attach."""
        limit = self.reduce_exchange_rendezvous if reducing else self.exchange_rendezvous
        return limit or self.rendezvous

    def exchange_seconds(self, nbytes: int, reducing: bool | str = False, written: bool = False,
                         after_work: bool = False) -> float | None:
        """A sendrecv of `nbytes` below its rendezvous size (`exchange_limit`), the whole step (both
        ranks send and receive, as shm's one-slot path does them together; `reducing`: the receive a float32
        sum, `"source"` one from a third buffer (`Op.from_source`); `after_work`: right after a
        copy or reduction of as many bytes or more; `written`: from
        send buffers their senders have just written; each where measured, in that order): linear
        in bytes between the measured sizes around it, the last two's slope beyond them; None if
        the profile measured none."""
        table = self.exchange
        limit = self.exchange_limit(reducing)
        below = lambda measured: any(size < limit for size, _ in measured)  # noqa: E731
        if reducing == "source" and self.exchange_reduce_source:
            table = self.exchange_reduce_source
        elif reducing and self.exchange_reduce:
            table = self.exchange_reduce
        elif after_work and below(self.exchange_after_copy):
            table = self.exchange_after_copy
        elif written and below(self.exchange_written):
            table = self.exchange_written
        points = [(size, t) for size, t in table if size < limit]
        return _linear(points, nbytes) if points else None

    def contention(self, nbytes: int) -> float:
        """How much slower per byte a cross-memory read of `nbytes` is while another runs: from the
        exchange of that size (each rank posts, then reads while the other reads), at least 1."""
        return self._slower(self.exchange, nbytes, self.post, self.exchange_limit())

    def written_slowdown(self, nbytes: int) -> float:
        """How much slower per byte a cross-memory read of `nbytes` is from a buffer its sender has
        just written (one message of a written buffer beside a clean one), at least 1."""
        return self._slower(self.written, nbytes, 0.0, self.rendezvous)

    def written_contention(self, nbytes: int) -> float:
        """The same for a read while another runs (the exchange of written buffers); at least the
        clean exchange's."""
        if not self.exchange_written:
            return self.contention(nbytes)
        return max(self.contention(nbytes),
                   self._slower(self.exchange_written, nbytes, self.post, self.exchange_limit()))

    def _slower(self, table: tuple[tuple[int, float], ...], nbytes: int, post: float, limit: int) -> float:
        """Per byte, the times of `table` (less `post` and the message's α) over one clean message's
        β, from the sizes it measured by cross-memory attach (`limit` on)."""
        ratios = []
        for size, seconds in table:
            if size < limit:   # FIFO sizes: no cross-memory read to slow down
                continue
            alpha, beta = self.message_cost(size)
            if beta > 0:
                ratios.append((size, max(1.0, (seconds - post - alpha) / size / beta)))
        return _interpolate(ratios, nbytes) if ratios else 1.0

    def rewrite_seconds(self, nbytes: int) -> float:
        """What writing `nbytes` that a rank on another core has just read adds to the write: linear
        between the measured sizes (the last two's slope beyond them, proportional below the
        smallest), at least 0."""
        table = self.rewrite
        if not table:
            return 0.0
        if nbytes <= table[0][0]:
            return max(0.0, table[0][1] * nbytes / table[0][0])
        return max(0.0, _linear(list(table), nbytes))

    def reduce_seconds_per_byte(self, nbytes: int) -> float:
        """γ for a call of `nbytes` (what a byte adds to a sum beyond the sum's own `reduce_call`)."""
        return max(0.0, _interpolate(list(self.reduce), nbytes) - self.reduce_call / max(nbytes, 1))

    def copy_seconds_per_byte(self, nbytes: int) -> float:
        """Seconds per byte of a local copy in a call of `nbytes` (beyond the copy's `copy_call`)."""
        return max(0.0, _interpolate(list(self.copy), nbytes) - self.copy_call / max(nbytes, 1))

    def copy_slowdown(self, nbytes: int, footprint: int) -> float:
        """How many times longer a byte of a copy takes among `footprint` bytes than among `nbytes`
        (at least 1): the local copies' per-byte times, call software and all (so a small piece's
        is no smaller than a big one's), at the two sizes."""
        table = list(self.copy)
        piece = _interpolate(table, max(nbytes, 1))
        return max(1.0, _interpolate(table, footprint) / piece) if piece > 0 else 1.0

    def alloc_seconds_per_byte(self, nbytes: int) -> float:
        """Seconds per byte of first touching a new buffer of `nbytes` (the algorithms' scratch)."""
        return _interpolate(list(self.alloc), nbytes)


class SharedMemory:
    """One machine's ranks: a CPU link per rank, and the cores that every copying flow shares."""

    def __init__(self, size: int, profile: Profile, cores: int | None = None, footprint: int = 0,
                 planned: bool = False, pinned: bool = False) -> None:
        capacity = 1 / REFERENCE_SECONDS_PER_BYTE
        self.cpu = [Link(f"rank{r}.cpu", capacity) for r in range(size)]
        self.cores = Link("cores", (cores or profile.cores) * capacity)
        self.profile = profile
        self.footprint = footprint   # the call's bytes: whether its pieces stream from cache or memory
        # a planned small call (`colls.describe.Plan`): its exchanges are persistent, and cost what
        # the profile's persistent ones did (`Profile.exchange_persistent`), where it measured them
        self.planned = planned
        # ranks held to their cores (`colls bench --pin`): none runs a while on another core that
        # falls idle, as an unpinned one waking up may, so the ranks placed on one core take turns
        # at everything they do (`_together`, `predict`'s barrier)
        self.pinned = pinned
        # more ranks than cores: a rank that waits longer than its spin yields and must wake up;
        # taking a yielded core back costs a switch whatever wait gave it up, so at least the
        # one-slot hand-over measured (profiles before 2026-12-05 measured the general wake-up as 0:
        # their ping-pong paid the one-slot spin, not the general one they took off). 4 ranks, four
        # batches: 18.5/18.4/27.0/24.3% -> 17.5/15.6/23.0/20.7%
        wake = max(profile.wake, profile.one_slot_wake or 0.0)
        self.shares_cores = size > (cores or profile.cores)   # ranks take turns on the cores
        self.time_sharing = TimeSharing(cores or profile.cores, profile.spin, wake,
                                        sendrecv_spin=profile.one_slot_spin,
                                        sendrecv_wake=profile.one_slot_wake,
                                        returned_spin=profile.barrier_hold)
        self.alloc_seconds_per_byte = profile.alloc_seconds_per_byte   # scratch buffers' page faults
        # posting a send or a receive is the rank's own work (a rank that sends and receives at
        # once does both in turn); the rest of a message's α is in the route
        self.post_seconds = profile.post
        # a FIFO send keeps its sender for what the profile measured of it (`Profile.send`): its
        # post and its copy into the slots. Priced at their posts, a 4-rank 1 KiB `direct`
        # broadcast's root made its three sends in 1.9 us and the call came out at 3.7 us against
        # 5.9 measured; at 1.7 us a send (8 B, measured), 6.2 us (2026-12-04, 10 rounds)
        self.send_busy_seconds = self._send_busy if profile.send else None
        # a message from a buffer its sender wrote in the call (reduced, copied or received into)
        # is read at the written rate: the sim tells which (`route_for(..., written=True)`)
        self.tracks_writes = bool(profile.written)
        self.receive_reduce_seconds = profile.receive_reduce   # each reducing receive's call
        # a sendrecv in place up to one slot needs no scratch copy (`ShmTransport.sendrecv_replace`)
        self.in_place_exchange_bytes = fifo_geometry(size)[0]
        # a sendrecv right after a copy, a reduction or a receive beyond one slot is priced as the
        # exchange after a copy (`exchange_after_copy`)
        self.after_work_bytes = self.in_place_exchange_bytes + 1 if profile.exchange_after_copy else None
        # each sum and copy the algorithm code makes, whatever its size (numpy's own call)
        self.reduce_call_seconds, self.copy_call_seconds = profile.reduce_call, profile.copy_call
        # a write to lines a rank on another core has read by cross-memory attach pays for taking
        # them back (`Profile.rewrite`); the sim tells which writes, from which messages it read
        self.rewrite_seconds = profile.rewrite_seconds if profile.rewrite else None

        if profile.exchange_seconds(0) is None:   # an older profile: exchanges as two messages
            self.exchange_route = None

    @property
    def slow_slot_switch(self) -> bool:
        """Whether big messages went by cross-memory attach because the slots copied slowly: as
        the profile's pair found them, where every rank has a core (with more ranks than cores the
        shm transport keeps them in the slots: `ShmTransport.__init__`)."""
        return self.profile.slots_slow and not self.shares_cores

    def _slot_rewrite(self, src: int, dst: int, nbytes: int, reducing: bool | str = False) -> float:
        """What a message's copy into the slots adds to its sender's work while they copy slowly
        and the transport keeps it there (more ranks than cores), priced from the tables of the
        profile's pair, which sent it by cross-memory attach: each slot's lines were read by the
        receiver's core the time before, so the copy takes them back (`Profile.rewrite`). None
        between ranks placed on one core."""
        profile = self.profile
        if not (profile.rewrite and profile.slots_slow and self.shares_cores):
            return 0.0
        if nbytes < (SLOW_REDUCE_FROM_BYTES if reducing else SLOW_FROM_BYTES):
            return 0.0   # the pair kept these in its slots too: their times have it
        placement = self.time_sharing.placement
        if placement and placement[src] == placement[dst]:
            return 0.0
        return profile.rewrite_seconds(nbytes)

    def _together(self, src: int, dst: int) -> bool:
        """Whether two ranks are pinned to one core (more ranks than cores)."""
        placement = self.time_sharing.placement
        return bool(self.pinned and self.shares_cores and placement and placement[src] == placement[dst])

    def _local_copy(self, nbytes: int) -> float:
        """Seconds of one copy of `nbytes` through the slots between two ranks on one core: a
        local copy's rate at the call's size (the lines stay in that core's caches). The profile's
        message tables are of a pair on two cores, whose copies take the lines from the other
        core: in the VM's slow state 4 ranks pinned two to a core sent 256 KiB in 27 us to a rank on
        their core and in 118 us to one on the other (2026-12-05, `/tmp/s11/p2p.py`)."""
        return nbytes * self.profile.copy_seconds_per_byte(max(nbytes, self.footprint))

    def _send_busy(self, nbytes: int) -> float:
        """Seconds a FIFO send of `nbytes` keeps its sender beyond its post."""
        seconds = self.profile.send_seconds(nbytes)
        return 0.0 if seconds is None else max(0.0, seconds - self.post_seconds)

    def exchange_route(self, src: int, dst: int, nbytes: int, reducing: bool | str = False,
                       written: bool = False, after_work: bool = False, apart: bool = False) -> Route | None:
        """A send in a sendrecv below the rendezvous size: the shm transport writes it into its
        slot and takes the reply straight out (`ShmTransport.sendrecv`), or both ranks read the
        other's by cross-memory attach (a plain one beyond a slot), so it costs the measured
        exchange of its size and kind (less the barrier's start, as a message's does; a reducing
        one less the reduction, which the receive charges; one from a buffer the sender `written`
        in this call slower), not a message and two posts; None from its rendezvous size
        (`Profile.exchange_limit`: the general path, messages and reads as above). Between ranks
        pinned to one core, the local copies of `_together` unless `apart` (as between two cores)."""
        profile = self.profile
        # a plain one of a call whose buffers are in huge pages, where measured so: as measured
        huge = (not reducing and self.footprint >= HUGE_FROM_BYTES and bool(profile.exchange_huge)
                and nbytes <= profile.exchange_huge[-1][0])
        if nbytes >= profile.exchange_limit(reducing) and not huge:
            return None
        # priced from the tables, but moved by cross-memory attach all the same: from huge pages
        # beyond their threshold, or beyond the slow-slot sizes while the slots copy slowly
        attached = ((huge and 0 < profile.exchange_huge_rendezvous <= nbytes)
                    or (self.slow_slot_switch
                        and nbytes >= (SLOW_REDUCE_FROM_BYTES if reducing else SLOW_FROM_BYTES)))
        persistent = (profile.exchange_persistent_reduce if reducing else profile.exchange_persistent
                      ) if self.planned else ()
        persistent = persistent if persistent and nbytes <= persistent[-1][0] else ()
        if persistent:
            seconds = _linear(list(persistent), nbytes)
        elif huge:
            seconds = _linear(list(profile.exchange_huge), nbytes)
        else:
            seconds = profile.exchange_seconds(nbytes, reducing, written, after_work)
        alone = seconds
        if self.footprint > nbytes and not (huge or persistent):
            # a piece of a bigger call moves its bytes at no better rate than an exchange of the
            # call's size (as `route_for` prices a big piece): its lines come from where the call's
            # bytes live. A 2-rank 1 MiB ring_segmented makes four 256 KiB exchanges in 184 us,
            # where four alone take 126 us.
            whole = profile.exchange_seconds(self.footprint, reducing, written, after_work)
            seconds = max(seconds, whole * nbytes / self.footprint)
        charged = profile.start   # and the reduction, which the receive charges itself
        if reducing and profile.exchange_reduce:
            gamma = profile.reduce_seconds_per_byte(self.footprint or nbytes)
            charged += nbytes * gamma + profile.receive_reduce
        seconds, alone = max(0.0, seconds - charged), max(0.0, alone - charged)
        # most of the step is the two ranks' own work, not waiting: each copies its message in (as
        # long as a FIFO send kept its sender in the profile) and the other's out (as long again);
        # from the rendezvous size, where the profile has no sender's time (the plain exchanges
        # read the other's buffer by cross-memory attach), all but the smallest message's time is
        # the receiver's work (not all but the α of the line through the big messages' times: that
        # line's α, 49 us at 1 MiB in the profiles of 2026-12-05, is the rates' change with size,
        # not a wait; five 4-rank batches 2.0-2.6 points closer). With more ranks than cores,
        # work holds a core where a wait lends it: priced as waiting, a 4-rank 16 MiB
        # ring_segmented (256 KiB exchanges) came out at 2110 us, 6054 measured (2026-12-04)
        own = profile.send_seconds(nbytes)
        if nbytes >= profile.rendezvous:
            send_busy, receive_busy = 0.0, max(0.0, seconds - profile.message[0][1])
        elif own is not None:
            send_busy = receive_busy = seconds * (min(0.5, own / alone) if alone > 0 else 0.5)
        else:   # an older profile, without the sender's own time: all of it waiting, as before
            send_busy = receive_busy = 0.0
        if not (attached or apart or nbytes >= profile.rendezvous) and self._together(src, dst):
            # two ranks on one core take turns: each copies its message in and the other's out at
            # a local copy's rate, beyond what the smallest exchange holds them (`_local_copy`)
            least = self.exchange_route(src, dst, 8, reducing, written, after_work, apart=True)
            copy = self._local_copy(nbytes)
            return Route(least.alpha, (), f"fifo to {dst}", eager=True, send_busy=least.send_busy + copy,
                         receive_busy=least.receive_busy + copy)
        if not attached:
            send_busy += self._slot_rewrite(src, dst, nbytes, reducing)
        return Route(seconds - send_busy - receive_busy, (), f"fifo to {dst}", eager=True,
                     send_busy=send_busy, receive_busy=receive_busy, reads_sender=attached)

    def route(self, src: int, dst: int) -> Route:
        """A message of no size (the sim asks `route_for` with the size)."""
        return self.route_for(src, dst, 0)

    def route_for(self, src: int, dst: int, nbytes: int, written: bool = False) -> Route:
        """Through the FIFO the sender copies in, then the receiver copies out (two stages), and
        its send is done once copied in (eager);
        by cross-memory attach the receiver copies, once it has posted its receive and runs (on its
        own core, so ranks sharing a core take turns), and the send is done when it has; slower
        from a buffer the sender has `written` in this call (its lines dirty in the sender's cache)."""
        alpha, beta = self.profile.message_cost(nbytes)
        alpha = max(0.0, alpha - self.post_seconds)   # the sender paid its post already
        port = f"fifo to {dst}"   # one FIFO per peer: headers to different peers do not queue
        if nbytes < self.profile.rendezvous:
            # (while the slots copy slowly, a big one goes by cross-memory attach, as measured)
            attached = self.slow_slot_switch and nbytes >= SLOW_FROM_BYTES
            rewrite = 0.0 if attached else self._slot_rewrite(src, dst, nbytes)
            if self.footprint > nbytes:
                # a piece of a bigger call copies at no better rate than a copy of the call's
                # size, as the exchanges and the reads below: its lines come from where the call's
                # bytes live (4 ranks on 2 cores, 2026-12-05, five batches together with the
                # receiver's copy below: 55.9-67.9% -> 38.4-56.3%, `bench/CALIBRATION.md`)
                beta *= self.profile.copy_slowdown(nbytes, self.footprint)
            # but the sender copies its FIFO messages in, one after another, on its own CPU
            # (`ShmTransport._isend` pushes each as it is posted): one port for all of them. As
            # flows of their own, a root's three 256 KiB sends of a 4-rank broadcast shared its
            # CPU and all landed at the end, and the model priced that call at 107 us (34 measured)
            weight = beta / REFERENCE_SECONDS_PER_BYTE / 2
            if self._together(src, dst):
                # two ranks on one core take turns: the sender copies in and the receiver out at a
                # local copy's rate (the sender's in place of the pair's measured send)
                copy = self._local_copy(nbytes)
                return Route(alpha, (self.cpu[src], self.cores), "fifo out", copy / max(nbytes, 1)
                             / REFERENCE_SECONDS_PER_BYTE, eager=True, receive_busy=copy,
                             send_busy=copy - self._send_busy(nbytes))
            if self.shares_cores:
                # more ranks than cores: the receiver's copy out of the slots is work on its own
                # core, not a flow beside it (priced as a flow, a 4-rank 16 MiB pipeline broadcast,
                # 64 pieces through 3 hops of two copies on 2 cores, came out at 1073 us; 5391
                # measured)
                return Route(alpha, (self.cpu[src], self.cores), "fifo out", weight, eager=True,
                             receive_busy=nbytes * beta / 2, reads_sender=attached, send_busy=rewrite)
            return Route(alpha, (self.cpu[src], self.cores), "fifo out", weight, eager=True,
                         then=Route(0.0, (self.cpu[dst], self.cores), "fifo out", weight,
                                    reads_sender=attached), send_busy=rewrite, reads_sender=attached)
        size = max(nbytes, self.footprint)   # a piece of a bigger call copies at the call's size's rate
        if size > nbytes:
            beta = self.profile.message_cost(size)[1] or beta
        # from HELP_BYTES the receiver of a plain message asks its sender to copy half, as it did
        # in the profile: each copies what the profile's message took (both at once there)
        helped = nbytes >= HELP_BYTES
        if written:
            return Route(alpha, (), port, rendezvous=True, pull=beta * self.profile.written_slowdown(size),
                         pull_contended=beta * self.profile.written_contention(size), helped=helped,
                         reads_sender=True)
        return Route(alpha, (), port, rendezvous=True, pull=beta,
                     pull_contended=beta * self.profile.contention(size), helped=helped, reads_sender=True)


@dataclass(frozen=True)
class Point:
    """One measured size beside its prediction."""

    collective: str
    algorithm: str
    ranks: int
    nbytes: int
    measured: float
    predicted: float
    placement: tuple[int, ...] | None = None   # `colls bench --pin`: each rank's core

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted / self.measured - 1


def persistent_steps(collective: str, algorithm: str, ranks: int, nbytes: int) -> bool:
    """Whether `colls bench`'s calls of `algorithm` make their exchanges persistent: a planned
    small call (`colls.describe.Plan`, as `Communicator` plans it): an all_reduce whose algorithm
    is in-place exchanges only, an all_to_all or all_gather whose every step sends to the peer it
    receives from, up to `PLAN_BYTES` (float32 buffers, as the bench's)."""
    if nbytes > PLAN_BYTES or algorithm == "hierarchical":
        return False
    algo = lookup(collective, algorithm)
    if collective == "all_reduce":
        return algo.exchanges is not None and all(algo.exchanges(rank, ranks, SUM) for rank in range(ranks))
    if collective in ("all_to_all", "all_gather") and algo.schedule is not None:
        count = nbytes // 4 // (ranks if collective == "all_gather" else 1)
        schedules = [algo.schedule(rank, ranks, count) for rank in range(ranks)]
        return all(schedule is not None and all(dst == src for dst, _, _, src, _ in schedule.steps)
                   for schedule in schedules)
    return False


def predict(collective: str, algorithm: str, ranks: int, nbytes: int, profile: Profile,
            cores: int | None = None, placement: tuple[int, ...] | None = None,
            pinned: bool = False) -> float:
    """Seconds the simulator predicts for one `colls bench` call (software and input copy included).
    `placement`: each rank's core, as `colls bench --pin` recorded it (`pinned`) or as the bench saw
    unpinned ranks; None: as the kernel deals the ranks out (the mean over the even ways, with more
    ranks than cores)."""
    # the rates of the call's size as two ranks' buffers of it measured them in the profile; the
    # call's ranks touch ranks / 2 times as much memory, so it reads them at that size (4 ranks on
    # 2 cores, 2026-12-04/05: four batches 0.9-2.8 points closer; a 16 MiB copy's thread ran 220 us
    # within a 2-rank call and 585 us within a 4-rank one)
    footprint = int(nbytes * max(1.0, ranks / 2))
    planned = persistent_steps(collective, algorithm, ranks, nbytes)
    pinned = pinned and placement is not None
    network = SharedMemory(ranks, profile, cores, footprint, planned, pinned)
    copy = profile.copy_seconds_per_byte(footprint)
    overhead = profile.call.get(collective, 0.0) + profile.start

    # all_reduce copies x into out first unless the schedule reads x itself (broadcast's root works
    # in place, as colls bench calls it)
    reads_x = collective == "all_reduce" and getattr(lookup(collective, algorithm), "takes_source", False)
    copies_input = collective == "all_reduce" and not reads_x

    # `colls bench` makes the same call on the same buffers again and again: where the profile
    # prices writing lines another core has read (`Profile.rewrite`), a first call tells which
    # bytes of each rank's buffers other ranks read, and the timed call pays for writing them again
    # (the 2-rank ring all-reduce reduces into the half of `out` its peer read the call before)
    made: dict[int, tuple] = {}
    worlds: list = []
    owed: dict[int, list[int]] = {}   # rank -> per argument, the bytes other cores read of it

    def before(transport: SimTransport, args: tuple) -> None:
        made[transport.rank] = args
        if not worlds:
            worlds.append(transport.world)
        buffers = [arg for arg in args if isinstance(arg, np.ndarray)]
        for buf, read in zip(buffers, owed.get(transport.rank, [0] * len(buffers)), strict=True):
            if read:
                transport.world.unpaid[id(root_of(buf))] = [read, read]
        if copies_input:   # the input's copy into `out` (its lines' return included)
            transport.elapse(nbytes * copy)
            transport.overwrite(buffers[0])

    def body(transport: SimTransport) -> int:
        if network.shares_cores and network.pinned:
            # `colls bench`'s ranks leave MPI's barrier down a binomial tree from rank 0 (4 ranks
            # pinned two to a core, 2026-12-05: rank 1 leaves 4-15 us after rank 0, rank 3 2-20 us
            # after rank 2, and rank 2 only once rank 0 yields its core or returns, however long
            # rank 1 waits; `/tmp/s11/yieldt.py`), a hand-on as long as an 8 B message
            rank = transport.rank
            children = [rank + step for step in _tree_steps(rank, ranks) if rank + step < ranks]
            transport.leave_barrier(rank & (rank - 1) if rank else None, children, profile.message[0][1])
        transport.elapse(overhead)   # describe, select, deliver; the first message after the barrier
        return run_algorithm(transport, collective, algorithm, nbytes, source=reads_x, before=before)

    gamma = profile.reduce_seconds_per_byte(footprint)

    def timed(network: SharedMemory) -> float:
        if network.rewrite_seconds is not None:
            run_world(ranks, replace_network(network), body, gamma, copy)   # the call before
            reads = worlds[0].read_by_peers
            owed.update({rank: [reads.get(id(root_of(arg)), (None, 0))[1] for arg in args
                                if isinstance(arg, np.ndarray)] for rank, args in made.items()})
        seconds = run_world(ranks, network, body, gamma, copy).seconds
        for state in (made, worlds, owed):   # (the next placement starts afresh)
            state.clear()
        return seconds

    def replace_network(network: SharedMemory) -> SharedMemory:
        fresh = SharedMemory(ranks, profile, cores, footprint, planned, pinned)
        fresh.time_sharing = network.time_sharing
        return fresh

    cores_used = network.time_sharing.cores
    per = ranks // cores_used
    ways = math.factorial(ranks) // (math.factorial(per) ** cores_used * math.factorial(cores_used))
    if placement is not None and cores_used < ranks:
        network.time_sharing = replace(network.time_sharing,
                                       placement=tuple(core % cores_used for core in placement))
        return timed(network)
    if not (cores_used < ranks and ranks % cores_used == 0) or ways > MAX_PLACEMENTS:
        return timed(network)
    # more ranks than cores: each rank stays on the run queue of one core (the kernel's placement,
    # as even as it can make it), so the model runs every way to deal the ranks out. It takes their
    # mean: a launch's calls mix them (the balancer moves ranks between queues; launches agree by
    # their medians within 4-10% where the placements' times differ by up to 5x), and the middle
    # one flips where one way's wait crosses the spin (a 4 KiB binomial broadcast: 7-11 us or
    # 37-46 us by profile, 18.1 measured). Five 4-rank batches of 2026-12-05 (median and fastest,
    # ten comparisons): 2.2-4.1 points closer in eight, 2.4 and 5.3 further in one batch's two
    times = []
    for placement in placements(ranks, cores_used):
        placed = SharedMemory(ranks, profile, cores, footprint, planned)
        placed.time_sharing = replace(placed.time_sharing, placement=placement)
        times.append(timed(placed))
    return float(np.mean(times))


MAX_PLACEMENTS = 100   # beyond: every rank takes any free core (no placement)


def _tree_steps(rank: int, ranks: int) -> list[int]:
    """The distances to `rank`'s children in a binomial tree from rank 0: the powers of two below
    its lowest set bit (below `ranks` for rank 0)."""
    limit = rank & -rank if rank else ranks
    return [1 << k for k in range(limit.bit_length()) if 1 << k < limit]


def placements(ranks: int, cores: int) -> list[tuple[int, ...]]:
    """Every way to put `ranks` ranks on `cores` cores, as many on each, up to renaming the cores."""
    found = []
    per = ranks // cores

    def deal(assigned: list[int], counts: list[int]) -> None:
        if len(assigned) == ranks:
            found.append(tuple(assigned))
            return
        opened = max(assigned, default=-1) + 1   # a new core only in order: no renamings twice
        for core in range(min(cores, opened + 1)):
            if counts[core] < per:
                counts[core] += 1
                deal(assigned + [core], counts)
                counts[core] -= 1

    deal([], [0] * cores)
    return found


Window = tuple[float, float] | dict[str, tuple[float, float]] | None   # a machine mode: see `in_mode`


def in_mode(entry: dict, window: Window) -> bool:
    """Whether a profile or a bench record was measured in the machine mode `window`: (lo, hi) for
    the cache-line round trips taken before and after it (`round_trip_ns`, `colls.bench.machine`),
    all within [lo, hi); or {field: (lo, hi)} for each of several such fields (`round_trip_ns`,
    `exchange_us`). No window: everything; a window: nothing that has no such measurement."""
    if window is None:
        return True
    bounds = window if isinstance(window, dict) else {"round_trip_ns": window}
    for field, (low, high) in bounds.items():
        values = [value for value in entry.get(field) or [] if value is not None]
        if not values or not all(low <= value < high for value in values):
            return False
    return True


def load_profiles(paths: list[str], runs: str = "median",
                  window: Window = None) -> dict[int, Profile]:
    """Profiles by rank count (those measured in the mode `window`, see `in_mode`); several files
    of one rank count combine as `runs` says."""
    by_ranks: dict[int, list[str]] = {}
    for path in paths:
        entry = json.loads(open(path).read())
        if in_mode(entry, window):
            by_ranks.setdefault(int(entry["ranks"]), []).append(path)
    return {ranks: Profile.load(files, runs) for ranks, files in by_ranks.items()}


def measured_runs(bench_paths: list[str], window: Window = None,
                  by_placement: bool = False) -> dict[tuple, list[float]]:
    """(collective, algorithm, ranks, bytes, placement) -> each bench run's median, in the files'
    order (of the points measured in the mode `window`, see `in_mode`); placement: the ranks' cores
    as `colls bench --pin` recorded them, None unpinned; with `by_placement`, an unpinned run's
    where the bench saw its ranks (`seen_placement`; None where it did not record it)."""
    found: dict[tuple, list[float]] = {}
    for record in colls_records(bench_paths, window):
        placement = tuple(record["placement"]) if record.get("placement") else None
        if placement is None and by_placement:
            placement = seen_placement(record)
        key = (record["collective"], record["algorithm"], record["ranks"], record["bytes"], placement)
        found.setdefault(key, []).append(record["time_median_s"])
    return found


def colls_records(bench_paths: list[str], window: Window = None):
    """The colls rows of the bench files, in their order, those measured in the mode `window`."""
    for path in bench_paths:
        for record in json.loads(open(path).read())["records"]:
            if record.get("implementation") == "colls" and in_mode(record, window):
                yield record


def seen_placement(record: dict) -> tuple[int, ...] | None:
    """Each rank's core through an unpinned bench point, as `colls bench` saw them (`cpus`: each
    rank's CPU as the point began and ended), the cores numbered in the order the ranks first name
    them; None where not recorded or where a rank was on another CPU at the end (a rank may still
    have run a while on the other core in between)."""
    cpus = record.get("cpus")
    if not cpus or any(first != last for first, last in cpus):
        return None
    numbers: dict[int, int] = {}
    return tuple(numbers.setdefault(first, len(numbers)) for first, _ in cpus)


def placements_seen(bench_paths: list[str], window: Window = None) -> dict[int, dict[str, int]]:
    """By rank count, how many unpinned bench points ran at each placement (`seen_placement`,
    written as each rank's core in turn; "-": not recorded, or a rank moved)."""
    counts: dict[int, dict[str, int]] = {}
    for record in colls_records(bench_paths, window):
        if not record.get("placement"):   # (pinned ones are where `--pin` put them)
            seen = seen_placement(record)
            label = "".join(map(str, seen)) if seen else "-"
            tally = counts.setdefault(record["ranks"], {})
            tally[label] = tally.get(label, 0) + 1
    return counts


def measured_medians(bench_paths: list[str], runs: str = "median", window: Window = None,
                     by_placement: bool = False) -> dict[tuple, float]:
    """(collective, algorithm, ranks, bytes, placement) -> the median (or fastest) of several bench
    runs' medians (see `measured_runs`)."""
    found = measured_runs(bench_paths, window, by_placement)
    return {key: COMBINE[runs](times) for key, times in found.items()}


def reproducibility(bench_paths: list[str], runs: str = "median", window: Window = None,
                    by_placement: bool = False) -> dict[int, tuple[float, float, int]]:
    """How closely the bench files agree with themselves, by rank count: every point's runs split
    into alternate halves (1st, 3rd, ... against 2nd, 4th, ...), each half combined as `runs` says,
    then the two compared as a prediction is (`summary`): (geometric-mean error, largest, points).
    No model of these runs can be shown closer than this; points with one run are left out."""
    logs: dict[int, list[float]] = {}
    for key, times in measured_runs(bench_paths, window, by_placement).items():
        if len(times) >= 2:
            first, second = COMBINE[runs](times[0::2]), COMBINE[runs](times[1::2])
            logs.setdefault(key[2], []).append(abs(math.log(second / first)))
    return {ranks: (math.exp(float(np.mean(values))) - 1, math.exp(max(values)) - 1, len(values))
            for ranks, values in logs.items()}


def batches_apart(batches: list[list[str]], runs: str = "median", window: Window = None,
                  by_placement: bool = False) -> dict[int, tuple[float, float, int]]:
    """How far apart several batches of bench files are, by rank count: every point measured in all
    of them predicted at the middle (in ratio) of the batches' figures for it (each batch's runs
    combined as `runs` says), against each batch's figure, as `summary` compares: (geometric-mean
    error, largest, points). A model that predicts a point alike for every batch (from profiles
    alike) can be no closer to all of them than this."""
    figures = [measured_medians(paths, runs, window, by_placement) for paths in batches]
    logs: dict[int, list[float]] = {}
    for key in set(figures[0]).intersection(*figures[1:]):
        values = [batch[key] for batch in figures]
        middle = math.sqrt(min(values) * max(values))
        logs.setdefault(key[2], []).extend(abs(math.log(middle / value)) for value in values)
    return {ranks: (math.exp(float(np.mean(values))) - 1, math.exp(max(values)) - 1,
                    len(values) // len(batches)) for ranks, values in logs.items()}


def compare(bench_paths: list[str], profiles: dict[int, Profile], cores: int | None = None,
            runs: str = "median", window: Window = None, by_placement: bool = False) -> list[Point]:
    """Every colls row of the bench files (medians across files; those measured in the mode
    `window`) whose rank count has a profile, beside the prediction (at the row's placement when
    its ranks were pinned, or with `by_placement` where the bench saw them: a row per placement)."""
    points = []
    medians = measured_medians(bench_paths, runs, window, by_placement)
    pinned = {key for key in measured_runs(bench_paths, window) if key[4] is not None}
    for key, measured in sorted(medians.items(), key=_table_order):
        collective, algorithm, ranks, nbytes, placement = key
        if ranks in profiles:
            predicted = predict(collective, algorithm, ranks, nbytes, profiles[ranks], cores, placement,
                                key in pinned)
            points.append(Point(collective, algorithm, ranks, nbytes, measured, predicted, placement))
    return points


def _table_order(item: tuple) -> tuple:
    (collective, _, ranks, nbytes, placement), _ = item
    return ranks, collective, nbytes, placement or ()


def summary(points: list[Point]) -> tuple[float, float]:
    """(geometric-mean error, largest error) as fractions: exp(mean |ln(pred/meas)|) - 1."""
    logs = [abs(math.log(p.predicted / p.measured)) for p in points]
    return math.exp(float(np.mean(logs))) - 1, max(abs(p.error) for p in points)


def table(points: list[Point]) -> str:
    """The comparison as a Markdown table."""
    pinned = any(p.placement for p in points)
    lines = ["| collective | ranks | size | algorithm | " + ("cores | " if pinned else "")
             + "measured | predicted | error |",
             "| --- | --- | --- | --- | " + ("--- | " if pinned else "") + "--- | --- | --- |"]
    for p in points:
        size = f"{p.nbytes >> 20} MiB" if p.nbytes >= 1 << 20 else f"{p.nbytes >> 10} KiB"
        cores = ("".join(map(str, p.placement)) if p.placement else "-") + " | " if pinned else ""
        lines.append(f"| {p.collective} | {p.ranks} | {size} | {p.algorithm} | {cores}"
                     f"{p.measured * 1e6:.1f} us | {p.predicted * 1e6:.1f} us | {p.error * 100:+.1f}% |")
    return "\n".join(lines)
