"""One rank of the GPU tests (tests/test_cuda.py).

    colls run -n N --transport cuda_ipc tests/gpu_worker.py MODE [ARGS]

matrix: every collective x algorithm x count x dtype on cupy buffers, checked exactly against
        numpy; inputs are small integers (exact in float16 sums too), made on the host by tiling a
        period-11 pattern that differs per rank, so the reference needs no GPU.
ddp:    a data-parallel MLP on cupy (bucketed async all-reduce of gradients) equal to serial training.
checks: point-to-point out of tag order, async calls, sub-groups, DLPack (torch), clear errors for
        bad buffers and mismatched calls.
Each rank prints `FAIL ...` lines and a summary; the exit status is 1 if anything failed.
"""

from __future__ import annotations

import sys
import time

import cupy
import numpy as np

import colls
from algorithms import names

DTYPES = (np.float32, np.float16, np.int32)
SKIP = {"hierarchical"}   # needs ranks on several hosts (tests/test_hierarchical.py covers it on shm)


def pattern(rank: int, count: int, dtype) -> np.ndarray:
    """Rank `rank`'s input: small integers, period 11, shifted by rank (host, numpy)."""
    period = ((np.arange(11) * 7 + rank * 13 + 3) % 11 - 5).astype(dtype)
    return np.resize(period, count)


def block_count(count: int, size: int) -> int:
    """`count` rounded up to a multiple of `size` (collectives that split axis 0 into blocks)."""
    return -(-count // size) * size


class Matrix:
    """Runs the cases of one rank and counts failures."""

    def __init__(self, comm) -> None:
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.cases = self.failures = 0

    def check(self, label: str, got, expected: np.ndarray | None) -> None:
        self.cases += 1
        if expected is None:
            if got is not None:
                self.fail(label, f"expected None, got {type(got).__name__}")
            return
        if not isinstance(got, cupy.ndarray):
            self.fail(label, f"result is {type(got).__name__}, not a cupy array")
            return
        host = got.get()
        if host.shape != expected.shape or host.dtype != expected.dtype:
            self.fail(label, f"shape/dtype {host.shape} {host.dtype}, expected {expected.shape} "
                             f"{expected.dtype}")
        elif not np.array_equal(host, expected):
            wrong = int(np.count_nonzero(host != expected))
            self.fail(label, f"{wrong} of {host.size} elements differ")

    def fail(self, label: str, detail: str) -> None:
        self.failures += 1
        if self.failures <= 40:
            print(f"FAIL rank {self.rank} {label}: {detail}", flush=True)

    def run(self, counts: list[int]) -> None:
        for dtype in DTYPES:
            for count in counts:
                self.one_size(count, dtype)
        self.extras()

    def one_size(self, count: int, dtype) -> None:
        comm, rank, size = self.comm, self.rank, self.size
        inputs = [pattern(r, count, dtype) for r in range(size)]
        total = np.sum(np.stack(inputs), axis=0, dtype=dtype) if count else np.zeros(0, dtype)
        mine = cupy.asarray(inputs[rank])
        tag = f"{np.dtype(dtype).name} count={count} n={size}"
        root = size - 1
        for algorithm in self.algorithms("all_reduce"):
            self.check(f"all_reduce/{algorithm} {tag}", comm.all_reduce(mine, algorithm=algorithm), total)
        for algorithm in self.algorithms("reduce"):
            got = comm.reduce(mine, root=root, algorithm=algorithm)
            self.check(f"reduce/{algorithm} {tag}", got, total if rank == root else None)
        for algorithm in self.algorithms("broadcast"):
            x = mine.copy()
            got = comm.broadcast(x, root=root, algorithm=algorithm)
            self.check(f"broadcast/{algorithm} {tag}", got, inputs[root])
        gathered = np.concatenate(inputs)
        for algorithm in self.algorithms("all_gather"):
            self.check(f"all_gather/{algorithm} {tag}", comm.all_gather(mine, algorithm=algorithm), gathered)
        for algorithm in self.algorithms("gather"):
            got = comm.gather(mine, root=root, algorithm=algorithm)
            self.check(f"gather/{algorithm} {tag}", got, gathered if rank == root else None)
        blocks = block_count(count, size)
        block = blocks // size
        whole = [pattern(r, blocks, dtype) for r in range(size)]
        mine_whole = cupy.asarray(whole[rank])
        summed = np.sum(np.stack(whole), axis=0, dtype=dtype)
        for algorithm in self.algorithms("reduce_scatter"):
            got = comm.reduce_scatter(mine_whole, algorithm=algorithm)
            self.check(f"reduce_scatter/{algorithm} {tag}", got, summed[rank * block:(rank + 1) * block])
        exchanged = np.concatenate([whole[r][rank * block:(rank + 1) * block] for r in range(size)])
        for algorithm in self.algorithms("all_to_all"):
            self.check(f"all_to_all/{algorithm} {tag}", comm.all_to_all(mine_whole, algorithm=algorithm),
                       exchanged)
        for algorithm in self.algorithms("scatter"):
            got = comm.scatter(mine_whole, root=root, algorithm=algorithm)
            self.check(f"scatter/{algorithm} {tag}", got, whole[root][rank * block:(rank + 1) * block])
        if count <= (1 << 21):   # variable blocks: rank r sends (r + 2j) % 3 parts of a third to rank j
            self.all_to_all_v(count, dtype, tag)

    def all_to_all_v(self, count: int, dtype, tag: str) -> None:
        rank, size = self.rank, self.size
        part = max(count // 3, 1) if count else 0

        def counts_of(r: int) -> list[int]:
            return [((r + 2 * j) % 3) * part for j in range(size)]

        inputs = [pattern(r, sum(counts_of(r)), dtype) for r in range(size)]
        expected = []
        for r in range(size):
            starts = np.concatenate([[0], np.cumsum(counts_of(r))])
            expected.append(inputs[r][starts[rank]:starts[rank + 1]])
        expected_rows = np.concatenate(expected)
        for algorithm in self.algorithms("all_to_all_v"):
            got, received = self.comm.all_to_all_v(cupy.asarray(inputs[rank]), counts_of(rank),
                                                   algorithm=algorithm)
            self.check(f"all_to_all_v/{algorithm} {tag}", got, expected_rows)
            if received != [counts_of(r)[rank] for r in range(size)]:
                self.fail(f"all_to_all_v/{algorithm} {tag}", f"recv_counts {received}")

    def extras(self) -> None:
        """Other operators, in place, out=, and the barrier."""
        comm, rank, size = self.comm, self.rank, self.size
        for count in (7, (1 << 20) + 3):
            inputs = [pattern(r, count, np.int32) for r in range(size)]
            stacked = np.stack(inputs)
            x = cupy.asarray(inputs[rank])
            self.check(f"all_reduce MAX int32 {count}", comm.all_reduce(x, op=colls.MAX), stacked.max(axis=0))
            self.check(f"all_reduce MIN int32 {count}", comm.all_reduce(x, op="min"), stacked.min(axis=0))
            average = np.trunc(stacked.sum(axis=0) / size).astype(np.int32)   # truncation toward zero
            self.check(f"all_reduce AVG int32 {count}", comm.all_reduce(x, op=colls.AVG), average)
            floats = cupy.asarray(inputs[rank].astype(np.float32))
            self.check(f"all_reduce AVG float32 {count}", comm.all_reduce(floats, op=colls.AVG),
                       (stacked.sum(axis=0) / np.float32(size)).astype(np.float32))
            out = cupy.empty_like(x)
            got = comm.all_reduce(x, out=out)
            self.check(f"all_reduce out= {count}", out if got is out else None,
                       stacked.sum(axis=0, dtype=np.int32))
            comm.all_reduce(x, out=x)
            self.check(f"all_reduce in place {count}", x, stacked.sum(axis=0, dtype=np.int32))
            y = cupy.asarray(np.tile(inputs[rank], size))
            comm.all_to_all(y, out=y)
            self.check(f"all_to_all in place {count}", y, np.concatenate(inputs))
        comm.barrier()

    def algorithms(self, collective: str) -> list[str]:
        return [name for name in names(collective) if name not in SKIP]


def matrix(comm, argv: list[str]) -> int:
    counts = [int(c) for c in argv] or [0, 1, 7, (1 << 20) + 3]
    start = time.perf_counter()
    run = Matrix(comm)
    run.run(counts)
    print(f"matrix rank {comm.rank}/{comm.size}: {run.cases} cases, {run.failures} failures, "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return 1 if run.failures else 0


def mlp_grads(params: list, x, y) -> tuple[float, list]:
    """Mean squared error of a tanh MLP and its gradients."""
    w1, b1, w2, b2 = params
    h = cupy.tanh(x @ w1 + b1)
    pred = h @ w2 + b2
    err = pred - y
    loss = float((err ** 2).mean())
    g_pred = 2 * err / err.size
    g_w2 = h.T @ g_pred
    g_b2 = g_pred.sum(axis=0)
    g_h = (g_pred @ w2.T) * (1 - h ** 2)
    return loss, [x.T @ g_h, g_h.sum(axis=0), g_w2, g_b2]


def ddp(comm, argv: list[str]) -> int:
    """Data-parallel SGD with the gradients all-reduced (AVG) in two async buckets, against serial
    training on the whole batch; both on cupy, float64."""
    rng = np.random.default_rng(7)
    batch, d_in, hidden, steps, lr = 16 * comm.size, 12, 32, 20, 0.1
    x_all = cupy.asarray(rng.standard_normal((batch, d_in)))
    y_all = cupy.asarray(rng.standard_normal((batch, 1)))
    init = [rng.standard_normal((d_in, hidden)) * 0.3, np.zeros(hidden),
            rng.standard_normal((hidden, 1)) * 0.3, np.zeros(1)]
    serial = [cupy.asarray(p) for p in init]
    parallel = [cupy.asarray(p) for p in init]
    shard = slice(comm.rank * 16, (comm.rank + 1) * 16)
    for _ in range(steps):
        _, grads = mlp_grads(serial, x_all, y_all)
        for p, g in zip(serial, grads, strict=True):
            p -= lr * g
        _, grads = mlp_grads(parallel, x_all[shard], y_all[shard])
        # two buckets, each one flat buffer, reduced asynchronously and waited before the step
        buckets = [cupy.concatenate([g.ravel() for g in grads[:2]]),
                   cupy.concatenate([g.ravel() for g in grads[2:]])]
        works = [comm.all_reduce(b, op=colls.AVG, out=b, async_op=True) for b in buckets]
        for work in works:
            work.wait()
        flat = cupy.concatenate(buckets)
        offset = 0
        for p in parallel:
            p -= lr * flat[offset:offset + p.size].reshape(p.shape)
            offset += p.size
    difference = max(float(cupy.abs(a - b).max()) for a, b in zip(serial, parallel, strict=True))
    mine = cupy.concatenate([p.ravel() for p in parallel])
    everyone = comm.all_gather(mine.reshape(1, -1))
    same = bool(cupy.all(everyone == everyone[0]))
    print(f"ddp rank {comm.rank}: max |serial - ddp| = {difference:.3e}, identical on every rank: {same}",
          flush=True)
    return 0 if difference < 1e-10 and same else 1


def expect(kind, call, *words) -> str | None:
    """None if `call()` raises `kind` with every word in its message; else what happened."""
    try:
        call()
    except kind as error:
        missing = [w for w in words if w not in str(error)]
        return f"message {str(error)!r} lacks {missing}" if missing else None
    except Exception as error:   # noqa: BLE001 - reported as a failure
        return f"raised {type(error).__name__}: {error}"
    return "did not raise"


def checks(comm, argv: list[str]) -> int:
    rank, size = comm.rank, comm.size
    problems: list[str] = []
    # point-to-point out of tag order (the receiver stashes the first message on the device)
    if size >= 2:
        if rank == 0:
            first, second = cupy.arange(1000, dtype=cupy.float32), cupy.arange(5, dtype=cupy.int64) * 3
            works = [comm.send(first, 1, tag=1, async_op=True), comm.send(second, 1, tag=2, async_op=True)]
            for work in works:
                work.wait()
        elif rank == 1:
            second = comm.recv(cupy.empty(5, cupy.int64), 0, tag=2)
            first = comm.recv(cupy.empty(1000, cupy.float32), 0, tag=1)
            if not (bool((first == cupy.arange(1000, dtype=cupy.float32)).all())
                    and second.get().tolist() == [0, 3, 6, 9, 12]):
                problems.append("point-to-point out of tag order delivered wrong data")
    # async calls complete on wait, in issue order
    x = cupy.full(1 << 18, rank + 1, cupy.float32)
    works = [comm.all_reduce(x, async_op=True),
             comm.broadcast(cupy.full(3, rank, cupy.int32), root=0, async_op=True)]
    total, copied = (w.wait() for w in works)
    if float(total[0]) != size * (size + 1) / 2 or copied.get().tolist() != [0, 0, 0]:
        problems.append(f"async results {float(total[0])}, {copied.get().tolist()}")
    # sub-groups over cuda_ipc: even and odd ranks
    group = comm.split(rank % 2)
    got = group.all_reduce(cupy.full(4, rank, cupy.int32))
    if got.get().tolist() != [sum(r for r in range(size) if r % 2 == rank % 2)] * 4:
        problems.append(f"split all_reduce gave {got.get().tolist()}")
    group.close()
    # DLPack: a torch CUDA tensor, reduced in place
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tensor = torch.ones(1000, device="cuda")
        comm.all_reduce(tensor, out=tensor)
        if float(tensor[0]) != size:
            problems.append(f"torch tensor all_reduce in place gave {float(tensor[0])}")
    # bad buffers: named, with the rank, before anything moves
    host_out = np.empty(10, np.float32)
    device_x = cupy.ones(10, cupy.float32)
    problem = expect(colls.InvalidArgument, lambda: comm.all_reduce(device_x, out=host_out),
                     f"rank {rank}", "out", "GPU")
    if problem:
        problems.append(f"numpy out for a cupy x: {problem}")
    from transports.shm import ShmTransport

    alone = colls.Communicator(ShmTransport(0, 1, lambda data: [data]))
    problem = expect(colls.InvalidArgument, lambda: alone.all_reduce(cupy.ones(3)),
                     "rank 0", "x", "GPU", "cuda_ipc")
    alone.close()
    if problem:
        problems.append(f"cupy x on the shm transport: {problem}")
    # a mismatch (rank 0 sends more than the others expect) is an error on every rank, not a hang
    if size >= 2:
        count = 1001 if rank == 0 else 1000
        ones = cupy.ones(count, cupy.float32)
        problem = expect(colls.CollsError, lambda: comm.all_reduce(ones, algorithm="ring", timeout=10), "")
        if problem:
            problems.append(f"mismatched all_reduce: {problem}")
    for problem in problems:
        print(f"FAIL rank {rank}: {problem}", flush=True)
    print(f"checks rank {rank}/{size}: {len(problems)} problems", flush=True)
    return 1 if problems else 0


def main() -> int:
    mode, argv = sys.argv[1], sys.argv[2:]
    comm = colls.init()
    code = {"matrix": matrix, "ddp": ddp, "checks": checks}[mode](comm, argv)
    if mode != "checks":   # after a mismatch the group is broken: only close the others
        comm.barrier()
    return code


if __name__ == "__main__":
    sys.exit(main())
