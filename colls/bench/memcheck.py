"""`colls bench --memcheck`: resident memory per rank before and after back-to-back calls.

A collective that allocates per call and never frees (a cache keyed by something that changes, a
list of requests kept alive) shows as growth here; pools that grow once to the largest message are
settled by the warm-up calls first, so the bound can be small.
"""

from __future__ import annotations

import gc
import os
import time

from .cases import make_case
from .spec import Spec, format_bytes


def resident_bytes() -> int:
    """This process's resident set size, from /proc/self/statm."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_memcheck(world, colls, spec: Spec, emit) -> None:
    """`--memcheck`: resident memory before and after `memcheck_calls` back-to-back calls, per rank."""
    from mpi4py import MPI

    rank, ranks = world.Get_rank(), world.Get_size()
    for collective in spec.collectives:
        case = make_case(collective, spec.sizes[0], spec.op, spec.dtype, rank, ranks)
        prepared = colls.prepare(case)
        for _ in range(max(spec.warmup, 50)):   # let pools, caches and the allocator settle first
            prepared.call()
        wrong = case.wrong(prepared.result)
        gc.collect()
        world.Barrier()
        before = resident_bytes()
        start = time.perf_counter()
        for _ in range(spec.memcheck_calls):
            prepared.call()
        seconds = time.perf_counter() - start
        gc.collect()
        after = resident_bytes()
        wrong += case.wrong(prepared.result)
        rows = world.gather((before, after), root=0)
        wrong = world.allreduce(wrong, op=MPI.SUM)
        seconds = world.allreduce(seconds, op=MPI.MAX)
        if rank == 0:
            record = {"mode": "memcheck", "collective": collective, "implementation": "colls",
                      "transport": spec.transport, "algorithm": colls.algorithm_for(case), "ranks": ranks,
                      "dtype": spec.dtype, "op": spec.op, "bytes": case.nbytes,
                      "calls": spec.memcheck_calls, "seconds": seconds, "wrong": wrong,
                      "rss_start_bytes": [r[0] for r in rows], "rss_end_bytes": [r[1] for r in rows],
                      "growth_bytes": [r[1] - r[0] for r in rows]}
            print(memcheck_table(record), flush=True)
            emit(record)


def memcheck_table(record: dict) -> str:
    """Resident memory per rank before and after the back-to-back calls."""
    lines = [f"# memcheck: {record['calls']} x {record['collective']} of {format_bytes(record['bytes'])} "
             f"({record['algorithm']}, {record['transport']}) in {record['seconds']:.2f} s, "
             f"#wrong {record['wrong']}",
             f"{'rank':>4} {'RSS start MiB':>14} {'RSS end MiB':>12} {'growth KiB':>11}"]
    for rank, (start, end) in enumerate(zip(record["rss_start_bytes"], record["rss_end_bytes"], strict=True)):
        lines.append(f"{rank:>4} {start / 2**20:14.1f} {end / 2**20:12.1f} {(end - start) / 1024:11.1f}")
    return "\n".join(lines)
