"""The timed probes a calibration profile is made of (`colls.tune_profile`): one message, an
exchange, a write after a peer's read, a wait's spin and wake-up, numpy's work per byte, a call's
own software, each measured on live ranks of this machine."""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from algorithms.ops import SUM
from transports import cma
from transports.base import Backoff
from transports.shm.probes import direct_turn_seconds, wait_turn_seconds

from .bench.cases import fresh_array
from .communicator import Communicator

SMALL_BYTES = 8   # the message of the latency probes


def slowest(comm: Communicator, times: list[float]) -> list[float]:
    """Per round, the largest of every rank's times (a MAX all-reduce, as `colls bench` takes)."""
    return comm.all_reduce(np.array(times), op="max", algorithm="recursive_doubling").tolist()


def ones(count: int, dtype=np.uint8, value: int = 1) -> np.ndarray:
    """A buffer of `count` elements filled with `value`, in memory of its own as `colls bench`'s are
    (`colls.bench.cases.fresh_array`), whatever the profile freed before."""
    buffer = fresh_array(count, dtype)
    buffer.fill(value)
    return buffer


HUGE_PAGE = 2 << 20


def paged_ones(nbytes: int, huge: bool) -> np.ndarray:
    """`nbytes` of ones in memory of their own, all in transparent huge pages where the kernel gives
    them (`huge`: a 2 MiB-aligned piece of a mapping that asks for them) or all in small pages (a
    mapping that asks for none), whatever the size: a profile times exchanges from each kind apart,
    as the shm transport chooses a protocol by the sender's kind (`transports.cma.in_huge_pages`)."""
    region = mmap.mmap(-1, nbytes + (HUGE_PAGE if huge else 0), flags=mmap.MAP_PRIVATE)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None and hasattr(region, "madvise"):
        region.madvise(advice)
    whole = np.frombuffer(region, np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE if huge else 0
    buffer = whole[start:start + nbytes]
    buffer.fill(1)
    return buffer


def pair_one_way_seconds(comm: Communicator, nbytes: int, rounds: int) -> float:
    """Median one-way time of an `nbytes` ping-pong between ranks 2k and 2k+1, every pair at once;
    the slowest pair's per round."""
    buf = ones(nbytes)   # written: untouched zeros are one shared zero page, always in cache
    channel = comm.channel("colls tune pairs", timeout=120)
    partner = comm.rank ^ 1
    times = []
    comm.barrier()
    for _ in range(rounds):
        start = time.perf_counter()
        if partner < comm.size and comm.rank % 2 == 0:
            channel.wait(channel.send(buf, partner))
            channel.exchange(None, None, buf, partner)
        elif partner < comm.size:
            channel.exchange(None, None, buf, partner)
            channel.wait(channel.send(buf, partner))
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(slowest(comm, times))


def after_barrier_seconds(pair: Communicator, nbytes: int, rounds: int, written: bool = False,
                          fence: Communicator | None = None) -> float:
    """Median time, the slower rank's, of one `nbytes` message from rank 0 to rank 1 of a two-rank
    `pair` started right after a barrier (as `colls bench` times a call): the receiver is still
    polling when it comes, so no wake-up is in it. `written`: the sender writes its buffer again
    before each barrier (as an algorithm sends what it just reduced or received: the lines are
    dirty in the sender's cache when the receiver reads them). `fence`: the group whose barrier
    starts each round (default `pair`; see `profile`)."""
    return after_barrier_times(pair, nbytes, rounds, written, fence)[0]


def after_barrier_times(pair: Communicator, nbytes: int, rounds: int, written: bool = False,
                        fence: Communicator | None = None) -> tuple[float, float]:
    """`after_barrier_seconds`, and from the same rounds the sender's own median: how long posting
    the send and waiting for it kept rank 0 busy (below the rendezvous size, the copy into the FIFO
    is the sender's own work: the shm transport makes it in `isend`)."""
    buf = ones(nbytes)   # written: untouched zeros are one shared zero page, always in cache
    channel = pair.channel("colls tune after barrier", timeout=120)
    fence = pair if fence is None else fence
    times = []
    for _ in range(rounds):
        if written and pair.rank == 0:
            buf.fill(1)
        fence.barrier()
        start = time.perf_counter()
        if pair.rank == 0:
            channel.wait(channel.send(buf, 1))
        else:
            channel.exchange(None, None, buf, 0)   # as the schedules take a message
        times.append(time.perf_counter() - start)
    sender = float(pair.broadcast(np.array([statistics.median(times)]), root=0)[0])
    return statistics.median(slowest(pair, times)), sender


def exchange_seconds(pair: Communicator, rounds: int, nbytes: int = SMALL_BYTES, written: bool = False,
                     reduce: bool | str = False, after_copy: bool = False,
                     fence: Communicator | None = None, huge: bool | None = None) -> float:
    """Median time, the slower rank's, of both ranks of a two-rank `pair` exchanging `nbytes`
    (`Channel.exchange`: a send and a receive posted together) right after a barrier: beside one message
    (`after_barrier_seconds`), what a rank's own posting adds when it also sends (8 B), and what
    two cross-memory-attach reads at once cost (large: they slow each other down); `written`: each
    rank writes its send buffer again before the barrier (see `after_barrier_seconds`); `reduce`:
    the receive is a float32 sum into the buffer (`recv_reduce`, as the all-reduces post theirs),
    or with `reduce="source"` one that lands as input ∘ incoming from a third buffer (`Op.from_source`,
    as Rabenseifner's first step and pairwise reduce_scatter make theirs);
    `after_copy`: each rank first copies `nbytes` between two buffers of its own, untimed, after
    the barrier (as all_to_all's local block before its exchange: an exchange right after a big
    memory operation was slower than after a barrier, whatever the copy touched); `fence`: as
    `after_barrier_seconds`; `huge`: both buffers in huge pages (True) or small ones (False),
    not as `colls bench`'s (`paged_ones`)."""
    buf, incoming = ((ones(nbytes), ones(nbytes)) if huge is None
                     else (paged_ones(nbytes, huge), paged_ones(nbytes, huge)))
    source, target = (ones(nbytes), ones(nbytes, value=0)) if after_copy else (buf, buf)
    channel = pair.channel("colls tune exchange", timeout=120)
    own = ones(nbytes // 4, np.float32) if reduce == "source" else None
    reducer = SUM.into_right
    fence = pair if fence is None else fence
    times = []
    for _ in range(rounds):
        if written:
            buf.fill(1)
        fence.barrier()
        if after_copy:
            np.copyto(target, source)
        start = time.perf_counter()
        # one sendrecv, as the schedules' steps are (shm takes a one-slot message straight out)
        if reduce:
            if own is not None:
                reducer = SUM.from_source(own)   # it keeps its place in `own`: one per exchange
            channel.exchange(buf.view(np.float32), 1 - pair.rank, incoming.view(np.float32), 1 - pair.rank,
                             reducer)
        else:
            channel.exchange(buf, 1 - pair.rank, incoming, 1 - pair.rank)
        times.append(time.perf_counter() - start)
    return statistics.median(slowest(pair, times))


def persistent_exchange_seconds(pair: Communicator, rounds: int, nbytes: int, reduce: bool = False,
                                fence: Communicator | None = None) -> float:
    """`exchange_seconds` for the exchange of a small call compiled to a schedule (its step bound
    once, `Channel.exchange_init`): `reduce`, a float32 sum in place, as a small all_reduce's;
    else plain into another buffer, as a small all_to_all's."""
    fence = pair if fence is None else fence
    buf, incoming = ones(nbytes), ones(nbytes)
    dtype = np.dtype(np.float32) if reduce else np.dtype(np.uint8)
    channel = pair.channel("colls tune persistent exchange", timeout=120)
    peer = 1 - pair.rank
    mine = buf.view(dtype)
    into = mine if reduce else incoming.view(dtype)
    step = channel.exchange_init(dtype, mine.size, peer, into.size, peer, SUM.into_right if reduce else None)
    times = []
    for _ in range(rounds):
        if reduce:
            buf.fill(0)   # (a sum of ones again and again would overflow to inf in float32)
        fence.barrier()
        start = time.perf_counter()
        step(mine, into)
        times.append(time.perf_counter() - start)
    return statistics.median(slowest(pair, times))


def rewrite_after_read_seconds(pair: Communicator, nbytes: int, rounds: int,
                               fence: Communicator | None = None) -> float:
    """What writing `nbytes` of its own buffer costs each rank of a two-rank `pair` on top of a plain
    write, when the other rank has just read them by cross-memory attach (as a big message's receiver
    reads its sender's buffer) and both write at once (the slower rank's median, less the same
    without the reads): the reader's cache holds the lines, and each store must take its line back
    first. The 2-rank ring all-reduce pays it every call, where each rank reduces into the half of
    its output its peer read in the call before; it can cost several times the write itself, and a
    rank writing alone, its peer idle, pays less than both writing at once. 0.0 where cross-memory
    attach is not allowed. `fence`: as `after_barrier_seconds`."""
    fence = pair if fence is None else fence
    buf, source, landing = ones(nbytes), ones(nbytes, value=2), ones(nbytes)
    peers = pair.all_gather(np.array([os.getpid(), cma.address_of(buf)], np.int64)).reshape(2, 2)
    pid, address = (int(value) for value in peers[1 - pair.rank])
    # (a uint8 buffer of ones: its first 8 bytes read as this int64)
    readable = cma.probe(pid, address, int.from_bytes(b"\x01" * 8, "little"))
    if not pair.all_reduce(np.array([int(readable)], np.int64), op="min")[0]:
        return 0.0
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for read in (False, True):   # in turn, so that both see the same state of the machine
            fence.barrier()
            if read:
                cma.read(pid, address, landing)
            fence.barrier()
            start = time.perf_counter()
            np.copyto(buf, source)
            times[read].append(time.perf_counter() - start)
    return max(0.0, statistics.median(slowest(pair, times[True]))
               - statistics.median(slowest(pair, times[False])))


def pinned(cores: set[int]) -> set[int]:
    """Run this process on `cores` only; returns the cores it was allowed before."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    return allowed


def call_seconds(comm: Communicator, collective: str, rounds: int = 2000) -> float:
    """Software of one call of `collective` (describe, select, run, deliver) on a 1 KiB buffer in a
    one-rank group, where no message moves."""
    alone = comm.split(comm.rank)
    x = np.ones(256, np.float32)
    out = np.empty_like(x)
    call = {"all_reduce": lambda: alone.all_reduce(x, out=out),
            "broadcast": lambda: alone.broadcast(x, root=0, out=x),
            "all_to_all": lambda: alone.all_to_all(x, out=out)}[collective]
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    alone.close()
    return statistics.median(times)


def spin_seconds(pair: Communicator, polls: int = Backoff.SPIN_POLLS, rounds: int = 100) -> float:
    """How long a waiting rank polls before it yields its core: `polls` turns of the transport's
    wait loop with a receive pending (rank 1 of a two-rank `pair`, rank 0 sends late); the shm
    transport's own loop (`transports.shm.probes`), else the backoff's alone. `polls`: the
    profiled group's (`Capabilities.spin_polls`: fewer where ranks outnumber cores)."""
    buf = np.zeros(SMALL_BYTES, np.uint8)
    channel = pair.channel("colls tune spin", timeout=120)
    times = [0.0] * rounds
    for i in range(rounds):
        pair.barrier()
        if pair.rank == 1:
            receive = channel.recv(buf, 0)   # rank 0 sends after the next barrier
            if pair.transport.name == "shm":
                times[i] = wait_turn_seconds(pair.transport, receive, polls - 1)
            else:
                backoff = Backoff(polls)
                start = time.perf_counter()
                for _ in range(polls - 1):
                    time.monotonic()   # the deadline check
                    backoff.pause()
                times[i] = time.perf_counter() - start
        pair.barrier()
        if pair.rank == 0:
            channel.wait(channel.send(buf, 1))
        else:
            channel.wait(receive)
    return statistics.median(slowest(pair, times))


def one_slot_spin_seconds(pair: Communicator, polls: int = Backoff.SPIN_POLLS,
                          rounds: int = 100) -> float:
    """How long a rank waiting in a sendrecv polls before it yields its core: `polls` turns of
    the shm direct path's wait (`transports.shm.probes`) on rank 1 of a two-rank `pair`; 0 on
    another transport."""
    if pair.transport.name != "shm" or pair.rank != 1:
        return statistics.median(slowest(pair, [0.0] * rounds))
    times = [direct_turn_seconds(pair.transport, 0, polls) for _ in range(rounds)]
    return statistics.median(slowest(pair, times))


def one_slot_wake_seconds(pair: Communicator, free: float, spin: float, rounds: int = 2000) -> float:
    """What a rank that yielded its core in a sendrecv's one-slot wait waits to get one back: 8 B
    exchanges back to back of a two-rank `pair` pinned to one core (each exchange hands the core
    over once: the first rank to wait yields, the other finds its message there) less the free
    exchange `free` and the `spin` the waiting rank polls before it yields."""
    buf, incoming = np.ones(SMALL_BYTES, np.uint8), np.ones(SMALL_BYTES, np.uint8)
    channel = pair.channel("colls tune one-core exchange", timeout=120)
    allowed = pinned({min(os.sched_getaffinity(0))})
    try:
        times = []
        for _ in range(5):
            pair.barrier()
            start = time.perf_counter()
            for _ in range(rounds):
                channel.exchange(buf, 1 - pair.rank, incoming, 1 - pair.rank)
            times.append((time.perf_counter() - start) / rounds)
        shared = statistics.median(slowest(pair, times))
    finally:
        os.sched_setaffinity(0, allowed)
    return max(0.0, shared - free - spin)


def wake_seconds(pair: Communicator, free: float, spin: float, rounds: int = 300) -> float:
    """What a rank that yielded its core waits to get one back: an 8 B ping-pong of a two-rank
    `pair` pinned to one core (each message hands the core over) less the free one-way time `free`
    and the `spin` the waiting rank polls before it yields (the one-slot wait's: the ping-pong's
    receive takes that path)."""
    allowed = pinned({min(os.sched_getaffinity(0))})
    try:
        shared = pair_one_way_seconds(pair, SMALL_BYTES, rounds)
    finally:
        os.sched_setaffinity(0, allowed)
    return max(0.0, shared - free - spin)


def mpi_barrier_times(timeout: float = 120.0) -> dict[str, float | None] | None:
    """Seconds per MPI barrier of two ranks (`colls.bench.barrier`, under this environment's
    mpiexec), pinned to one core (`one_core_s`: each barrier hands the core over) and on a core each
    (`two_cores_s`, None with one core allowed).

    Args:
        timeout: seconds the mpiexec run may take.

    Returns:
        {"one_core_s": ..., "two_cores_s": ...}, or None without mpiexec or mpi4py, or if the run fails.
    """
    from .launcher import _FOREIGN_LAUNCHER_PREFIXES, find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
        return None
    # a job of its own: not the PMI connection of an mpiexec this rank may run under
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(_FOREIGN_LAUNCHER_PREFIXES)}
    try:
        done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "colls.bench.barrier"], env=env,
                              capture_output=True, text=True, timeout=timeout, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def barrier_hold_seconds(measured: dict[str, float | None], wake: float) -> float | None:
    """How long a rank waiting in MPI's barrier polls before it yields its core: the barrier on one
    core (`mpi_barrier_times`) less the free barrier (a core each) and the wake-up `wake` of the
    rank that takes the core over, never below 0; None with one core (nothing to hand over to).
    On a busy machine the hand-over includes other processes' time slices, and so does this."""
    if measured.get("two_cores_s") is None:
        return None
    return max(0.0, measured["one_core_s"] - measured["two_cores_s"] - wake)


def mpi_barrier_hold_seconds(wake: float, timeout: float = 120.0) -> float | None:
    """`barrier_hold_seconds` of a fresh `mpi_barrier_times` run; None where that is None."""
    measured = mpi_barrier_times(timeout)
    return None if measured is None else barrier_hold_seconds(measured, wake)


def work_seconds_per_byte(comm: Communicator, kind: str, nbytes: int, workers: int | None = None) -> float:
    """Seconds per byte of an in-place float32 sum (`kind` "reduce") or a copy ("copy") of `nbytes`,
    the first `workers` ranks (default every rank) at once after a barrier (the slowest one's,
    median over rounds)."""
    a = ones(max(1, nbytes // 4), np.float32)
    b = ones(a.size, np.float32)
    rounds = max(5, min(200, (64 << 20) // max(nbytes, 1) * 5))
    times = []
    for _ in range(rounds):
        comm.barrier()
        start = time.perf_counter()
        if workers is not None and comm.rank >= workers:
            pass
        elif kind == "reduce":
            np.add(a, b, out=a)
        else:
            np.copyto(a, b)
        times.append(time.perf_counter() - start)
    return statistics.median(slowest(comm, times)) / a.nbytes


def fresh_seconds_per_byte(nbytes: int) -> float:
    """What a copy into a newly allocated `nbytes` buffer costs per byte beyond one into a buffer
    used before (the page faults of a fresh mapping: numpy's allocator maps big buffers anew)."""
    source = np.ones(nbytes, np.uint8)
    warm = np.zeros(nbytes, np.uint8)
    warm_times, fresh_times = [], []
    for _ in range(max(5, min(50, (256 << 20) // nbytes))):
        start = time.perf_counter()
        np.copyto(warm, source)
        warm_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        fresh = np.empty_like(source)
        np.copyto(fresh, source)
        fresh_times.append(time.perf_counter() - start)
        del fresh
    return max(0.0, statistics.median(fresh_times) - statistics.median(warm_times)) / nbytes
