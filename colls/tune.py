"""`colls tune`: measure the cost model's α, β and γ on this machine, and which algorithm of each
collective is fastest at each size, and save them to the tune file that algorithm selection reads.

α and β come from a ping-pong between ranks 0 and 1 over the transport itself (8 B and 4 MiB
messages, median of many round trips); γ from timing a numpy reduction of 4 MiB in place. Run by
`colls tune [-n N] [--transport shm]`, which starts N ranks of `python -m colls.tune`; they then time
every algorithm of each collective at sizes from 8 B to 64 MiB and save which was fastest where
(`rules`).

`colls run -n N -m colls.tune --profile FILE.json` measures instead what `colls plan calibrate`
models a machine with (`colls.tune_profile`).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from algorithms.cost import Machine

from .bench.spec import COLLECTIVES, format_bytes
from .communicator import Communicator
from .selection import save_tuned
from .tune_probes import SMALL_BYTES, slowest
from .tune_profile import profile

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
            channel.exchange(None, None, buf, 1)
        elif comm.rank == 1:
            channel.exchange(None, None, buf, 0)
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
    running at that size, and the next best of the first round is tried the same way. (With one
    call per block at 64 MiB, a single burst on the machine once made a rule of an algorithm four
    times slower there.)"""
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
    machine = measure(comm)
    # the algorithms' measured ranking replaces the model's for groups of this size (timed with
    # the model's choice as it was: the selector reads rules when a communicator is made)
    measured = {collective: rules(comm, collective) for collective in asked}
    if comm.rank == 0:
        # one write for everything: a communicator made meanwhile reads the old file or the new
        path = save_tuned(comm.transport.name, machine, comm.size, measured)
        print(f"{comm.transport.name}: alpha {machine.alpha * 1e6:.2f} us, "
              f"beta {1 / machine.beta / 1e9:.2f} GB/s, gamma {1 / machine.gamma / 1e9:.2f} GB/s "
              f"-> {path}")
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
