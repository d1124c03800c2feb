"""`ddp`: data parallel over all-reduce with gradient buckets overlapped with backward.

After PyTorch DDP (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training"): the flat gradient buffer is cut into buckets in *reverse* layer order (the order
backward produces them), the first bucket small (1 MB) so communication starts early, the others up
to `bucket_bytes` (25 MB). As soon as backward has finished every layer a bucket covers, that
bucket's all-reduce is started (in place: the bucket is a view of the flat buffer), and backward
goes on with the earlier layers while it runs; all are waited before the optimizer step. Each
bucket's all-reduce is a persistent collective (`Communicator.all_reduce_init`, MPI-4's
MPI_Allreduce_init), made once for the run, as DDP's buckets are built once: a step only starts
and waits them. With gradient accumulation, the non-final micro-steps add into the gradients
without any communication (DDP's `no_sync`). Ring all-reduce (Baidu, Gibiansky 2017) by default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .common import RunResult, Setup, StepTimer, local_batch, micro_batches
from .model import Layout
from .placement import to_host
from .serial import Replica


@dataclass(frozen=True)
class Bucket:
    """Elements `start`..`stop` of the flat gradient; ready once layer `first_layer` is done."""

    start: int
    stop: int
    first_layer: int


def make_buckets(layout: Layout, itemsize: int, bucket_bytes: int, first_bucket_bytes: int) -> list[Bucket]:
    """Whole tensors, walked from the last layer back, packed into contiguous buckets."""
    buckets: list[Bucket] = []
    stop = start = layout.total
    first_layer = len(layout.segments) - 1
    for index in range(len(layout.segments) - 1, -1, -1):
        segment = layout.segments[index]
        for _, offset, _ in reversed(segment.tensors):
            tensor_start = segment.start + offset
            cap = first_bucket_bytes if not buckets else bucket_bytes
            if stop > start and (stop - tensor_start) * itemsize > cap:
                buckets.append(Bucket(start, stop, first_layer))   # close the bucket before this tensor
                stop = start
            start, first_layer = tensor_start, index
    if stop > start:
        buckets.append(Bucket(start, stop, first_layer))
    return buckets


def bucket_all_reduces(comm, grads, buckets: list[Bucket], algorithm: str | None) -> list:
    """One persistent in-place all-reduce per bucket of the flat gradient `grads`."""
    return [comm.all_reduce_init(grads[b.start:b.stop], out=grads[b.start:b.stop], algorithm=algorithm)
            for b in buckets]


class BucketLauncher:
    """One step's buckets: starts each all-reduce as soon as backward has covered it."""

    def __init__(self, handles: list, buckets: list[Bucket]) -> None:
        self.handles, self.buckets = handles, buckets
        self.works: list = []   # the handles started this step, in bucket order
        self.events: list[dict] = []   # per issued bucket: when, and when it was seen finished

    def layer_done(self, layer: int) -> None:
        """Backward finished `layer`: issue every bucket whose layers are all done (-1: all)."""
        for event, work in zip(self.events, self.works, strict=True):
            if event["completed_at_layer"] is None and work.is_completed():
                event["completed_at_layer"] = layer
        while len(self.works) < len(self.buckets) and self.buckets[len(self.works)].first_layer >= layer:
            handle = self.handles[len(self.works)]
            handle.start()
            self.works.append(handle)
            self.events.append({"bucket": len(self.works) - 1, "issued_after_layer": layer,
                                "issued_at": time.perf_counter(), "completed_at_layer": None,
                                "completed_by_backward_end": False})

    def finish(self) -> float:
        """Backward is over: note what already finished, issue the rest, wait for all."""
        backward_end = time.perf_counter()
        for event, work in zip(self.events, self.works, strict=True):
            event["completed_by_backward_end"] = work.is_completed()
        self.layer_done(-1)   # buckets not yet issued (this rank had no rows this step)
        for work in self.works:
            work.wait()
        return backward_end


def train_ddp(comm, setup: Setup) -> RunResult:
    """Train with bucketed, overlapped all-reduce of the gradients."""
    model = setup.build()
    replica = Replica(setup, model)
    buckets = make_buckets(model.layout, replica.grads.itemsize, setup.bucket_bytes,
                           setup.first_bucket_bytes)
    handles = bucket_all_reduces(comm, replica.grads, buckets, setup.algorithm)
    records, overlap = [], []
    for step in range(setup.steps):
        timer = StepTimer(comm)
        tokens, targets, scale = local_batch(setup, step, comm.rank, comm.size)
        launcher = BucketLauncher(handles, buckets)
        loss = 0.0
        parts = micro_batches(tokens, targets, setup.micro_steps)
        for i, (micro_tokens, micro_targets) in enumerate(parts):
            final = i == len(parts) - 1   # no_sync on the others: gradients just accumulate
            loss += replica.accumulate(micro_tokens, micro_targets, scale,
                                       launcher.layer_done if final else None)
        backward_end = launcher.finish()
        replica.step()
        records.append(timer.finish(step, loss))
        overlap.append({"backward_end": backward_end, "buckets": launcher.events})
    return RunResult("ddp", comm.rank, comm.size, model.layout.parameters, records, replica.state_bytes(), 0,
                     to_host(model.layout.pack(replica.params)).astype("float64"),
                     extra={"buckets": [(b.start, b.stop, b.first_layer) for b in buckets],
                            "overlap": overlap})
