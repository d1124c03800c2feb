"""Calibration profiles: what `colls plan calibrate --profile` models one machine's shared memory
with at N ranks, measured by `colls run -n N -m colls.tune --profile FILE.json` (`profile`).

The time of one message from 8 B to 64 MiB between two pinned ranks right after a barrier (both shm
protocols: the FIFO below the rendezvous size, cross-memory attach above), what the barrier adds to
it, the software of one call per collective (on a one-rank group: no message), what posting a
message costs the rank's own CPU (an exchange beside one message), numpy's reductions and copies
per byte at several sizes with as many ranks at once as there are cores (the memory bus is shared)
and what one such numpy call costs whatever its size, the first touch of a new buffer, how long a
waiting rank polls before it yields its core (in a send or receive, and in a sendrecv's one-slot
wait; and, with mpiexec and mpi4py installed, in MPI's barrier, where `colls bench`'s ranks wait
once their call has returned), and what getting one back costs. The probes are in `tune_probes`.
"""

from __future__ import annotations

import os
import statistics

import numpy as np

from transports import cma
from transports.base import Backoff

from .bench.machine import MODE_FIELDS, CoreLink
from .communicator import Communicator
from .tune_probes import (
    SMALL_BYTES,
    after_barrier_seconds,
    after_barrier_times,
    call_seconds,
    exchange_seconds,
    fresh_seconds_per_byte,
    mpi_barrier_hold_seconds,
    one_slot_spin_seconds,
    one_slot_wake_seconds,
    pair_one_way_seconds,
    persistent_exchange_seconds,
    pinned,
    rewrite_after_read_seconds,
    spin_seconds,
    wake_seconds,
    work_seconds_per_byte,
)

PLAN_BYTES = 64 << 10   # calls up to this size cost mostly software: their exchanges are timed apart
# 128 and 512 KiB: the halves of the calls at 256 KiB and 1 MiB (a FIFO exchange beyond one slot)
PROFILE_MESSAGE_BYTES = (8, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10,
                         1 << 20, 4 << 20, 16 << 20, 64 << 20)
PROFILE_WORK_BYTES = (1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
PROFILE_ALLOC_BYTES = (1 << 20, 16 << 20, 32 << 20, 64 << 20)
PROFILE_CALLS = ("all_reduce", "broadcast", "all_to_all")
# The exchanges a profile times at every message size (`exchange_seconds`' options), by field:
# plain; reducing in place (a float32 sum, as the all-reduces' steps: below the FIFO's capacity
# it keeps the FIFO where a plain one beyond a slot goes by cross-memory attach); reducing from
# the input (`Op.from_source`); from send buffers just written; right after a copy.
EXCHANGE_PASSES = 3
HUGE_EXCHANGE_BYTES = (1 << 20, 2 << 20, 4 << 20)   # ... and these, plain, sent from huge pages
EXCHANGE_KINDS = {"exchange_s": {}, "exchange_reduce_s": {"reduce": True},
                  "exchange_reduce_source_s": {"reduce": "source"}, "exchange_written_s": {"written": True},
                  "exchange_after_copy_s": {"after_copy": True}}


def _pair_profile(pair: Communicator, fence: Communicator, allowed: list[int], cores: int,
                  polls: int) -> tuple:
    """`profile`'s measurements between ranks 0 and 1, each pinned to a core of its own (put back
    before the wake-ups, which share one): (message_s, the exchange tables, message_written_s,
    send_s, the scalar terms). `polls`: the whole group's spin before a yield (`spin_seconds`)."""
    def share(value: int) -> int:
        return int(pair.broadcast(np.array([value]), root=0)[0])

    link = CoreLink.open(pair.rank, pair.size, share, pair.barrier)   # before pinning: a core per rank
    before = pinned({allowed[pair.rank % cores]})   # two cores: no hand-over in the numbers
    try:
        mode_before = link.mode() if link is not None else (None, None)   # the VM's mode
        cma_from = pair.transport.capabilities.send_address_from_bytes or 1 << 62   # by address from here
        pair_one_way_seconds(pair, SMALL_BYTES, 2000)   # warm-up
        free = pair_one_way_seconds(pair, SMALL_BYTES, 2000)
        rounds = {n: max(10, min(1000, (1 << 30) // max(n, 1) // 16)) for n in PROFILE_MESSAGE_BYTES}
        both = {n: after_barrier_times(pair, n, rounds[n], fence=fence) for n in PROFILE_MESSAGE_BYTES}
        after = {n: message_time for n, (message_time, _) in both.items()}
        start = max(0.0, after[SMALL_BYTES] - free)
        message = {str(n): max(free, t - start) for n, t in after.items()}
        # how long a send through the FIFO keeps its sender busy (posting it and copying it in)
        send = {str(n): sender for n, (_, sender) in both.items() if n < cma_from}
        exchange_small = exchange_seconds(pair, 2000, fence=fence)
        post = max(0.0, exchange_small - after[SMALL_BYTES])
        # a reducing receive's software beyond a plain one's (the reducer's call; γ of 8 B is nil)
        receive_reduce = max(0.0, exchange_seconds(pair, 2000, reduce=True, fence=fence) - exchange_small)
        # every size and kind: below the rendezvous size a sendrecv is one step (shm's one-slot
        # path), not two messages; from it two cross-memory reads run at once
        # in EXCHANGE_PASSES passes over every kind and size, the median of the passes' medians: a
        # burst of load on a shared machine falls on several entries a little rather than on one
        # (in one pass, a profile's plain 4 MiB exchange took 218, 261 and 324 us in three runs)
        passes = {name: {n: [] for n in PROFILE_MESSAGE_BYTES} for name in EXCHANGE_KINDS}
        for _ in range(EXCHANGE_PASSES):
            for name, how in EXCHANGE_KINDS.items():
                for n in PROFILE_MESSAGE_BYTES:
                    passes[name][n].append(exchange_seconds(pair, rounds[n], n, fence=fence, **how))
        exchanges = {name: {str(n): statistics.median(times) for n, times in by_size.items()}
                     for name, by_size in passes.items()}
        if cma.HUGE_PAGES:
            # plain exchanges sent from huge pages, as `colls bench`'s buffers are from 4 MiB: they
            # have a threshold of their own (`transports.shm.exchange_huge_bytes`), and below 4 MiB
            # the tables above have small pages
            exchanges["exchange_huge_s"] = {
                str(n): statistics.median(exchange_seconds(pair, rounds.get(n, rounds[1 << 20]), n,
                                                           fence=fence, huge=True)
                                          for _ in range(EXCHANGE_PASSES))
                for n in HUGE_EXCHANGE_BYTES}
        # a message from a buffer the sender has just written, at the cross-memory-attach sizes
        written = {str(n): max(free, after_barrier_seconds(pair, n, rounds[n], written=True, fence=fence)
                               - start)
                   for n in PROFILE_MESSAGE_BYTES if n >= cma_from}
        # the exchanges of a planned small call (made persistent), at the sizes it plans
        for name, reduce in (("exchange_persistent_s", False), ("exchange_persistent_reduce_s", True)):
            exchanges[name] = {
                str(n): statistics.median(persistent_exchange_seconds(pair, rounds[n], n, reduce, fence)
                                          for _ in range(EXCHANGE_PASSES))
                for n in PROFILE_MESSAGE_BYTES if n <= PLAN_BYTES}
        # a write of lines the other rank has just read by cross-memory attach (from the sizes a
        # message may go so)
        exchanges["rewrite_after_read_s"] = {
            str(n): rewrite_after_read_seconds(pair, n, rounds[n], fence=fence)
            for n in PROFILE_MESSAGE_BYTES if n >= cma_from}
        spin = spin_seconds(pair, polls)
        one_slot_spin = one_slot_spin_seconds(pair, polls)
        mode_after = link.mode() if link is not None else (None, None)
    finally:
        if link is not None:
            link.close()
        os.sched_setaffinity(0, before)
    # the wake-ups put both ranks on one core themselves (from every core allowed)
    # the ping-pong receives as the schedules do, through the one-slot wait: its spin is that one's
    extra = {"start_s": start, "spin_s": spin, "wake_s": wake_seconds(pair, free, one_slot_spin),
             "post_s": post,
             "receive_reduce_s": receive_reduce, "one_slot_spin_s": one_slot_spin,
             "one_slot_wake_s": one_slot_wake_seconds(pair, exchange_small, one_slot_spin),
             **{f"{name}_{when}": float("nan") if value is None else value
                for when, mode in (("before", mode_before), ("after", mode_after))
                for name, value in zip(MODE_FIELDS, mode, strict=True)}}
    return message, exchanges, written, send, extra


def profile(comm: Communicator) -> dict:
    """Everything `colls plan calibrate --profile` models shared memory with, at this group size.

    Messages are timed between ranks 0 and 1 pinned to two cores (the other ranks idle; unpinned,
    the scheduler now and then puts both on one core and every message becomes a hand-over), right
    after a barrier; `start_s` is what the barrier adds to the first message; reductions and copies
    run on as many ranks at once as there are cores. What more ranks than cores add is the model's
    (`spin_s`, `wake_s`), not the measurement's.

    The barrier before each timed message is another group's (`fence`), as `colls bench` times
    every call after MPI's barrier, which touches none of the transport's FIFOs: a barrier through
    the FIFO the message then takes slowed the message by about a quarter."""
    allowed = sorted(os.sched_getaffinity(0))
    cores = len(allowed)
    workers = min(comm.size, cores)
    pair = comm.split(0 if comm.rank < 2 else None)
    message: dict[str, float] = {}
    exchanges: dict[str, dict[str, float]] = {name: {} for name in EXCHANGE_KINDS}
    written: dict[str, float] = {}
    send: dict[str, float] = {}
    extra: dict[str, float] = {}
    if pair is not None:
        fence = None
        try:
            fence = pair.split(0)
            message, exchanges, written, send, extra = _pair_profile(
                pair, fence, allowed, cores, comm.transport.capabilities.spin_polls or Backoff.SPIN_POLLS)
        finally:
            if fence is not None:
                fence.close()
            pair.close()
    if comm.rank == 0 and comm.size > cores:   # only ranks beyond the cores wait for one
        hold = mpi_barrier_hold_seconds(extra["one_slot_wake_s"])
        extra["barrier_hold_s"] = float("nan") if hold is None else hold
    modes = tuple(f"{name}_{when}" for name in MODE_FIELDS for when in ("before", "after"))
    names = ("start_s", "spin_s", "wake_s", "post_s", "receive_reduce_s", "one_slot_spin_s",
             "one_slot_wake_s", "barrier_hold_s", *modes)
    shared = comm.broadcast(np.array([extra.get(name, float("nan")) for name in names]), root=0)
    measured = {name: float(value) for name, value in zip(names, shared, strict=True)}
    calls = {name: call_seconds(comm, name) for name in PROFILE_CALLS}
    work = {kind: {str(n): work_seconds_per_byte(comm, kind, n, workers) for n in PROFILE_WORK_BYTES}
            for kind in ("reduce", "copy")}
    work["alloc"] = {str(n): fresh_seconds_per_byte(n) for n in PROFILE_ALLOC_BYTES}
    # one numpy call's own cost (an 8 B sum or copy): paid once per call, whatever its size
    work_call = {kind: work_seconds_per_byte(comm, kind, SMALL_BYTES, workers) * SMALL_BYTES
                 for kind in ("reduce", "copy")}
    # the exchange protocols in effect while measuring (the model prices exchanges by them)
    declared = comm.transport.capabilities
    thresholds = {kind: value or 1 << 62 for kind, value in
                  (("plain", declared.exchange_address_from_bytes),
                   ("reducing", declared.reduce_exchange_address_from_bytes),
                   ("plain_huge", declared.huge_exchange_address_from_bytes))
                  if comm.transport.name == "shm"}
    return {"ranks": comm.size, "cores": cores, "transport": comm.transport.name, "message_s": message,
            "exchange_cma_bytes": thresholds,
            **exchanges, "message_written_s": written, "send_s": send,
            **{name: value for name, value in measured.items()
               if name not in modes and value == value},   # NaN: not measured
            # the VM's mode while ranks 0 and 1 measured (`colls.bench.machine`): before, after
            **{field: [round(value, 1) if value == value else None   # NaN: not measured
                       for value in (measured[f"{field}_before"], measured[f"{field}_after"])]
               for field in MODE_FIELDS},
            "call_s": calls, "reduce_s_per_byte": work["reduce"], "copy_s_per_byte": work["copy"],
            "alloc_s_per_byte": work["alloc"], "reduce_call_s": work_call["reduce"],
            "copy_call_s": work_call["copy"]}
