"""In-place collectives against MPI's MPI_IN_PLACE forms, and the communicator's scratch registered
or plain, 2 or more ranks over one transport.

Run: COLLS_TRANSPORT=shm mpiexec -n 2 python bench/inplace_vs_mpi.py [--sizes 1M,4M,16M] [--rounds 8]

Each row is one in-place form, timed in rounds of 20 calls, colls and MPI taking turns (the slower
rank's median, us), and its ratio (MPI's time / colls'). The folding forms (an in-place all_to_all,
reduce_scatter, reduce) are timed a second time with the communicator's scratch swapped for a
plain buffer of the same size, in the same rounds ("plain scratch"), so the registered scratch's
effect on the shm transport shows beside it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from colls.bench.spec import parse_size


def per_call(fn, calls: int = 20) -> float:
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def in_place_forms(comm, world, x: np.ndarray) -> dict:
    """name -> (colls' call, MPI's call, whether colls' copies its input into the scratch)."""
    rank, size = world.Get_rank(), world.Get_size()
    block = x.shape[0] // size
    mine = x[rank * block:(rank + 1) * block]
    root_out = x if rank == 0 else None
    root_send = MPI.IN_PLACE if rank == 0 else x
    return {
        "all_gather (own block)": (lambda: comm.all_gather(mine, out=x),
                                   lambda: world.Allgather(MPI.IN_PLACE, x), False),
        "all_to_all": (lambda: comm.all_to_all(x, out=x), lambda: world.Alltoall(MPI.IN_PLACE, x), True),
        "all_reduce": (lambda: comm.all_reduce(x, out=x), lambda: world.Allreduce(MPI.IN_PLACE, x), False),
        "reduce_scatter (ring)": (lambda: comm.reduce_scatter(x, algorithm="ring"),
                                  lambda: world.Reduce_scatter_block(MPI.IN_PLACE, x), True),
        "reduce (root in place)": (lambda: comm.reduce(x, root=0, out=root_out),
                                   lambda: world.Reduce(root_send, root_out, root=0), True),
        "broadcast": (lambda: comm.broadcast(x, root=0, out=x), lambda: world.Bcast(x, root=0), False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,4M,16M")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = colls.init()
    for nbytes in (parse_size(text) for text in args.sizes.split(",")):
        x = np.zeros(nbytes // 4 // size * size, np.float32)   # zeros: sums stay zeros call after call
        for name, (ours, theirs, folds) in in_place_forms(comm, world, x).items():
            ours()
            scratch = comm._scratch_bytes
            plain = np.empty(scratch.nbytes, np.uint8) if folds and scratch is not None else None
            times: dict[str, list[float]] = {"colls": [], "MPI": [], "plain scratch": []}
            for _ in range(args.rounds):
                times["colls"].append(per_call(ours))
                times["MPI"].append(per_call(theirs))
                if plain is not None:
                    comm._scratch_bytes = plain
                    times["plain scratch"].append(per_call(ours))
                    comm._scratch_bytes = scratch
            medians = world.gather({key: float(np.median(v)) for key, v in times.items() if v})
            if rank == 0:
                worst = {key: max(m[key] for m in medians) * 1e6 for key in medians[0]}
                extra = f"  plain scratch {worst['plain scratch']:8.1f}" if "plain scratch" in worst else ""
                print(f"{nbytes >> 10:6d} KiB {name:<24} colls {worst['colls']:8.1f}  MPI {worst['MPI']:8.1f}"
                      f"  x MPI {worst['MPI'] / worst['colls']:5.2f}{extra}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
