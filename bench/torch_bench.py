"""torch.distributed over "colls" against "gloo" in the same processes: all_reduce from 8 B to
256 MiB, and a DDP training step of a ~25M-parameter model.

Run:  colls run -n 2 python bench/torch_bench.py [--max-bytes 256M] [--steps 3]
      (or torchrun --nproc-per-node 2 bench/torch_bench.py)

all_reduce rows: the slowest rank's time per `dist.all_reduce(float32)` (`time_calls`),
busbw = bytes * 2(n-1)/n / time (nccl-tests' definition); beside them, colls on a tensor in its
registered memory (`torch.from_numpy(colls.alloc(...))`, docs/torch.md), and every rank copying the same
bytes at once (`Tensor.copy_`), the machine's memory speed at that moment, which moves colls'
times more than Gloo's. DDP rows: step time (forward,
backward with DDP's bucketed all_reduces, SGD step) with each backend; the same step with a
comm hook that returns each bucket as it is (DDP's own bucketing, copies and division, with
communication free); and the step without DDP's work (`no_sync`), all timed in turns. A backend's
communication time is its step less the no-op hook's step: what backward's overlap does not hide
of the backend's own work.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import colls
import colls.torch  # noqa: F401 - registers "colls"

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SIZES = [8 * 8 ** i for i in range(6)] + [(1 << 20) * 4 ** i for i in range(5)]   # 8 B .. 256 MiB
REPEATS = 5   # timed loops per size and backend (the median is reported)


def parse_bytes(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1].upper()] if text[-1].upper() in UNITS else int(text)


def slowest(seconds: float, gloo) -> float:
    """The slowest rank's time (gathered over Gloo, outside the timed region)."""
    value = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=gloo)
    return value.item()


def time_loop(calls: int, barrier_group, gloo, fn, *args, **kwargs) -> float:
    """Seconds per `fn(*args, **kwargs)`: `calls` calls back to back after a barrier of `barrier_group`,
    divided by `calls` (as nccl-tests time a loop, so the barrier's skew is spread), the slowest
    rank's."""
    dist.barrier(group=barrier_group)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args, **kwargs)
    return slowest((time.perf_counter() - start) / calls, gloo)


def time_calls(calls: int, gloo, fn, tensor: torch.Tensor, group=None) -> float:
    """The median of REPEATS `time_loop`s of `fn(tensor, group=group)` after a call to warm up,
    each loop started by `group`'s own barrier (Gloo's takes milliseconds at 4 ranks on 2 cores
    and lets the ranks go milliseconds apart, which a colls loop would be charged for)."""
    fn(tensor, group=group)   # first-call setup on both sides
    return statistics.median(time_loop(calls, group, gloo, fn, tensor, group=group) for _ in range(REPEATS))


def all_reduce_rows(max_bytes: int, gloo, rank: int, size: int) -> None:
    if rank == 0:
        print(f"all_reduce float32, {size} ranks: time per call (busbw)")
        print("| bytes | colls | gloo | gloo / colls | colls, registered | colls / registered | copy | "
              "colls / copy |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for nbytes in (n for n in SIZES if n <= max_bytes):
        tensor = torch.zeros(nbytes // 4)   # (sums of ones in place would overflow to inf)
        calls = max(5, min(100, (64 << 20) // nbytes))   # (5+: a barrier's skew spread)
        colls_s = time_calls(calls, gloo, dist.all_reduce, tensor)
        gloo_s = time_calls(calls, gloo, dist.all_reduce, tensor, group=gloo)
        registered = torch.from_numpy(colls.alloc(nbytes // 4, np.float32))
        registered_s = time_calls(calls, gloo, dist.all_reduce, registered)
        target = torch.empty_like(tensor)
        copy_s = time_calls(calls, gloo, lambda t, group, target=target: target.copy_(t), tensor, group=gloo)
        if rank == 0:
            factor = 2 * (size - 1) / size
            cells = [f"{s * 1e6:.1f} us ({nbytes * factor / s / 1e9:.2f} GB/s)" for s in (colls_s, gloo_s)]
            print(f"| {nbytes} | {cells[0]} | {cells[1]} | {gloo_s / colls_s:.2f}x | "
                  f"{registered_s * 1e6:.1f} us | {colls_s / registered_s:.2f}x | "
                  f"{copy_s * 1e6:.1f} us ({nbytes / copy_s / 1e9:.2f} GB/s) | {colls_s / copy_s:.1f}x |",
                  flush=True)


def model() -> torch.nn.Module:
    """25.2M parameters: 2048 x 4096 + 4096 x 4096 weights and their biases."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096))


def step(wrapped: DDP, optimizer: torch.optim.Optimizer, batch: torch.Tensor, sync: bool) -> None:
    """One training step; without `sync`, backward makes no all_reduce (DDP's `no_sync`)."""
    optimizer.zero_grad()
    if sync:
        wrapped(batch).square().mean().backward()
    else:
        with wrapped.no_sync():
            wrapped(batch).square().mean().backward()
    optimizer.step()


def no_communication(state, bucket):  # noqa: ANN001, ANN201 - torch checks the hook's annotations
    """A DDP comm hook that hands each bucket (a `dist.GradBucket`) back as it is: DDP's step with
    free communication."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def ddp_rows(steps: int, repeats: int, gloo, rank: int, size: int) -> None:
    """DDP over each backend, with a no-op comm hook, and without DDP's work (`no_sync`), timed in
    turns (one loop of each per repeat) so that a busy machine slows all alike. Step times are
    medians over `repeats`; a communication time is the median of each repeat's difference from
    that repeat's no-op step (paired, as the machine's speed drifts between repeats)."""
    batch = torch.randn(8, 2048)
    runs = {}
    for name, group in (("colls", None), ("gloo", gloo), ("no-op hook", gloo), ("no_sync", gloo)):
        wrapped = DDP(model(), process_group=group)
        if name == "no-op hook":
            wrapped.register_comm_hook(None, no_communication)
        runs[name] = (wrapped, torch.optim.SGD(wrapped.parameters(), lr=1e-3), batch, name != "no_sync")
        step(*runs[name])   # warm up: DDP builds its buckets on the first step
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            times.setdefault(name, []).append(time_loop(steps, gloo, gloo, step, *run))
    if rank == 0:
        def less(name: str, base: str) -> float:
            return statistics.median(a - b for a, b in zip(times[name], times[base], strict=True))

        parameters = sum(p.numel() for p in model().parameters())
        print(f"\nDDP step, {parameters / 1e6:.1f}M float32 parameters, batch 8, {size} ranks, "
              f"medians of {repeats} repeats")
        print("| step | time | communication (less the no-op hook's step) |\n| --- | ---: | ---: |")
        comm = {name: less(name, "no-op hook") for name in ("colls", "gloo")}
        for name, values in times.items():
            cell = f"{comm[name] * 1e3:.1f} ms" if name in comm else ""
            print(f"| {name} | {statistics.median(values) * 1e3:.1f} ms | {cell} |")
        print(f"communication: gloo / colls = {comm['gloo'] / max(comm['colls'], 1e-9):.2f}x; "
              f"DDP's own bucketing (no-op hook less no_sync): {less('no-op hook', 'no_sync') * 1e3:.1f} ms",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", default="256M", help="largest all_reduce (default 256M)")
    parser.add_argument("--steps", type=int, default=3, help="DDP steps per timed loop (default 3)")
    parser.add_argument("--repeats", type=int, default=9, help="timed DDP loops of each kind (default 9)")
    parser.add_argument("--skip", default="", help="all_reduce or ddp: leave that part out")
    options = parser.parse_args()
    dist.init_process_group("colls")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    if "all_reduce" not in options.skip:
        all_reduce_rows(parse_bytes(options.max_bytes), gloo, rank, size)
    if "ddp" not in options.skip:
        ddp_rows(options.steps, options.repeats, gloo, rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
