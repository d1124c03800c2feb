"""A 2-rank exchange through the shm transport's slots against cross-memory attach, sent from small
pages and from huge ones: how to check the exchange thresholds by page kind
(`transports.shm.options.EXCHANGE_RENDEZVOUS_BYTES`, `EXCHANGE_HUGE_BYTES`).

Run: COLLS_TRANSPORT=shm mpiexec -n 2 python bench/exchange_pages.py [--reduce] [--rounds 3]

For each size, both buffers of each rank are all in small pages or all in huge pages
(`colls.tune_probes.paged_ones`); the way is forced on the live transport (both thresholds set),
the kinds and ways interleaved over `--rounds` rounds. Prints the
slower rank's median per cell, us.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import colls
from algorithms import SUM
from colls.tune_probes import paged_ones

SIZES = (512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduce", action="store_true", help="a float32 sum into the receive buffer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    comm = colls.init()
    transport, peer = comm.transport, 1 - world.Get_rank()
    channel = comm.channel("exchange_pages", timeout=60)
    names = (("reduce_exchange_rendezvous_bytes",) if args.reduce
             else ("exchange_rendezvous_bytes", "exchange_huge_bytes"))
    kept = [getattr(transport, name) for name in names]

    def exchange(buf: np.ndarray, incoming: np.ndarray, rounds: int) -> float:
        times = []
        for _ in range(rounds):
            comm.barrier()
            start = time.perf_counter()
            if args.reduce:
                channel.exchange(buf.view(np.float32), peer, incoming.view(np.float32), peer,
                                 SUM.into_right)
            else:
                channel.exchange(buf, peer, incoming, peer)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    if world.Get_rank() == 0:
        print(f"# {'reducing' if args.reduce else 'plain'} exchange, 2 ranks, slower rank's median (us): "
              f"slots / cross-memory attach")
    for n in SIZES:
        cells: dict[tuple[str, str], list[float]] = {}
        for kind, huge in (("small", False), ("huge", True)):
            buf, incoming = paged_ones(n, huge), paged_ones(n, huge)
            for _ in range(args.rounds):
                for way, threshold in (("slots", 1 << 62), ("attach", transport.chunk + 1)):
                    for name in names:
                        setattr(transport, name, threshold)
                    cells.setdefault((kind, way), []).append(
                        exchange(buf, incoming, max(10, min(60, (128 << 20) // n))))
        for name, value in zip(names, kept, strict=True):
            setattr(transport, name, value)
        medians = world.gather({key: float(np.median(values)) for key, values in cells.items()})
        if world.Get_rank() == 0:
            worst = {key: max(m[key] for m in medians) * 1e6 for key in medians[0]}
            print(f"{n >> 10:6d} KiB  small pages {worst['small', 'slots']:8.1f} / "
                  f"{worst['small', 'attach']:8.1f}   huge pages {worst['huge', 'slots']:8.1f} / "
                  f"{worst['huge', 'attach']:8.1f}")
    comm.close()


if __name__ == "__main__":
    main()
