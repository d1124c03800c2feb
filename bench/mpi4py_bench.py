"""One mpi4py script timed two ways in the same run: under real mpi4py + MPICH (`mpiexec`) and,
unchanged, on colls' facade (`colls run --as-mpi4py`).

The script (this file with `--worker`) times osu_latency- and osu_bw-style point-to-point loops,
an osu_allreduce-style `Allreduce` loop, and the pickle-based `bcast` and `send`/`recv` of a dict
holding a 16 MiB numpy array. The two implementations alternate, `--rounds` times each; a row's
time is the median over rounds of each round's median call time on rank 0.

    python bench/mpi4py_bench.py -n 2 --rounds 5 [--transport shm] [--markdown table.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
OBJECT_BYTES = 16 << 20


def _median_call(call, iterations: int, comm) -> float:
    """Seconds per call: the median of `iterations` timed calls, each started after a barrier."""
    times = []
    for _ in range(iterations):
        comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(budget: int) -> None:
    """Time every row on this job's ranks; rank 0 prints one JSON line of {row: seconds}."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rows: dict[str, float] = {}
    for nbytes in (8, 1 << 10, 64 << 10, 1 << 20):   # osu_latency: half a round trip, ranks 0 and 1
        buf = np.zeros(nbytes, np.uint8)

        def ping_pong(buf=buf):
            if rank == 0:
                comm.Send(buf, 1, 7)
                comm.Recv(buf, 1, 7)
            elif rank == 1:
                comm.Recv(buf, 0, 7)
                comm.Send(buf, 0, 7)
        rows[f"latency {_size(nbytes)}"] = _median_call(ping_pong, budget, comm) / 2
    window = 16
    ack = np.zeros(1, np.uint8)
    for nbytes in (64 << 10, 1 << 20, 4 << 20):   # osu_bw: a window of Isends, one ack
        bufs = [np.zeros(nbytes, np.uint8) for _ in range(window)]

        def windowed(bufs=bufs):
            if rank == 0:
                MPI.Request.Waitall([comm.Isend(b, 1, 9) for b in bufs])
                comm.Recv(ack, 1, 10)
            elif rank == 1:
                MPI.Request.Waitall([comm.Irecv(b, 0, 9) for b in bufs])
                comm.Send(ack, 0, 10)
        seconds = _median_call(windowed, max(3, budget // 4), comm)
        rows[f"bw {_size(nbytes)} (MB/s)"] = window * nbytes / seconds / 1e6
    for nbytes in (8, 64 << 10, 1 << 20, 16 << 20):   # osu_allreduce
        send = np.ones(nbytes // 8, np.float64)
        recv = np.empty_like(send)
        rows[f"Allreduce {_size(nbytes)}"] = _median_call(lambda s=send, r=recv: comm.Allreduce(s, r), budget,
                                                          comm)
    payload = {"step": 3, "weights": np.arange(OBJECT_BYTES // 8, dtype=np.float64)}
    rows["bcast dict 16 MiB"] = _median_call(lambda: comm.bcast(payload if rank == 0 else None, 0),
                                             max(3, budget // 4), comm)

    def send_recv_object():
        if rank == 0:
            comm.send(payload, 1, 11)
        elif rank == 1:
            comm.recv(source=0, tag=11)
    rows["send/recv dict 16 MiB"] = _median_call(send_recv_object, max(3, budget // 4), comm)
    if rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def run_job(impl: str, nprocs: int, transport: str, budget: int) -> dict[str, float]:
    """One job of the worker by `impl` ("mpi4py" or "colls"); rank 0's rows."""
    worker_args = [str(Path(__file__).resolve()), "--worker", "--budget", str(budget)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    if impl == "mpi4py":
        mpiexec = Path(sys.executable).with_name("mpiexec")
        command = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(nprocs), sys.executable,
                   *worker_args]
    else:
        command = [sys.executable, "-m", "colls.cli", "run", "--as-mpi4py", "-n", str(nprocs),
                   "--transport", transport, *worker_args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("ROWS "):
            return json.loads(line[5:])
    raise RuntimeError(f"{impl} job failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                       f"{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-n", "--nprocs", type=int, default=2)
    parser.add_argument("--transport", default="shm", choices=("shm", "mpi"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=40, help="timed calls per row and round")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    if args.worker:
        worker(args.budget)
        return
    results: dict[str, list[dict[str, float]]] = {"mpi4py": [], "colls": []}
    for round_ in range(args.rounds):
        order = ("mpi4py", "colls") if round_ % 2 == 0 else ("colls", "mpi4py")
        for impl in order:
            results[impl].append(run_job(impl, args.nprocs, args.transport, args.budget))
    lines = [f"| row ({args.nprocs} ranks, colls over {args.transport}) | mpi4py + MPICH | colls facade "
             f"| colls / mpi4py time |", "|---|---:|---:|---:|"]
    for row in results["mpi4py"][0]:
        theirs = statistics.median(r[row] for r in results["mpi4py"])
        ours = statistics.median(r[row] for r in results["colls"])
        if row.startswith("bw"):
            lines.append(f"| {row} | {theirs:.0f} | {ours:.0f} | {theirs / ours:.2f}x |")
        else:
            lines.append(f"| {row} | {_seconds(theirs)} | {_seconds(ours)} | {ours / theirs:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table + "\n")


def _seconds(value: float) -> str:
    return f"{value * 1e6:.1f} us" if value < 1e-3 else f"{value * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
