"""The model of one machine's shared memory that `colls plan calibrate` checks against `colls bench`:
`SharedMemory`, a network for the `sim` transport whose constants come from a `Profile` (never
fitted to the bench), and `predict`, one bench call's predicted time.

The prediction runs the very algorithm each row used on the `sim` transport over a model of one
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

import math
from dataclasses import replace

import numpy as np

from algorithms import SUM, lookup
from transports.cma import HUGE_FROM_BYTES
from transports.shm import fifo_geometry
from transports.sim import Link, Route, SimTransport, TimeSharing, root_of

from .profile import Profile, _linear
from .simulate import run_algorithm, run_world

PLAN_BYTES = 64 << 10   # calls up to this size cost mostly software: their exchanges are modelled apart
REFERENCE_SECONDS_PER_BYTE = 1e-10   # the links' unit: a route's byte_weight is its β(n) over this


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
        # one-slot hand-over measured (older profiles measured the general wake-up as 0: their
        # ping-pong paid the one-slot spin, not the general one they took off); closer at 4 ranks
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
        # post and its copy into the slots (priced at their posts alone, a small `direct`
        # broadcast's root came out far faster than measured)
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

    def _together(self, src: int, dst: int) -> bool:
        """Whether two ranks are pinned to one core (more ranks than cores)."""
        placement = self.time_sharing.placement
        return bool(self.pinned and self.shares_cores and placement and placement[src] == placement[dst])

    def _local_copy(self, nbytes: int) -> float:
        """Seconds of one copy of `nbytes` through the slots between two ranks on one core: a
        local copy's rate at the call's size (the lines stay in that core's caches). The profile's
        message tables are of a pair on two cores, whose copies take the lines from the other
        core, several times slower than a copy whose lines stay on one core."""
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
        # beyond their threshold
        attached = huge and 0 < profile.exchange_huge_rendezvous <= nbytes
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
        # line's α is the rates' change with size, not a wait). With more ranks than cores, work
        # holds a core where a wait lends it: priced as waiting, a 4-rank ring_segmented came out
        # at a third of its measured time
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
            if self.footprint > nbytes:
                # a piece of a bigger call copies at no better rate than a copy of the call's
                # size, as the exchanges and the reads below: its lines come from where the call's
                # bytes live (`bench/CALIBRATION.md`)
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
                             receive_busy=nbytes * beta / 2)
            return Route(alpha, (self.cpu[src], self.cores), "fifo out", weight, eager=True,
                         then=Route(0.0, (self.cpu[dst], self.cores), "fifo out", weight))
        size = max(nbytes, self.footprint)   # a piece of a bigger call copies at the call's size's rate
        if size > nbytes:
            beta = self.profile.message_cost(size)[1] or beta
        if written:
            return Route(alpha, (), port, rendezvous=True, pull=beta * self.profile.written_slowdown(size),
                         pull_contended=beta * self.profile.written_contention(size),
                         reads_sender=True)
        return Route(alpha, (), port, rendezvous=True, pull=beta,
                     pull_contended=beta * self.profile.contention(size), reads_sender=True)


def persistent_steps(collective: str, algorithm: str, ranks: int, nbytes: int) -> bool:
    """Whether `colls bench`'s calls of `algorithm` make their exchanges persistent: a planned
    small call (`colls.describe.Plan`, as `Communicator` plans it): an all_reduce whose algorithm
    is in-place exchanges only, an all_to_all or all_gather whose every step sends to the peer it
    receives from, up to `PLAN_BYTES` (float32 buffers, as the bench's)."""
    if nbytes > PLAN_BYTES or algorithm == "hierarchical":
        return False
    algo = lookup(collective, algorithm)
    if collective in ("all_reduce", "all_to_all", "all_gather") and algo.schedule is not None:
        count = nbytes // 4 // (ranks if collective == "all_gather" else 1)
        schedules = [algo.schedule(rank, ranks, count, SUM if collective == "all_reduce" else None)
                     for rank in range(ranks)]
        return all(schedule is not None and all(step.dst == step.src for step in schedule.steps)
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
    # call's ranks touch ranks / 2 times as much memory, so it reads them at that size (a copy
    # within a 4-rank call ran well over twice as long as the same copy within a 2-rank one)
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
            # pinned two to a core: rank 1 leaves microseconds after rank 0, rank 3 after rank 2,
            # and rank 2 only once rank 0 yields its core or returns, however long rank 1 waits),
            # a hand-on as long as an 8 B message
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
    # one flips where one way's wait crosses the spin (a small binomial broadcast's placements
    # came out well below and well above its measured time)
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
