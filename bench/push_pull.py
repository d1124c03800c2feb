"""Read or written: a 2-rank exchange by cross-memory attach, both ranks at once, either way.

Run: mpiexec -n 2 python bench/push_pull.py [--iters 100] [--fresh]

Each rank sends `n` bytes to the other, into a receive buffer of `n` or more; buffers as
`colls bench` makes them (`colls.bench.cases.fresh_array`: huge pages from 4 MiB). Per row:
- read: each rank reads the peer's send into its own buffer (process_vm_readv: pins the peer's pages);
- written: each rank writes its send into the peer's buffer (process_vm_writev: pins the peer's pages);
- MPI's Sendrecv of the same buffers.
Printed: the median, over iterations between two barriers, of rank 0's time (us), three rounds each.
`--fresh`: each rank rewrites its send before every iteration, and reads what it received after.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from colls.bench.cases import fresh_array
from transports import cma

MiB = 1 << 20
# (send bytes, receive buffer bytes): small pages into huge ones, then huge into huge
CASES = ((MiB // 4, 4 * MiB), (MiB // 2, 4 * MiB), (MiB, 4 * MiB), (2 * MiB, 4 * MiB),
         (4 * MiB, 8 * MiB), (8 * MiB, 16 * MiB))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--fresh", action="store_true", help="rewrite the send, read the receive, each time")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit("run on 2 ranks: mpiexec -n 2 python bench/push_pull.py")
    rank, peer = world.Get_rank(), 1 - world.Get_rank()
    if rank == 0:
        print(f"# medians of {args.iters}, us; {'fresh' if args.fresh else 'the same'} data each time")
        heads = " | ".join(f"{name:>19}" for name in ("read", "written", "MPI Sendrecv"))
        print(f"{'send':>9} {'into':>9} {'huge pages':>11} | {heads}")
    for nbytes, into_bytes in CASES:
        send, into = fresh_array(nbytes, np.uint8), fresh_array(into_bytes, np.uint8)
        send[:] = rank + 1
        into[:] = 0
        target = into[:nbytes]
        mine = (os.getpid(), cma.address_of(send), cma.address_of(into))
        pid, theirs, their_into = world.allgather(mine)[peer]
        ways = {"read": lambda p=pid, a=theirs, t=target: (cma.read(p, a, t), world.Barrier()),
                "written": lambda p=pid, a=their_into, s=send: (cma.write(p, a, s), world.Barrier()),
                "mpi": lambda s=send, t=target: world.Sendrecv(s, peer, 0, t, peer, 0)}
        medians: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(3):
            for name, way in ways.items():
                times = np.empty(args.iters)
                for i in range(args.iters):
                    if args.fresh:
                        send[:] = i & 0xFF
                    world.Barrier()
                    start = time.perf_counter()
                    way()
                    times[i] = time.perf_counter() - start
                    if args.fresh:
                        target.max()
                medians[name].append(float(np.median(times)) * 1e6)
        if rank == 0:
            pages = f"{cma.in_huge_pages(send):d}/{cma.in_huge_pages(into):d}"
            cells = " | ".join(", ".join(f"{t:5.1f}" for t in medians[name]) for name in ways)
            print(f"{nbytes >> 10:>5} KiB {into_bytes >> 10:>5} KiB {pages:>11} | {cells}")


if __name__ == "__main__":
    main()
