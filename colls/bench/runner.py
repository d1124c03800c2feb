"""The ranks' side of `colls bench`: `mpiexec -n N python -m colls.bench.runner SPEC.json`.

Every rank runs the same loop: for each collective and size it allocates one input and one output,
then times colls, MPI's native collective and Gloo's on those same buffers, one after the other.
Each timed call starts after a barrier; the time of an iteration is the slowest rank's (a MAX
all-reduce of the per-iteration times at the end, outside the timed region). Rank 0 prints a row as
soon as a size is done and appends its record to the spec's records file for the parent.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from .baselines import Gloo, MpiNative, Prepared
from .cases import Case, colls_call, fresh_array, make_case
from .machine import CoreLink, current_cpu, mode_fields
from .memcheck import run_memcheck
from .report import Table
from .spec import Spec, bus_factor, error_path

ROUNDS = 20   # the timed calls of the implementations alternate in up to this many rounds


class Colls:
    """The library under test: a Communicator over shm (MPI only swaps segment names) or mpi."""

    name = "colls"

    def __init__(self, world, transport: str, algorithm: str | None) -> None:
        from colls.communicator import Communicator

        if transport == "shm":
            from colls.config import transport_options
            from transports.shm import ShmTransport

            self.comm = Communicator(ShmTransport(world.Get_rank(), world.Get_size(), world.allgather,
                                                  **transport_options("shm")))
        else:
            from transports.mpi import MpiTransport

            self.comm = Communicator(MpiTransport(world))
        self.label = f"colls {transport}"
        self.algorithm = algorithm

    def algorithm_for(self, case: Case) -> str:
        """The algorithm that runs: the forced one, else the selector's choice for this size."""
        from colls import explain

        return self.algorithm or explain(case.collective, case.nbytes, self.comm).chosen

    def prepare(self, case: Case) -> Prepared:
        """The colls call for `case`, writing into the case's output."""
        return Prepared(*colls_call(self.comm, case, self.algorithm))

    def close(self) -> None:
        """Release the transport."""
        self.comm.close()


class CatalogueChoice:
    """colls' own choice at each size (`algorithm=None`) on the same communicator: what a forced
    algorithm, a plugin's say, is timed beside, as the baselines are."""

    name = "auto"
    label = "auto"

    def __init__(self, colls: Colls) -> None:
        self.colls = colls

    def unsupported(self, case: Case) -> str | None:
        """Never: colls runs every case."""
        return None

    def prepare(self, case: Case) -> Prepared:
        """The colls call for `case` with no algorithm forced."""
        return Prepared(*colls_call(self.colls.comm, case, None))

    def close(self) -> None:
        """Nothing of its own to release (the communicator is `Colls`')."""


def timed(world, prepared: Prepared, iterations: int) -> np.ndarray:
    """Per-iteration seconds of the slowest rank: barrier, time one call, MAX over ranks at the end."""
    from mpi4py import MPI

    call, before = prepared.call, prepared.before
    times = np.empty(iterations)
    for i in range(iterations):
        if before is not None:
            before()
        world.Barrier()
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times


@dataclass
class Contender:
    """One implementation at one point: its prepared call and what was measured of it."""

    name: str
    prepared: Prepared
    case: Case | None            # None: nothing to check (the memcpy roofline)
    iterations: int = 0
    wrong: int = 0
    times: list[np.ndarray] = field(default_factory=list)

    def check(self) -> None:
        """Count this rank's wrong elements in the result as it stands."""
        if self.case is not None:
            self.wrong += self.case.wrong(self.prepared.result)

    def figures(self, world, nbytes: int, factor: float) -> dict:
        """Iterations, median and min time, algbw, busbw (GB/s) and wrong elements over all ranks."""
        from mpi4py import MPI

        times = np.concatenate(self.times)
        median = float(np.median(times))
        algbw = nbytes / median / 1e9 if median > 0 else 0.0
        return {"iterations": self.iterations, "time_median_s": median, "time_min_s": float(times.min()),
                "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
                "wrong": world.allreduce(self.wrong, op=MPI.SUM)}


def measure(world, contenders: list[Contender], spec: Spec) -> None:
    """Check, warm up and time every contender; the timed calls alternate between them in rounds,
    so that a burst of load on a shared machine falls on all of them rather than on one, and in an
    order that has each run right after each other one equally often (`round_order`): a call
    leaves the machine slower for the next few (after a 16 MiB copy on both ranks, a 16 MiB
    all-reduce took 3.8, 3.6, 3.1, 2.9 ms in turn, against 2.2 ms in a loop of its own)."""
    for contender in contenders:
        prepared, case = contender.prepared, contender.case
        if case is not None:   # a checked first call into a poisoned output
            case.poison()
            if prepared.before is not None:
                prepared.before()
            prepared.call()
            contender.check()
        warm = timed(world, prepared, max(1, spec.warmup))
        if spec.iters is not None:
            contender.iterations = spec.iters
        else:   # as many as fit the budget: every rank computes the same from the same MAX times
            fit = int(spec.budget_s / max(float(np.median(warm)), 1e-9))
            contender.iterations = min(spec.max_iters, max(spec.min_iters, fit))
    for round_index in range(ROUNDS):
        for contender in round_order(contenders, round_index):
            total = contender.iterations   # this round's share of them: the splits add up to total
            share = total * (round_index + 1) // ROUNDS - total * round_index // ROUNDS
            if share:
                contender.times.append(timed(world, contender.prepared, share))
    for contender in contenders:
        contender.check()   # the buffer as the last timed call left it


def round_order(contenders: list, round_index: int) -> list:
    """The order of round `round_index`: the first contender, then the others forward in even rounds
    and backward in odd ones. Over two rounds, boundaries included, each of up to three contenders
    runs right after each of the others equally often (a, b, c | a, c, b | ...: a>b, b>c, c>a, a>c,
    c>b, b>a). Rotating the order instead keeps the cycle: colls would run after Gloo in two rounds
    of three, MPI in one."""
    first, rest = contenders[:1], contenders[1:]
    return first + (rest if round_index % 2 == 0 else rest[::-1])


def memcpy_contender(nbytes: int) -> Contender:
    """The roofline: every rank at once copying `nbytes` with np.copyto."""
    source, target = fresh_array(nbytes, np.uint8), fresh_array(nbytes, np.uint8)
    source.fill(1)
    target.fill(0)
    return Contender("memcpy", Prepared(lambda: np.copyto(target, source), None), None)


def start_baselines(world, spec: Spec) -> tuple[list, dict[str, str]]:
    """The baselines the spec names that can run here: (baselines, {label: why one is absent})."""
    baselines: list = []
    absent: dict[str, str] = {}
    if "mpi" in spec.baselines:
        baselines.append(MpiNative(world))
    if "gloo" in spec.baselines:
        reasons = world.allgather(Gloo.why_not())   # every rank must agree before joining a group
        if any(reasons):
            absent["Gloo"] = next(reason for reason in reasons if reason)
        else:
            baselines.append(Gloo(world))
    return baselines, absent


def run_point(world, colls: Colls, baselines: list, case: Case, spec: Spec,
              rooflines: dict[int, dict], link: CoreLink | None = None,
              registered: Case | None = None) -> dict:
    """colls, each baseline and (once per size) memcpy on the same buffers: one record. With
    `registered` (`--registered`), colls runs on that case's buffers, in registered memory, instead."""
    factor = bus_factor(case.collective, case.ranks)
    mine = case if registered is None else registered   # `--registered`: colls' own buffers
    contenders = [Contender("colls", colls.prepare(mine), mine)]
    absent = {}
    for baseline in baselines:
        reason = baseline.unsupported(case)
        if reason is None:
            contenders.append(Contender(baseline.name, baseline.prepare(case), case))
        else:
            absent[baseline.name] = {"unavailable": reason}
    if case.nbytes not in rooflines:
        # the roofline is timed on its own, before: interleaved, its copies would slow the
        # implementations' calls that follow them (see `measure`), and it is no contender
        roof = memcpy_contender(case.nbytes)
        measure(world, [roof], spec)
        rooflines[case.nbytes] = roof.figures(world, case.nbytes, 1.0)
        rooflines[case.nbytes].pop("wrong")
    before = link.mode() if link is not None else None
    cpu_before = current_cpu()
    measure(world, contenders, spec)
    cpus = world.allgather([cpu_before, current_cpu()])   # each rank's CPU as the point began and ended
    after = link.mode() if link is not None else None
    figures = {c.name: c.figures(world, case.nbytes, factor) for c in contenders}
    mine = figures.pop("colls")
    for theirs in figures.values():   # colls busbw / baseline busbw = their time / ours
        theirs["ratio"] = theirs["time_median_s"] / mine["time_median_s"] if mine["time_median_s"] else 0.0
    return {"collective": case.collective, "implementation": "colls", "transport": spec.transport,
            "algorithm": colls.algorithm_for(case), "ranks": case.ranks, "dtype": spec.dtype, "op": spec.op,
            "registered": spec.registered,
            "bytes": case.nbytes, "count_in": int(case.x.size), "count_out": int(case.out.size), **mine,
            "baselines": {**figures, **absent}, "memcpy": rooflines[case.nbytes],
            # the machine's mode around the point (rank 0's; `colls.bench.machine`), when measurable
            **(mode_fields(before, after) if link is not None else {}),
            # where the kernel ran the ranks (`colls.plan.calibrate` predicts the point there)
            **({"cpus": cpus} if all(cpu is not None for pair in cpus for cpu in pair) else {})}


def pin_rank(world) -> tuple[int, ...]:
    """`--pin`: this rank onto the (rank mod C)-th of the C CPUs it may run on; every rank's index.
    With more ranks than CPUs the kernel otherwise deals the ranks out differently from one run to
    the next, and a call's time with them (4 ranks on 2 cores: a 1 MiB broadcast nearly twice as
    slow in some unpinned launches as in others; pinned as here, the same in every launch)."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[world.Get_rank() % len(allowed)]})
    (cpu,) = os.sched_getaffinity(0)   # what the kernel holds this rank to now, as every rank reports
    return tuple(world.allgather(allowed.index(cpu)))


def open_link(world) -> CoreLink | None:
    """The link that measures the machine's mode around each point (collective). Opened before
    `--pin` pins the ranks: it needs two CPUs to run on, and pinned, ranks 0 and 1 are on the two
    it measures between (tagged so, pinned runs compare by mode as others do)."""
    return CoreLink.open(world.Get_rank(), world.Get_size(), lambda value: world.bcast(value, root=0),
                         world.Barrier)


def run_sizes(world, colls: Colls, baselines: list, spec: Spec, table: Table | None, emit,
              placement: tuple[int, ...] | None = None, link: CoreLink | None = None) -> None:
    """The benchmark proper: every collective at every size, rows printed by rank 0 as they finish
    (`link`: the machine's mode measured around each point, `open_link`; closed here)."""
    rank, ranks = world.Get_rank(), world.Get_size()
    rooflines: dict[int, dict] = {}
    # a run's first point came out slower than the same point measured again, for every contender
    # (a small all_reduce two to three times slower, MPI's too): the first point is run once
    # untimed, for all of them alike
    if spec.collectives and spec.sizes:
        warm = make_case(spec.collectives[0], spec.sizes[0], spec.op, spec.dtype, rank, ranks)
        run_point(world, colls, baselines, warm, spec, {}, None)
        del warm
    for collective in spec.collectives:
        if table is not None:
            table.start(collective)
        done: set[int] = set()
        for size in spec.sizes:
            case = make_case(collective, size, spec.op, spec.dtype, rank, ranks)
            if case.nbytes in done:   # small sizes that round to the same buffer
                continue
            done.add(case.nbytes)
            registered = (make_case(collective, size, spec.op, spec.dtype, rank, ranks, registered=True)
                          if spec.registered else None)
            record = run_point(world, colls, baselines, case, spec, rooflines, link, registered)
            if placement is not None:
                record["placement"] = list(placement)   # what `colls plan calibrate` simulates
            del case, registered   # free this size's buffers before the next size allocates
            if table is not None:
                table.row(record)
            emit(record)
    if link is not None:
        link.close()


def versions(MPI, baselines: list) -> dict:
    """What produced the figures: library versions and the machine, for the JSON file."""
    import platform

    import mpi4py

    import colls

    found = {"colls": colls.__version__, "python": platform.python_version(), "numpy": np.__version__,
             "mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().strip().splitlines()[0]}
    for baseline in baselines:
        if baseline.name == "gloo":
            found["torch"] = baseline.torch.__version__
    return {"mode": "meta", "versions": found,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_average_at_start": list(os.getloadavg())}}


def run(spec: Spec, world, MPI) -> None:
    """Set up colls and the baselines, run the spec, tear down (collectively: only on success)."""
    link = None if spec.memcheck else open_link(world)
    placement = pin_rank(world) if spec.pin else None
    colls = Colls(world, spec.transport, spec.algorithm)
    baselines, absent = ([], {}) if spec.memcheck else start_baselines(world, spec)
    if spec.algorithm is not None and not spec.memcheck:   # a forced one: beside colls' own choice
        baselines.insert(0, CatalogueChoice(colls))
    records = open(spec.records_path, "a") if world.Get_rank() == 0 else None

    def emit(record: dict) -> None:
        if records is not None:
            records.write(json.dumps(record) + "\n")
            records.flush()

    emit({**versions(MPI, baselines), "absent": absent})
    if spec.memcheck:
        run_memcheck(world, colls, spec, emit)
    else:
        table = None
        if world.Get_rank() == 0:
            table = Table(spec, world.Get_size(), [b.label for b in baselines], absent, placement)
            table.preamble()
        run_sizes(world, colls, baselines, spec, table, emit, placement, link)
        if table is not None:
            table.summary()
    for baseline in baselines:
        baseline.close()
    colls.close()
    if records is not None:
        records.close()


def main(argv: list[str]) -> int:
    """Run the spec at argv[0] on this rank; any error aborts the whole job at once."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        run(Spec.load(argv[0]), world, MPI)
    except BaseException:
        # The peers are blocked in a collective that this rank will never enter, and a collective
        # teardown would hang too: say why, then abort every rank (as `python -m mpi4py` does).
        # Why goes to a file that `colls bench` prints: Hydra drops what a rank wrote to its
        # stderr when an abort ends the job first (seen in CI: an empty stderr).
        reason = traceback.format_exc()
        try:
            with open(error_path(argv[0], world.Get_rank()), "w") as handle:
                handle.write(reason)
        except OSError:
            sys.stderr.write(reason)
            sys.stderr.flush()
        world.Abort(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
