"""`gpipe`, `1f1b`, `interleaved`: pipeline parallelism, consecutive layers on consecutive ranks.

The model's layers are cut into p·v contiguous *stages* (v = 1 but for `interleaved`); stage g
lives on pipeline rank g mod p, so rank r holds chunks r, r + p, ... (Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"). Each rank's
rows of the batch are split into m micro-batches; a stage receives a micro-batch's activations from
the previous stage (`recv`), runs its layers, and sends its output on (`send`, asynchronous, so a
rank only ever waits for its inputs); backward moves the gradients the other way. Schedules:

- `gpipe` (Huang et al. 2019): all m forwards, then all m backwards; every rank stashes m
  micro-batches of activations.
- `1f1b` (PipeDream-Flush, Narayanan et al. 2019/2021): p - r - 1 warm-up forwards, then one
  forward one backward, then the cool-down backwards: at most p - r micro-batches stashed.
- `interleaved` (Megatron-LM's interleaved 1F1B): the same with v chunks per rank, micro-batches
  in groups of p; the bubble shrinks from (p-1)/(m+p-1) to (p-1)/(v·m+p-1) of the step.

Every forward and backward is timed on every rank: the measured bubble (idle fraction of the step)
stands beside the formula and beside the same schedule replayed with zero-cost messages
(schedule.py). After the flush, gradients of the parts replicated over data-parallel ranks are
summed over them. A *plan* (`Replicated` here) says which layers a stage runs and how their parameters and
gradients are shared: that is where tensor and expert parallelism plug in (hybrid.py).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import numpy as np

from . import functional as F
from .common import RunResult, Setup, StepTimer, global_batch, merge_traffic, micro_batches, traffic
from .data import shard_rows
from .model import Model
from .placement import contiguous, to_device, to_host
from .schedule import schedule
from .serial import Replica

BACKWARD_COST = 2.0         # backward sleeps this many `stage_seconds` (a backward is ~2 forwards)
# -- stages --------------------------------------------------------------------------------------

def stage_layers(layers: int, stages: int) -> list[range]:
    """Full-model layer indices of each stage: contiguous, as even as possible."""
    if layers < stages:
        raise ValueError(f"a pipeline of {stages} stages needs at least {stages} layers, the model has "
                         f"{layers}: pass --blocks {-(-(stages - 2) // 2)} or more")
    return [range(s.start, s.stop) for s in (shard_rows(layers, stages, g) for g in range(stages))]


@dataclass(frozen=True)
class Chunk:
    """One stage on this rank: local layers `first`..`stop` of the rank's model."""

    stage: int          # global stage index g (chunk c of rank r: c·p + r)
    first: int
    stop: int
    is_first: bool
    is_last: bool

    def forward(self, model: Model, flat: np.ndarray, x: np.ndarray, targets: np.ndarray, scale: float):
        """(output, loss, caches): the layers on `x`; the last stage also takes the loss."""
        caches, loss = [], 0.0
        for index in range(self.first, self.stop):
            layer, params = model.layers[index], compute_views(model, flat, index)
            if getattr(layer, "adds_loss", False):   # an MoE block adds its load-balancing term
                x, cache = layer.forward(params, x, scale)
                loss += cache.loss
            else:
                x, cache = layer.forward(params, x)
            caches.append(cache)
        if self.is_last:
            cross_entropy, dlogits = F.cross_entropy(x, targets, scale)
            return None, loss + cross_entropy, caches + [dlogits]
        return contiguous(x, model.dtype), loss, caches   # what goes on the wire: compute dtype

    def backward(self, model: Model, flat: np.ndarray, grads: np.ndarray, caches: list, dy):
        """Accumulate the layers' gradients into `grads` (compute dtype); the gradient of the
        stage's input."""
        dy = caches[-1] if self.is_last else dy
        for index in range(self.stop - 1, self.first - 1, -1):
            sink = model.layout.views(grads, index)
            dy = model.layers[index].backward(compute_views(model, flat, index), sink,
                                              caches[index - self.first], dy)
        return None if dy is None else contiguous(dy, model.dtype)


def compute_views(model: Model, flat: np.ndarray, index: int) -> dict[str, np.ndarray]:
    """Layer `index`'s parameters in the compute dtype (a copy only for a low-precision buffer)."""
    return {k: v.astype(model.dtype, copy=False) for k, v in model.layout.views(flat, index).items()}


class Replicated:
    """The plain plan: stage layers as they are, replicated over the data-parallel ranks of the stage
    (`data_comm`, None for one). A plan says which layers a rank runs, how its parameters come from
    and go back to the serial layout, and how gradients are summed after the flush; hybrid.py has
    the tensor- and expert-parallel ones."""

    def __init__(self, data_comm, data_rank: int, data_size: int) -> None:
        self.data_comm, self.data_rank, self.data_size = data_comm, data_rank, data_size
        self.counts_loss = True            # whether this rank's loss is part of the global sum
        self.comms = [c for c in (data_comm,) if c is not None]

    def layers(self, layers: list) -> list:
        return layers

    def load(self, full: Model, full_flat: np.ndarray, local: Model, out: np.ndarray, layer_map: list[int]):
        for index, full_index in enumerate(layer_map):
            for name, view in local.layout.views(out, index).items():
                view[...] = full.layout.views(full_flat, full_index)[name]

    def shared(self, local: Model, params: np.ndarray) -> np.ndarray:
        """The parameters every rank of the stage holds alike (all of them here)."""
        return params

    def figures(self, local: Model) -> dict:
        """What the plan measured this step, beside its formulas (read before the gradient sync)."""
        return {}

    def sync(self, local: Model, grads: np.ndarray) -> None:
        if self.data_comm is not None and self.data_comm.size > 1:
            self.data_comm.all_reduce(grads, out=grads)

    def store(self, full: Model, local: Model, local_flat: np.ndarray, flat: np.ndarray,
              layer_map: list[int]) -> None:
        """Write this rank's share of the serial parameters into `flat` (zeros; summed over ranks)."""
        if self.data_rank == 0:
            for index, full_index in enumerate(layer_map):
                target = full.layout.views(flat, full_index)
                for name, view in local.layout.views(local_flat, index).items():
                    target[name][...] = view


# -- the loop ------------------------------------------------------------------------------------

def check_setup(strategy: str, setup: Setup, size: int, inner: int = 1) -> None:
    """Errors a user can act on, before any collective."""
    p, m = setup.pp, setup.micro_batches
    if size != p * setup.dp * inner:
        raise ValueError(f"{strategy} on a grid of {p * setup.dp * inner} ranks (--pp {p} --dp {setup.dp}"
                         f"{f' × {inner}' if inner > 1 else ''}), got {size}")
    if strategy == "interleaved" and m % p:
        raise ValueError(f"interleaved: --micro-batches {m} must be a multiple of --pp {p} (Megatron-LM)")
    stage_layers(len(setup.model.layers()), p * (setup.chunks if strategy == "interleaved" else 1))
    data = setup.dp * (inner if setup.ep > 1 else 1)
    if setup.batch // data < m:
        raise ValueError(f"--batch {setup.batch} over {data} data-parallel ranks leaves fewer rows than "
                         f"--micro-batches {m}")


class PipelineRank:
    """One rank's part of the pipeline: its chunks, their parameters, and its op list. Grid: PP
    outermost, then DP, then `inner` tp or ep ranks (Megatron-LM's order); `make_plan(comm, setup,
    stage, position)` makes the rank's plan (collective over `comm`)."""

    def __init__(self, comm, setup: Setup, strategy: str, inner: int, make_plan) -> None:
        check_setup(strategy, setup, comm.size, inner)
        self.setup, self.strategy, self.inner = setup, strategy, inner
        p, m = setup.pp, setup.micro_batches
        self.p, self.m, self.v = p, m, setup.chunks if strategy == "interleaved" else 1
        self.stage_rank, self.position = divmod(comm.rank, comm.size // p)
        self.pipe = comm.split(self.position, self.stage_rank)   # same (dp, tp/ep) place, every stage
        self.plan = make_plan(comm, setup, self.stage_rank, self.position)
        self.full = setup.build()
        self.ranges = stage_layers(len(self.full.layers), p * self.v)
        self.stages = [c * p + self.stage_rank for c in range(self.v)]
        self.layer_map = [i for g in self.stages for i in self.ranges[g]]
        self.local = Model(setup.model, setup.compute_dtype,
                           layers=self.plan.layers([self.full.layers[i] for i in self.layer_map]),
                           device=setup.device)
        self.chunks, first = [], 0
        for g in self.stages:
            self.chunks.append(Chunk(g, first, first + len(self.ranges[g]), g == 0, g == p * self.v - 1))
            first += len(self.ranges[g])
        self.replica = Replica(setup, self.local)
        self.plan.load(self.full, setup.initial_params(self.full), self.local, self.replica.params,
                       self.layer_map)
        if self.replica.master is not None:
            self.replica.master[...] = self.replica.params
        self.ops = schedule(strategy, p, m, self.v, self.stage_rank)
        # micro-batch gradients add up in the compute dtype (Megatron-LM's fp32 main_grad), and
        # go into the low-precision gradient buffer once, at the flush
        working = self.replica.grads
        self.accumulator = working if working.dtype == self.local.dtype else self.local.zeros()

    def activation(self, rows: int) -> np.ndarray:
        """A buffer for one micro-batch's activations (or their gradient) between stages."""
        cfg = self.setup.model
        return self.local.xp.empty((rows, cfg.seq_len, cfg.d_model), self.local.dtype)

    def step(self, step: int) -> tuple[float, list, int]:
        """Run the op list on batch `step`: (local loss, timed ops, peak stashed chunk micro-batches).
        A message's tag names its sending stage, micro-batch and direction: 2(g·m + i) + (0 forward,
        1 backward)."""
        p, m, params, grads = self.p, self.m, self.replica.params, self.accumulator
        tokens, targets, scale = batch_rows(self.setup, step, self.plan.data_rank, self.plan.data_size)
        micros = micro_batches(tokens, targets, m)
        stash: dict[tuple[int, int], list] = {}
        sends, events, peak, loss = [], [], 0, 0.0
        for kind, micro, c in self.ops:
            chunk, (micro_tokens, micro_targets) = self.chunks[c], micros[micro]
            tag = 2 * (chunk.stage * m + micro)
            if kind == "F":
                x = micro_tokens
                if not chunk.is_first:   # the previous stage's output
                    x = self.pipe.recv(self.activation(len(micro_tokens)), (chunk.stage - 1) % p, tag - 2 * m)
                start = time.perf_counter()
                y, part, stash[(micro, c)] = chunk.forward(self.local, params, x, micro_targets, scale)
                time.sleep(self.setup.stage_seconds)
                loss, peak = loss + part, max(peak, len(stash))
                out, peer = y, (chunk.stage + 1) % p
            else:
                dy = None
                if not chunk.is_last:    # the next stage's input gradient
                    dy = self.pipe.recv(self.activation(len(micro_tokens)), (chunk.stage + 1) % p,
                                        tag + 2 * m + 1)
                start = time.perf_counter()
                out = chunk.backward(self.local, params, grads, stash.pop((micro, c)), dy)
                time.sleep(BACKWARD_COST * self.setup.stage_seconds)
                peer, tag = (chunk.stage - 1) % p, tag + 1
            events.append((kind, micro, c, start, time.perf_counter()))
            if out is not None:   # asynchronous: a rank only ever waits for its inputs
                sends.append((self.pipe.send(out, peer, tag=tag, async_op=True), out))
        for work, _ in sends:
            work.wait()
        if grads is not self.replica.grads:
            self.replica.grads[...] = grads
            grads[...] = 0
        return loss, events, peak


def run_pipeline(comm, setup: Setup, strategy: str, inner: int, make_plan) -> RunResult:
    """Train with pipeline schedule `strategy` on the grid; RunResult.params: the full parameters."""
    rank = PipelineRank(comm, setup, strategy, inner, make_plan)
    plan, replica, pipe = rank.plan, rank.replica, rank.pipe
    records, timelines, stashes, p2p, figures = [], [], [], [], []
    for step in range(setup.steps):
        comm.barrier()   # every rank starts the step together, so the timeline measures the schedule
        timer = StepTimer(comm)
        for sub in [pipe, *plan.comms]:
            sub.reset_stats()
        loss, events, peak = rank.step(step)
        p2p.append(int(traffic(pipe)[0]))
        figures.append(plan.figures(rank.local))
        plan.sync(rank.local, replica.grads)   # the flush is over: sum the replicated gradients
        replica.step()
        record = timer.finish(step, loss if plan.counts_loss else 0.0)
        records.append(merge_traffic(record, [pipe, *plan.comms]))
        timelines.append(events)
        stashes.append(peak)
    full = rank.full
    flat = np.zeros_like(replica.params, shape=full.layout.total)   # on the parameters' device
    plan.store(full, rank.local, replica.params, flat, rank.layer_map)
    final = comm.all_reduce(flat, out=flat) if comm.size > 1 else flat   # one writer per element
    rows = len(batch_rows(setup, 0, plan.data_rank, plan.data_size)[0])
    row_bytes = setup.model.seq_len * setup.model.d_model * rank.local.dtype.itemsize
    extra = {"strategy": strategy, "p": rank.p, "m": rank.m, "v": rank.v, "stage_rank": rank.stage_rank,
             "position": rank.position, "inner": inner, "stage_seconds": setup.stage_seconds,
             "stages": [(rank.ranges[g].start, rank.ranges[g].stop) for g in rank.stages],
             "events": timelines, "peak_stash": stashes, "p2p_sent": p2p, "plan": figures,
             "p2p_expected": p2p_formula(rank.chunks, rows, row_bytes),
             "local_digest": digest(replica.params),
             "shared_digest": digest(plan.shared(rank.local, replica.params))}
    return RunResult(strategy, comm.rank, comm.size, full.layout.parameters, records, replica.state_bytes(),
                     0, to_host(full.layout.pack(final)).astype(np.float64), replicated=False, extra=extra)


def digest(array: np.ndarray) -> str:
    """A fingerprint of an array's bytes (replicas must agree bit for bit)."""
    return hashlib.sha256(np.ascontiguousarray(to_host(array)).tobytes()).hexdigest()


def batch_rows(setup: Setup, step: int, data_rank: int, data_size: int):
    """(tokens, targets, scale) of data-parallel rank `data_rank`: its rows of global batch `step`."""
    cfg = setup.model
    tokens, targets = global_batch(setup.seed, step, setup.batch, cfg.seq_len, cfg.vocab)
    rows = shard_rows(setup.batch, data_size, data_rank)
    return to_device(tokens[rows], setup.device), to_device(targets[rows], setup.device), 1.0 / targets.size


def p2p_formula(chunks: list[Chunk], rows: int, row_bytes: int) -> int:
    """Bytes a rank sends per step: every row's activations out of each non-last stage, its
    gradients out of each non-first stage."""
    crossings = sum((not c.is_last) + (not c.is_first) for c in chunks)
    return crossings * rows * row_bytes


def data_parallel_plan(comm, setup: Setup, stage: int, position: int) -> Replicated:
    """DP × PP: the dp ranks of one stage are data-parallel replicas of it."""
    data_comm = comm.split(stage, position) if setup.dp > 1 else None
    return Replicated(data_comm, position, setup.dp)


def train_gpipe(comm, setup: Setup) -> RunResult:
    """GPipe: all forwards, then all backwards (× --dp replicas)."""
    return train(comm, setup, "gpipe")


def train_1f1b(comm, setup: Setup) -> RunResult:
    """1F1B: warm-up, one forward one backward, cool-down (× --dp replicas)."""
    return train(comm, setup, "1f1b")


def train_interleaved(comm, setup: Setup) -> RunResult:
    """Interleaved 1F1B with --chunks v model chunks per rank (× --dp replicas)."""
    return train(comm, setup, "interleaved")


def train(comm, setup: Setup, strategy: str = "1f1b") -> RunResult:
    """Train with pipeline schedule `strategy`; --dp D replicates the pipeline D times."""
    if setup.tp > 1 or setup.ep > 1:
        raise ValueError(f"{strategy} is pipeline (× data) parallel; for --tp or --ep use 3d or pp_ep")
    return run_pipeline(comm, setup, strategy, 1, data_parallel_plan)


def world_size(strategy: str, setup: Setup) -> int:
    """pp × dp ranks (ValueError before anything starts if the setup cannot run)."""
    check_setup(strategy, setup, setup.pp * setup.dp)
    return setup.pp * setup.dp
