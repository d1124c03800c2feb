"""`colls bench --transport cuda_ipc`: collectives on GPU buffers beside the copy roofline and a
host-staged path, measured in the same run on the same ranks and buffers.

The ranks start under `colls run --transport cuda_ipc`; every rank, for each collective and size:
- colls over cuda_ipc on cupy buffers (device to device through CUDA IPC);
- `copy`: one device-to-device cudaMemcpy of the buffer on every rank at once — the roofline of
  ranks that share one GPU's memory bandwidth;
- `staged`: the host-staged path a library without device transports takes: copy the input to
  the host, run the same collective over shared memory (numpy), copy the result back.
Each timed call starts after a barrier and ends when the device is idle; a point's time is the
slowest rank's, the median over iterations. busbw uses nccl-tests' factors; `#wrong` checks the
result against arithmetic (inputs are rank + 1).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from .spec import Spec, bus_factor, element_counts, format_bytes


def expected_wrong(cupy, collective: str, out, rank: int, size: int) -> int:
    """Elements of `out` that differ from what `collective` of inputs `rank + 1` must give."""
    if out is None:
        return 0
    total = size * (size + 1) // 2
    if collective in ("all_reduce", "reduce_scatter", "reduce"):
        return int(cupy.count_nonzero(out != total))
    if collective == "broadcast":
        return int(cupy.count_nonzero(out != 1))   # the root is rank 0
    blocks = out.reshape(size, -1)                 # all_gather, all_to_all: block j came from rank j
    sources = cupy.arange(1, size + 1, dtype=out.dtype).reshape(size, 1)
    return int(cupy.count_nonzero(blocks != sources))


class Point:
    """The buffers and the three timed calls of one collective at one size."""

    def __init__(self, cupy, comm, collective: str, nbytes: int, dtype: str, algorithm: str | None) -> None:
        self.cupy, self.comm, self.collective = cupy, comm, collective
        count_in, count_out = element_counts(collective, nbytes, comm.size, dtype)
        self.x = cupy.full(count_in, comm.rank + 1, dtype)
        self.out = cupy.empty(count_out, dtype)
        self.source = cupy.empty(max(count_in, count_out), dtype)
        self.target = cupy.empty_like(self.source)
        self.algorithm = algorithm
        self.nbytes = max(count_in, count_out) * np.dtype(dtype).itemsize

    def colls(self):
        return self._call(self.x, self.out)

    def _call(self, x, out):
        comm, name = self.comm, self.collective
        if name == "all_reduce":
            return comm.all_reduce(x, out=out, algorithm=self.algorithm)
        if name == "broadcast":
            return comm.broadcast(x, root=0, out=out, algorithm=self.algorithm)
        if name == "reduce":
            return comm.reduce(x, root=0, out=out if comm.rank == 0 else None, algorithm=self.algorithm)
        if name == "all_gather":
            return comm.all_gather(x, out=out, algorithm=self.algorithm)
        if name == "reduce_scatter":
            return comm.reduce_scatter(x, out=out, algorithm=self.algorithm)
        return comm.all_to_all(x, out=out, algorithm=self.algorithm)

    def copy(self):
        self.cupy.cuda.runtime.memcpyAsync(self.target.data.ptr, self.source.data.ptr, self.target.nbytes,
                                           3, self.cupy.cuda.get_current_stream().ptr)

    def staged(self):
        host_out = np.empty(self.out.shape, self.out.dtype)
        result = self._call(self.x.get(), host_out)   # to the host, over shared memory, back
        if result is not None:
            self.out.set(result)
        return result

    def timed(self, call, iterations: int) -> np.ndarray:
        """Seconds per iteration, the slowest rank's: barrier, call, wait for the device."""
        device = self.cupy.cuda.Device()
        times = np.empty(iterations)
        for i in range(iterations):
            self.comm.barrier()
            start = time.perf_counter()
            call()
            device.synchronize()
            times[i] = time.perf_counter() - start
        return self.comm.all_reduce(times, op="max")


def iterations_for(point: Point, spec: Spec) -> int:
    """--iters, or as many as fit the budget after one timed call (every rank agrees: MAX)."""
    if spec.iters is not None:
        return spec.iters
    once = float(point.timed(point.colls, 1)[0])
    return int(np.clip(spec.budget_s / max(once, 1e-6), spec.min_iters, spec.max_iters))


def measure(cupy, comm, collective: str, nbytes: int, spec: Spec) -> dict:
    point = Point(cupy, comm, collective, nbytes, spec.dtype, spec.algorithm)
    for _ in range(spec.warmup):
        point.colls()
    point.out.fill(0)
    result = point.colls()
    cupy.cuda.Device().synchronize()
    wrong = expected_wrong(cupy, collective, result if result is not None else None, comm.rank, comm.size)
    wrong = int(comm.all_reduce(np.array([wrong], np.int64))[0])
    iterations = iterations_for(point, spec)
    factor = bus_factor(collective, comm.size)
    record = {"collective": collective, "ranks": comm.size, "transport": "cuda_ipc", "dtype": spec.dtype,
              "bytes": point.nbytes, "iterations": iterations, "wrong": wrong,
              "algorithm": spec.algorithm or _chosen(comm, collective, point.nbytes)}
    for name, call in (("colls", point.colls), ("copy", point.copy), ("staged", point.staged)):
        times = point.timed(call, iterations if name != "staged" else max(spec.min_iters, iterations // 4))
        median = float(np.median(times))
        algbw = point.nbytes / median / 1e9
        record[name] = {"median_s": median, "min_s": float(times.min()), "algbw_GBps": algbw,
                        "busbw_GBps": algbw * (factor if name != "copy" else 1.0)}
    record["vs_copy"] = record["colls"]["busbw_GBps"] / record["copy"]["busbw_GBps"]
    record["vs_staged"] = record["staged"]["median_s"] / record["colls"]["median_s"]
    return record


def _chosen(comm, collective: str, nbytes: int) -> str:
    from colls import explain

    return explain(collective, nbytes, comm).chosen


HEADER = (f"{'size':>10} {'algorithm':>14} {'colls us':>10} {'busbw':>8} {'copy us':>9} {'copy GB/s':>9} "
          f"{'staged us':>10} {'x staged':>8} {'of copy':>7} {'#wrong':>6}")


def row(record: dict) -> str:
    c, copy, staged = record["colls"], record["copy"], record["staged"]
    return (f"{format_bytes(record['bytes']):>10} {record['algorithm']:>14} {c['median_s'] * 1e6:10.1f} "
            f"{c['busbw_GBps']:8.1f} {copy['median_s'] * 1e6:9.1f} {copy['busbw_GBps']:9.1f} "
            f"{staged['median_s'] * 1e6:10.1f} {record['vs_staged']:7.1f}x {record['vs_copy']:6.2f}x "
            f"{record['wrong']:>6}")


def main(argv: list[str]) -> int:
    import cupy

    import colls

    spec = Spec.load(argv[0])
    comm = colls.init()
    if comm.transport.name != "cuda_ipc":
        raise SystemExit("colls.bench.gpu runs under colls run --transport cuda_ipc")
    if comm.rank == 0:
        name = cupy.cuda.runtime.getDeviceProperties(comm.transport.device)["name"].decode()
        print(f"# colls bench: {comm.size} ranks on {name} (device {comm.transport.device}), "
              f"{spec.dtype}; colls over cuda_ipc ({comm.transport.device_slots} slots of "
              f"{format_bytes(comm.transport.device_chunk)}), the device-to-device copy (every rank at "
              f"once) and the host-staged path (to the host, shm, back)", flush=True)
    for collective in spec.collectives:
        if comm.rank == 0:
            print(f"# {collective}\n{HEADER}", flush=True)
        for nbytes in spec.sizes:
            record = measure(cupy, comm, collective, nbytes, spec)
            if comm.rank == 0:
                print(row(record), flush=True)
                with open(spec.records_path, "a") as handle:
                    handle.write(json.dumps(record) + "\n")
    comm.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
