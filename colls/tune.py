"""`colls tune`: measure the cost model's α, β and γ on this machine and save them.

α and β come from a ping-pong between ranks 0 and 1 over the transport itself (8 B and 4 MiB
messages, median of many round trips); γ from timing a numpy reduction of 4 MiB in place. Run by
`colls tune [--transport shm]`, which starts two ranks of `python -m colls.tune`.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from algorithms.cost import Machine

from .communicator import Communicator
from .selection import save_machine

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
            channel.wait(channel.recv(buf, 1))
        elif comm.rank == 1:
            channel.wait(channel.recv(buf, 0))
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
    if comm.size < 2:
        print("colls tune needs at least 2 ranks: colls tune, or colls run -n 2 -m colls.tune")
        return 2
    machine = measure(comm)
    if comm.rank == 0:
        path = save_machine(comm.transport.name, machine)
        print(f"{comm.transport.name}: alpha {machine.alpha * 1e6:.2f} us, "
              f"beta {1 / machine.beta / 1e9:.2f} GB/s, gamma {1 / machine.gamma / 1e9:.2f} GB/s "
              f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
