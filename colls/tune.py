"""`colls tune`: measure the cost model's α, β and γ on this machine and save them.

α and β come from a ping-pong between ranks 0 and 1 over the transport itself (8 B and 4 MiB
messages, median of many round trips); γ from timing a numpy reduction of 4 MiB in place. Run by
`colls tune [-n N] [--transport shm]`, which starts N ranks of `python -m colls.tune`; they then time
every algorithm of each collective at sizes from 8 B to 64 MiB and save which was fastest where
(`rules`).

`colls run -n N -m colls.tune --profile FILE.json` measures instead what `colls plan calibrate
--profile` models one machine's shared memory with at N ranks (`profile`): the time of one message
from 8 B to 64 MiB between two pinned ranks right after a barrier (both shm protocols: the FIFO below
the rendezvous size, cross-memory attach above), what the barrier adds to it, the software of one call per
collective (on a one-rank group: no message), what posting a message costs the rank's own CPU
(an exchange beside one message), numpy's reductions and copies per byte at several
sizes with as many ranks at once as there are cores (the memory bus is shared) and what one such
numpy call costs whatever its size, the first touch of
a new buffer, how long a waiting rank polls before it yields its core (in a send or receive, and
in a sendrecv's one-slot wait; and, with mpiexec and mpi4py installed, in MPI's barrier, where
`colls bench`'s ranks wait once their call has returned), and what getting one back costs.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from algorithms.cost import Machine
from algorithms.ops import SUM
from transports import cma
from transports.base import Backoff
from transports.shm import SLOW_FROM_BYTES

from .bench.cases import fresh_array
from .bench.machine import MODE_FIELDS, CoreLink
from .bench.spec import COLLECTIVES, format_bytes
from .communicator import Communicator
from .describe import PLAN_BYTES
from .selection import save_tuned


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
    mapping that asks for none), whatever the size: `exchange_crossover` measures each kind apart,
    as the shm transport chooses by the sender's kind (`transports.cma.in_huge_pages`)."""
    region = mmap.mmap(-1, nbytes + (HUGE_PAGE if huge else 0), flags=mmap.MAP_PRIVATE)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None and hasattr(region, "madvise"):
        region.madvise(advice)
    whole = np.frombuffer(region, np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE if huge else 0
    buffer = whole[start:start + nbytes]
    buffer.fill(1)
    return buffer


SMALL_BYTES = 8
LARGE_BYTES = 4 << 20


def one_way_seconds(comm: Communicator, nbytes: int, rounds: int) -> float:
    """Median one-way time of an `nbytes` message between ranks 0 and 1 (half a round trip)."""
    buf = np.zeros(nbytes, np.uint8)
    channel = comm.channel("colls tune", timeout=120)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        if comm.rank == 0:
            channel.wait(channel.send(buf, 1))
            channel.receive(buf, 1)
        elif comm.rank == 1:
            channel.receive(buf, 0)
            channel.wait(channel.send(buf, 0))
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times)


def reduce_seconds_per_byte(nbytes: int = LARGE_BYTES, rounds: int = 20) -> float:
    """Seconds per byte of an in-place float32 sum with numpy."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        np.add(a, b, out=a)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / nbytes


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


def slowest(comm: Communicator, times: list[float]) -> list[float]:
    """Per round, the largest of every rank's times (a MAX all-reduce, as `colls bench` takes)."""
    return comm.all_reduce(np.array(times), op="max", algorithm="recursive_doubling").tolist()


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
            channel.receive(buf, partner)
        elif partner < comm.size:
            channel.receive(buf, partner)
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
            channel.receive(buf, 0)   # as the schedules take a message (a one-slot one straight out)
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
    """`exchange_seconds` for an exchange made persistent (`Channel.persistent_exchange`), as a
    planned small call makes its steps (`colls.describe.Plan`): `reduce`, a float32 sum in place,
    as a small all_reduce's; else plain into another buffer, as a small all_to_all's. Its copies
    and checks are worked out once, so it costs less software than a sendrecv (2026-12-05, 2 ranks,
    1 KiB: 4.08 us against 5.70 reducing, 3.64 against 5.85 plain)."""
    fence = pair if fence is None else fence
    buf, incoming = ones(nbytes), ones(nbytes)
    dtype = np.dtype(np.float32) if reduce else np.dtype(np.uint8)
    channel = pair.channel("colls tune persistent exchange", timeout=120)
    run = channel.persistent_exchange(dtype, nbytes // dtype.itemsize, 1 - pair.rank,
                                      SUM.into_right if reduce else None)
    mine, theirs = buf.view(dtype), incoming.view(dtype)
    times = []
    for _ in range(rounds):
        if reduce:
            buf.fill(0)   # (a sum of ones again and again would overflow to inf in float32)
        fence.barrier()
        start = time.perf_counter()
        if reduce:
            run(mine)
        else:
            run(mine, theirs)
        times.append(time.perf_counter() - start)
    return statistics.median(slowest(pair, times))


def rewrite_after_read_seconds(pair: Communicator, nbytes: int, rounds: int,
                               fence: Communicator | None = None) -> float:
    """What writing `nbytes` of its own buffer costs each rank of a two-rank `pair` on top of a plain
    write, when the other rank has just read them by cross-memory attach (as a big message's receiver
    reads its sender's buffer) and both write at once (the slower rank's median, less the same
    without the reads): the reader's cache holds the lines, and each store must take its line back
    first. The 2-rank ring all-reduce pays it every call, where each rank reduces into the half of
    its output its peer read in the call before. 2026-12-05, a 2 MiB reducing exchange: 199-207 us
    back to back, 1038-1050 us right after the peer read that half, in a state of the VM that
    alternates with a fast one (213-220 us after a read); and a rank writing alone, its peer idle,
    paid less (1 MiB: 272 us more, against 407 with both writing). 0.0 where cross-memory attach is
    not allowed. `fence`: as `after_barrier_seconds`."""
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
    wait loop with a receive pending (rank 1 of a two-rank `pair`, rank 0 sends late). `polls`: the
    profiled group's (`ShmTransport.spin_polls`: fewer where ranks outnumber cores)."""
    buf = np.zeros(SMALL_BYTES, np.uint8)
    channel = pair.channel("colls tune spin", timeout=120)
    poll = getattr(pair.transport, "progress", lambda: False)
    times = [0.0] * rounds
    for i in range(rounds):
        pair.barrier()
        if pair.rank == 1:
            receive = channel.recv(buf, 0)
            backoff = Backoff(polls)
            start = time.perf_counter()
            for _ in range(polls - 1):   # what wait_all does on each turn
                poll()
                if receive.done:   # cannot be: rank 0 sends after the next barrier
                    break
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
    the shm one-slot receive's loop (`ShmTransport._receive_now`: read the FIFO's head,
    check for other messages in flight) on rank 1 of a two-rank `pair`; 0 on a transport without it."""
    transport = pair.transport
    inbound = getattr(transport, "inbound", None)
    if inbound is None or pair.rank != 1:
        return statistics.median(slowest(pair, [0.0] * rounds))
    ctl, tail = inbound[0].ctl, transport.read_tail[0]
    times, landed = [], 0
    for _ in range(rounds):
        turns = 0
        start = time.perf_counter()
        while turns < polls:   # the loop's test, read but not obeyed (rank 0 may send)
            landed += ctl[0] > tail
            if transport.active_out or transport.active_in:
                transport.progress()
            turns += 1
        times.append(time.perf_counter() - start)
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


def mpi_barrier_hold_seconds(wake: float, timeout: float = 120.0) -> float | None:
    """How long a rank waiting in MPI's barrier polls before it yields its core: two ranks'
    barriers pinned to one core (`colls.bench.barrier`, under this environment's mpiexec) less the
    free barrier (a core each) and the wake-up `wake` of the rank that takes the core over; None
    without mpiexec or mpi4py, or if the run fails."""
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
        measured = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if measured.get("two_cores_s") is None:   # one core only: nothing to hand over to
        return None
    return max(0.0, measured["one_core_s"] - measured["two_cores_s"] - wake)


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
        cma_from = getattr(pair.transport, "rendezvous_bytes", 64 << 10)   # cross-memory attach from here
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
        trips = getattr(pair.transport, "slow_trips", 0)   # the slow-slot switch (see below)
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
        # whether the slots copied slowly while the exchanges were timed, so that the big ones went
        # by cross-memory attach (`ShmTransport._timed_slot_copy`)
        slots_slow = getattr(pair.transport, "slow_trips", 0) > trips
        # the exchanges of a planned small call (made persistent), at the sizes it plans
        for name, reduce in (("exchange_persistent_s", False), ("exchange_persistent_reduce_s", True)):
            exchanges[name] = {
                str(n): statistics.median(persistent_exchange_seconds(pair, rounds[n], n, reduce, fence)
                                          for _ in range(EXCHANGE_PASSES))
                for n in PROFILE_MESSAGE_BYTES if n <= PLAN_BYTES}
        # a write of lines the other rank has just read by cross-memory attach (from the slow-slot
        # switch's sizes: a message that big may go so)
        exchanges["rewrite_after_read_s"] = {
            str(n): rewrite_after_read_seconds(pair, n, rounds[n], fence=fence)
            for n in PROFILE_MESSAGE_BYTES if n >= min(cma_from, SLOW_FROM_BYTES)}
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
             "post_s": post, "slots_slow": float(slots_slow),
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
    every call after MPI's barrier, which touches none of the transport's FIFOs. A barrier through
    the FIFO the message then takes slowed it: measured 2026-12-03, 2 ranks, a 64 KiB message 16.3-
    16.9 us after a barrier of the same group, 12.8-13.3 us after one of another group or a flag
    in shared memory, 12.4-12.7 us after MPI's (32 KiB: 11.2, 10.7-11.1, 8.7-9.3 us)."""
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
                pair, fence, allowed, cores, getattr(comm.transport, "spin_polls", Backoff.SPIN_POLLS))
        finally:
            if fence is not None:
                fence.close()
            pair.close()
    if comm.rank == 0 and comm.size > cores:   # only ranks beyond the cores wait for one
        hold = mpi_barrier_hold_seconds(extra["one_slot_wake_s"])
        extra["barrier_hold_s"] = float("nan") if hold is None else hold
    modes = tuple(f"{name}_{when}" for name in MODE_FIELDS for when in ("before", "after"))
    names = ("start_s", "spin_s", "wake_s", "post_s", "slots_slow", "receive_reduce_s", "one_slot_spin_s",
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
    thresholds = {kind: int(getattr(comm.transport, name)) for kind, name in
                  (("plain", "exchange_rendezvous_bytes"), ("reducing", "reduce_exchange_rendezvous_bytes"),
                   ("plain_huge", "exchange_huge_bytes"))
                  if hasattr(comm.transport, name)}
    return {"ranks": comm.size, "cores": cores, "transport": comm.transport.name, "message_s": message,
            "exchange_cma_bytes": thresholds,
            **exchanges, "message_written_s": written, "send_s": send,
            **{name: value for name, value in measured.items()
               if name not in modes and name != "slots_slow" and value == value},   # NaN: not measured
            "slots_slow": measured["slots_slow"] == 1.0,
            # the VM's mode while ranks 0 and 1 measured (`colls.bench.machine`): before, after
            **{field: [round(value, 1) if value == value else None   # NaN: not measured
                       for value in (measured[f"{field}_before"], measured[f"{field}_after"])]
               for field in MODE_FIELDS},
            "call_s": calls, "reduce_s_per_byte": work["reduce"], "copy_s_per_byte": work["copy"],
            "alloc_s_per_byte": work["alloc"], "reduce_call_s": work_call["reduce"],
            "copy_call_s": work_call["copy"]}


RULE_BYTES = (8, 512, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20,
              2 << 20, 4 << 20, 16 << 20, 64 << 20)
RULE_BUDGET_S = 0.1   # per algorithm and size, after a first call that sets how many fit
# a new rule starts only where another algorithm beats the one in force by this much: algorithms
# that make the same steps at a size (binomial and direct broadcast at 2 ranks) would otherwise
# take turns by noise
RULE_MARGIN = 0.05
BLOCKS = 5   # rounds of `call_times`: each times a block of consecutive calls of every algorithm


def call_times(comm: Communicator, calls: dict[str, Callable[[], object]],
               budget_s: float = RULE_BUDGET_S) -> dict[str, float]:
    """Median over calls, the slowest rank's, of each call started right after a barrier.

    The calls run in blocks of consecutive calls of one algorithm, as a program repeats one call
    and as `colls bench` times them; the blocks take turns over `BLOCKS` rounds, starting from the
    next algorithm each round, so that a burst of load falls on all of them (timed one after
    another, the one a burst hit lost its size's rule). Blocks, not single calls interleaved, so
    that each algorithm is timed as a program that repeats one call runs it. A first call each
    sets the calls: as many as the slowest call fits in `budget_s`, 5 to 100.
    """
    names = list(calls)
    first = np.empty(len(names))
    for i, name in enumerate(names):
        comm.barrier()
        start = time.perf_counter()
        calls[name]()
        first[i] = time.perf_counter() - start
    first = comm.all_reduce(first, op="max", algorithm="recursive_doubling")
    count = int(max(5, min(100, budget_s / max(float(first.max()), 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(BLOCKS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for _ in range(count // BLOCKS + (r < count % BLOCKS)):
                comm.barrier()
                start = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(slowest(comm, times[name])) for name in names}


RULE_COLLECTIVES = COLLECTIVES   # what `colls tune` ranks by measurement: every one `colls bench` times


def rules(comm: Communicator, collective: str = "all_reduce",
          sizes: tuple[int, ...] = RULE_BYTES) -> list[tuple[int, str]]:
    """Which `collective` algorithm is fastest on `comm`'s ranks at each of `sizes` (float32 sum,
    the buffers `colls bench` gives it, sizes as it counts them, root 0 for broadcast and reduce):
    the rules `Selector` follows, [(from bytes, algorithm), ...]. The selector applies them at
    every root; a binomial reduce to another root sends one message more.

    A new rule must win twice: where a size's round of every algorithm says another one beats the
    one in force, the two are timed again, head to head. A challenger that wins that round too
    makes the rule (the size keeps the two's head-to-head times); one that loses it is out of the
    running at that size, and the next best of the first round is tried the same way. With one
    call per block at 64 MiB, a burst on the machine once gave a 4-rank all_reduce
    `ring_segmented` from 64 MiB, which took 105 ms there against `rabenseifner`'s 26 (2026-12-05,
    the 16:18 set: Gloo 1.44x)."""
    from algorithms import names

    from .bench.cases import colls_call, make_case

    candidates = [name for name in names(collective) if name != "hierarchical"]
    timed: list[tuple[int, dict[str, float]]] = []
    for nbytes in sizes:
        case = make_case(collective, nbytes, "sum", "float32", comm.rank, comm.size)
        calls = {name: colls_call(comm, case, name)[0] for name in candidates}
        seconds = call_times(comm, calls)
        while (timed and case.nbytes > timed[-1][0]
               and (switch := switch_to(rules_from(timed), case.nbytes, seconds)) is not None):
            held, challenger = switch
            again = call_times(comm, {held: calls[held], challenger: calls[challenger]})
            if switch_to([(0, held)], case.nbytes, again) is not None:
                seconds = again   # it won twice: the head-to-head's times make the rule
                break
            del seconds[challenger]   # lost: out of this size's running (the others' first times stand)
        timed.append((case.nbytes, seconds))
    return rules_from(timed)


def switch_to(fastest: list[tuple[int, str]], nbytes: int,
              seconds: dict[str, float]) -> tuple[str, str] | None:
    """(the algorithm in force, the one to start a new rule with) where `seconds`, the times at
    `nbytes`, would start a new rule after the rules `fastest` of the sizes below: another
    algorithm beats the one in force by RULE_MARGIN. None where they would not (no rule yet, a size
    not above where the last rule starts, no clear win)."""
    if not fastest or nbytes <= fastest[-1][0]:
        return None
    held = fastest[-1][1]
    best = min(seconds, key=lambda name: (seconds[name], name))
    if best != held and seconds[best] < (1 - RULE_MARGIN) * seconds[held]:
        return held, best
    return None


def rules_from(timed: list[tuple[int, dict[str, float]]]) -> list[tuple[int, str]]:
    """Rules from (bytes, seconds by algorithm) in rising bytes: the fastest from the first size
    on, then a new rule wherever another beats the one in force by RULE_MARGIN (`switch_to`). The
    last rule holds beyond the largest size measured."""
    fastest: list[tuple[int, str]] = []
    last = -1
    for nbytes, seconds in timed:
        if nbytes <= last:
            continue   # many ranks round small sizes up to one element each: measured already
        last = nbytes
        if not fastest:
            fastest.append((0, min(seconds, key=lambda name: (seconds[name], name))))
        elif (switch := switch_to(fastest, nbytes, seconds)) is not None:
            fastest.append((nbytes, switch[1]))
    return fastest


CROSSOVER_BYTES = (512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20)
CROSSOVER_ROUNDS = 3   # interleaved FIFO / cross-memory rounds per size
# an exchange through the slots slower than this is the VM's slow state: 512 KiB took ~42 us
# otherwise and ~250 us in it (2026-12-05); 4 GB/s is the slow-slot switch's 8 GB/s a copy, for the
# two copies (in, then out) on each rank's path
SLOW_EXCHANGE_BYTES_PER_S = 4e9


def exchange_crossover(pair: Communicator, reducing: bool, huge: bool = False) -> int | None:
    """From which size a sendrecv of a two-rank `pair` (plain, or `reducing` into a float32 sum) is
    faster by cross-memory attach than through the FIFO's slots, on this machine, sent from small
    pages (or `huge` ones: `transports.shm.exchange_huge_bytes`): both protocols forced in turn on
    the live transport at each of `CROSSOVER_BYTES` (medians of interleaved rounds); the smallest
    size from which cross-memory attach wins by `RULE_MARGIN` at that size and every larger one,
    twice the largest if it never does. The shm transport takes it from the tune file
    (`transports.shm.tuned_exchange_bytes`); see `exchange_rendezvous_bytes` for why it depends on
    the machine (2026-12-03: from one slot, 2026-12-04: from 4 and 16 MiB).

    None when the slots ran in the VM's slow state (`transports.shm.SLOW_FROM_BYTES`): their
    smallest exchange slower than `SLOW_EXCHANGE_BYTES_PER_S`. A crossover measured then is that
    state's, which the transport meets at run time by its slow-slot switch; the thresholds are for
    the other state. (While measuring, that switch is held off: it sent the "slots" way by
    cross-memory attach too, and two tunes of 2026-12-05 in the slow state found attach never
    faster, 16 and 32 MiB.)"""
    transport = pair.transport
    names = (("reduce_exchange_rendezvous_bytes",) if reducing
             else ("exchange_rendezvous_bytes", "exchange_huge_bytes"))
    kept = [getattr(transport, name) for name in names]
    switch = transport.slow_slot_bytes_per_s
    fifo: dict[int, list[float]] = {n: [] for n in CROSSOVER_BYTES}
    attach: dict[int, list[float]] = {n: [] for n in CROSSOVER_BYTES}
    try:
        transport.slow_slot_bytes_per_s, transport.slow_until = 0.0, 0.0
        for _ in range(CROSSOVER_ROUNDS):
            for n in CROSSOVER_BYTES:
                rounds = max(10, min(100, (256 << 20) // n))
                for times, threshold in ((fifo, 1 << 62), (attach, transport.chunk + 1)):
                    for name in names:
                        setattr(transport, name, threshold)
                    times[n].append(exchange_seconds(pair, rounds, n, reduce=reducing, huge=huge))
    finally:
        transport.slow_slot_bytes_per_s = switch
        for name, value in zip(names, kept, strict=True):
            setattr(transport, name, value)
    smallest = CROSSOVER_BYTES[0]
    if statistics.median(fifo[smallest]) > smallest / SLOW_EXCHANGE_BYTES_PER_S:
        return None
    crossover = 2 * CROSSOVER_BYTES[-1]
    for n in reversed(CROSSOVER_BYTES):
        if statistics.median(attach[n]) > statistics.median(fifo[n]) * (1 - RULE_MARGIN):
            break
        crossover = n
    return crossover


def tune_exchanges(comm: Communicator) -> dict[str, int] | None:
    """`exchange_crossover` for plain and reducing exchanges, measured by ranks 0 and 1 and put into
    effect on every rank's transport (unless the environment sets them); None where it does not
    apply: not the shm transport, no cross-memory attach, or more ranks than cores (the transport
    keeps the FIFO's threshold then)."""
    transport = comm.transport
    applies = (transport.name == "shm" and getattr(transport, "cma", False)
               and comm.size <= len(os.sched_getaffinity(0)))
    if not comm.all_reduce(np.array([int(applies)]), op="min")[0]:
        return None
    pair = comm if comm.size == 2 else comm.split(0 if comm.rank < 2 else None)
    found = np.zeros(3, np.int64)
    if pair is not None:
        try:
            found[:] = [exchange_crossover(pair, False) or -1, exchange_crossover(pair, True) or -1,
                        (exchange_crossover(pair, False, huge=True) or -1) if cma.HUGE_PAGES else 0]
        finally:
            if pair is not comm:
                pair.close()
    plain, reducing, huge = (int(n) for n in comm.broadcast(found, root=0))
    if min(plain, reducing, huge) < 0:   # the slots' slow state: the defaults (see `exchange_crossover`)
        return {}
    huge = min(huge, plain) if huge else plain
    if not os.environ.get("COLLS_SHM_EXCHANGE_CMA_BYTES", "").strip():   # (empty: as if unset)
        transport.exchange_rendezvous_bytes = plain
        transport.exchange_huge_bytes = huge
    if not os.environ.get("COLLS_SHM_REDUCE_EXCHANGE_CMA_BYTES", "").strip():
        transport.reduce_exchange_rendezvous_bytes = reducing
    return {"plain": plain, "reducing": reducing, "plain_huge": huge}


def measure(comm: Communicator) -> Machine:
    """α, β, γ for `comm`'s transport (ranks beyond 1 only wait at the barriers)."""
    comm.barrier()
    alpha = one_way_seconds(comm, SMALL_BYTES, 2000)
    comm.barrier()
    large = one_way_seconds(comm, LARGE_BYTES, 30)
    comm.barrier()
    beta = max(1e-12, (large - alpha) / LARGE_BYTES)
    return Machine(alpha, beta, reduce_seconds_per_byte())


def main() -> int:
    """Worker entry point: measure on this job's ranks; rank 0 saves and prints."""
    import colls

    comm = colls.init()
    if "--profile" in sys.argv:
        path = sys.argv[sys.argv.index("--profile") + 1]
        measured = profile(comm)
        if comm.rank == 0:
            with open(path, "w") as handle:
                handle.write(json.dumps(measured, indent=2) + "\n")
            print(f"{comm.transport.name} at {comm.size} ranks: profile -> {path}")
        return 0
    if comm.size < 2:
        print("colls tune needs at least 2 ranks: colls tune [-n N], or colls run -n N -m colls.tune")
        return 2
    asked = collectives_asked(sys.argv)
    # the exchange protocols first: the rules below are timed with them in effect
    exchanges = tune_exchanges(comm)
    machine = measure(comm)
    # the algorithms' measured ranking replaces the model's for groups of this size (timed with
    # the model's choice as it was: the selector reads rules when a communicator is made)
    measured = {collective: rules(comm, collective) for collective in asked}
    if comm.rank == 0:
        # one write for everything: a communicator made meanwhile reads the old file or the new
        path = save_tuned(comm.transport.name, machine, comm.size, measured,
                          {"exchange_cma": exchanges} if exchanges else None)
        print(f"{comm.transport.name}: alpha {machine.alpha * 1e6:.2f} us, "
              f"beta {1 / machine.beta / 1e9:.2f} GB/s, gamma {1 / machine.gamma / 1e9:.2f} GB/s "
              f"-> {path}")
        if exchanges == {}:
            print(f"{comm.transport.name}: exchanges through the slots ran in the VM's slow state: their "
                  f"thresholds not measured (the transport keeps its defaults, and its slow-slot switch)")
        if exchanges:
            print(f"{comm.transport.name}: exchanges by cross-memory attach from "
                  f"{format_bytes(exchanges['plain'])} (plain), "
                  f"{format_bytes(exchanges['plain_huge'])} (plain, sent from huge pages), "
                  f"{format_bytes(exchanges['reducing'])} (reducing) -> {path}")
        for collective, found in measured.items():
            shown = ", ".join(f"{name} from {format_bytes(start)}" for start, name in found)
            print(f"{comm.transport.name} at {comm.size} ranks: {collective} {shown} -> {path}")
    return 0


def collectives_asked(argv: list[str]) -> tuple[str, ...]:
    """The collectives `--collectives a,b` names, once each (default every one in RULE_COLLECTIVES)."""
    if "--collectives" not in argv:
        return RULE_COLLECTIVES
    at = argv.index("--collectives") + 1
    asked = tuple(dict.fromkeys(name for name in (argv[at] if at < len(argv) else "").split(",") if name))
    unknown = [name for name in asked if name not in RULE_COLLECTIVES]
    if unknown or not asked:
        raise SystemExit(f"colls tune --collectives: {unknown or 'none named'}; choose from "
                         f"{','.join(RULE_COLLECTIVES)}")
    return asked


if __name__ == "__main__":
    raise SystemExit(main())
