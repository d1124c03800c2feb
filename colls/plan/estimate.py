"""One training step priced in closed form: memory per GPU and time per parallel dimension.

The collectives are priced by `nccl_model` (what NCCL runs on the cluster, every group of a
dimension at once), so that `colls plan search` can price thousands of layouts in seconds. The step:

- compute: 2 x active parameters x tokens of forward, twice that backward, per micro-batch and
  stage, at half the GPU's dense peak (`Cluster.gpu_flops`); with a straggler, its stage's compute
  is `factor` times longer and sets the pace;
- TP (Megatron-LM): 4 all-reduces per layer and micro-batch of the activations b*s*h, inside every
  stage's work; EP (GShard, Switch): 4 all-to-alls per MoE layer (every other layer) and micro-batch;
- PP: the 1F1B schedule's (m + (p-1)/v) x a stage's work per micro-batch (Narayanan et al. 2021:
  interleaving v chunks divides the bubble by v), plus the sends on the critical path: 2 (v*p - 1)
  of them when the first micro-batch fills and the last drains the pipeline;
- DP: after the pipeline, not overlapped. ZeRO stage 0 all-reduces the gradient; 1 and 2
  reduce-scatter it and all-gather the updated parameters (the same bytes); 3 all-gathers the
  parameters in forward and again in backward (1.5x). Expert weights, sharded over EP, are reduced
  only over the DP ranks that hold the same experts (`Training.groups("edp")`).

Memory per GPU (bytes, mixed-precision Adam, K = 12): parameters 2, gradients 2, optimizer 12 per
parameter held, divided by the DP size as the ZeRO stage says; activations s*b*h*34/t per layer and
micro-batch (Korthikanti et al. 2022, sequence parallelism with selective recomputation), with
1F1B's stash of min(m, p) micro-batches on the first stage, x (1 + (p-1)/(p*v)) when interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from .nccl_model import Estimate, best, price, unique_groups
from .topology import Cluster
from .training import Training

ADAM_BYTES = 12


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU on the most loaded (first) pipeline stage."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        """Everything above."""
        return self.parameters + self.gradients + self.optimizer + self.activations


@dataclass(frozen=True)
class Dimension:
    """One dimension's communication in a step: calls, bytes per call, seconds, algorithm."""

    dimension: str
    calls: int
    nbytes: int
    seconds: float
    algorithm: str
    bound: str


@dataclass
class Step:
    """A priced step: compute, the pipeline, every dimension, memory beside HBM."""

    training: Training
    cluster: Cluster
    compute: float
    pipeline: float
    dimensions: list[Dimension] = field(default_factory=list)
    memory: Memory | None = None

    @property
    def seconds(self) -> float:
        """The step: the pipeline (TP, EP and PP sends inside it) and then DP."""
        return self.pipeline + sum(d.seconds for d in self.dimensions if d.dimension in ("dp", "edp"))

    @property
    def bubble(self) -> float:
        """Idle share of the pipeline with free sends: (p-1)/v / (m + (p-1)/v)."""
        t = self.training
        idle = (t.pp - 1) / t.interleave
        return idle / (t.micro_batches + idle)

    @property
    def fits(self) -> bool:
        """Whether the memory per GPU fits the device's HBM."""
        return self.memory is not None and self.memory.total <= self.cluster.hbm

    def as_dict(self) -> dict:
        """The machine-readable form (`--json`)."""
        t = self.training
        return {"layout": {"dp": t.dp, "tp": t.tp, "pp": t.pp, "ep": t.ep, "zero": t.zero,
                           "micro_batch": t.micro_batch, "micro_batches": t.micro_batches,
                           "v": t.interleave, "placement": t.placement},
                "step_s": self.seconds, "compute_s": self.compute, "pipeline_s": self.pipeline,
                "bubble": self.bubble,
                "dimensions": {d.dimension: {"time_s": d.seconds, "bytes": d.nbytes, "calls": d.calls,
                                             "algorithm": d.algorithm, "bound": d.bound}
                               for d in self.dimensions},
                "memory_bytes": None if self.memory is None else {
                    "parameters": self.memory.parameters, "gradients": self.memory.gradients,
                    "optimizer": self.memory.optimizer, "activations": self.memory.activations,
                    "total": self.memory.total, "hbm": self.cluster.hbm}}


def validate(t: Training) -> None:
    """Refuse a layout the step cannot have, naming the option.

    Raises:
        ValueError: a size that does not divide, a ZeRO stage outside 0-3, EP without experts.
    """
    if t.zero not in (0, 1, 2, 3):
        raise ValueError(f"--zero {t.zero}: ZeRO stages are 0, 1, 2 and 3")
    if t.interleave < 1 or t.layers % (t.pp * t.interleave):
        raise ValueError(f"--v {t.interleave}: {t.layers} layers do not split into pp x v = "
                         f"{t.pp * t.interleave} chunks")
    if t.interleave > 1 and (t.pp < 2 or t.micro_batches % t.pp):
        raise ValueError(f"--v {t.interleave}: interleaving needs pp > 1 and micro-batches a multiple of "
                         f"pp ({t.micro_batches} and {t.pp})")
    if t.dp % t.ep:
        raise ValueError(f"--ep {t.ep} must divide --dp {t.dp} (EP groups are carved out of DP)")
    if t.ep > 1 and (t.experts < t.ep or t.experts % t.ep or t.expert_fraction <= 0):
        raise ValueError(f"--ep {t.ep} needs --experts a multiple of it and --expert-fraction > 0")


def memory(t: Training) -> Memory:
    """Bytes per GPU on the first stage (the one with the largest activation stash)."""
    dense = t.params * (1 - t.expert_fraction) / (t.tp * t.pp)
    expert = t.params * t.expert_fraction / (t.tp * t.pp * t.ep)
    expert_dp = t.dp // t.ep

    def shard(count: float, stage_from: int, ranks: int) -> float:
        return count / ranks if t.zero >= stage_from else count

    parameters = 2 * (shard(dense, 3, t.dp) + shard(expert, 3, expert_dp))
    gradients = 2 * (shard(dense, 2, t.dp) + shard(expert, 2, expert_dp))
    optimizer = ADAM_BYTES * (shard(dense, 1, t.dp) + shard(expert, 1, expert_dp))
    per_layer = t.seq * t.micro_batch * t.hidden * 34 / t.tp
    stash = min(t.micro_batches, t.pp) * (1 + (t.pp - 1) / (t.pp * t.interleave) if t.interleave > 1 else 1)
    activations = per_layer * t.layers / t.pp * stash
    return Memory(parameters, gradients, optimizer, activations)


@lru_cache(maxsize=4096)
def _layout_groups(placement: str, dp: int, tp: int, pp: int, ep: int, dimension: str) -> tuple:
    t = Training(dp=dp, tp=tp, pp=pp, ep=ep, placement=placement)
    return tuple(map(tuple, unique_groups(t.groups(dimension))))


def groups_of(t: Training, dimension: str) -> list[list[int]]:
    """The distinct groups of one dimension of `t`'s layout (cached: the search asks often)."""
    return [list(g) for g in _layout_groups(t.placement, t.dp, t.tp, t.pp, t.ep, dimension)]


def _call(collective: str, nbytes: int, cluster: Cluster, groups, slow) -> Estimate:
    return best(collective, nbytes, cluster, groups, slow)


def estimate(t: Training, cluster: Cluster, slow: dict[int, float] | None = None) -> Step:
    """Price one step of `t` on `cluster` (a straggler `slow={rank: factor}` slows its compute
    and its links).

    Args:
        t: the training configuration.
        cluster: the machine.
        slow: straggler ranks and factors.

    Returns:
        The priced step.

    Raises:
        ValueError: the layout does not fit the cluster or is inconsistent (see `validate`).
    """
    validate(t)
    if t.world > cluster.size:
        raise ValueError(f"dp*tp*pp = {t.world} GPUs but the cluster has {cluster.size}")
    slow = {r: f for r, f in (slow or {}).items() if r < t.world}
    m, layers_per_stage = t.micro_batches, t.layers // t.pp
    tokens = t.micro_batch * t.seq
    active = t.params * (1 - t.expert_fraction) + (
        t.params * t.expert_fraction * t.top_k / t.experts if t.experts else 0.0)
    forward = 2 * active / (t.pp * t.tp) * tokens / (cluster.gpu_flops * 0.5)
    work = 3 * forward
    dims: list[Dimension] = []
    inside = 0.0
    if t.tp > 1:
        call = _call("all_reduce", t.activation_bytes, cluster, groups_of(t, "tp"), slow)
        calls = 4 * layers_per_stage * m
        dims.append(Dimension("tp", calls, t.activation_bytes, calls * call.seconds, call.algorithm,
                              call.bound))
        inside += 4 * layers_per_stage * call.seconds
    if t.ep > 1:
        nbytes = t.activation_bytes * t.top_k
        call = _call("all_to_all", nbytes, cluster, groups_of(t, "ep"), slow)
        calls = 4 * (layers_per_stage // 2) * m
        dims.append(Dimension("ep", calls, nbytes, calls * call.seconds, call.algorithm, call.bound))
        inside += 4 * (layers_per_stage // 2) * call.seconds
    stage_work = work + inside
    slowest = max(slow.values(), default=1.0)
    # the straggler's stage sets the pace of the steady state; the bubble is the others' fill and drain
    pipeline = m * stage_work * slowest + (t.pp - 1) / t.interleave * stage_work
    if t.pp > 1:
        send = t.activation_bytes // t.tp
        pairs = [[r, g[g.index(r) + 1]] for g in groups_of(t, "pp") for r in g[:-1]]
        call = price("all_gather", "ring", 2 * send, cluster, pairs, slow)   # a pair swapping `send`
        hops = 2 * (t.interleave * t.pp - 1)
        dims.append(Dimension("pp", hops, send, hops * call.seconds, "p2p", call.bound))
        pipeline += hops * call.seconds
    if t.dp > 1:
        dense = int(t.params * (1 - t.expert_fraction) / (t.tp * t.pp)) * t.bytes_per_value
        dims.append(_data_parallel("dp", dense, t, cluster, groups_of(t, "dp"), slow))
        if t.expert_fraction > 0 and t.dp // t.ep > 1:
            expert = int(t.params * t.expert_fraction / (t.tp * t.pp * t.ep)) * t.bytes_per_value
            dims.append(_data_parallel("edp", expert, t, cluster, groups_of(t, "edp"), slow))
    return Step(t, cluster, m * work * slowest, pipeline, dims, memory(t))


def _data_parallel(name: str, gradient: int, t: Training, cluster: Cluster, groups, slow) -> Dimension:
    if t.zero == 0:
        call = _call("all_reduce", gradient, cluster, groups, slow)
        return Dimension(name, 1, gradient, call.seconds, call.algorithm, call.bound)
    scatter = _call("reduce_scatter", gradient, cluster, groups, slow)
    gather = _call("all_gather", gradient, cluster, groups, slow)
    gathers = 2 if t.zero == 3 else 1
    return Dimension(name, 1 + gathers, gradient, scatter.seconds + gathers * gather.seconds,
                     f"reduce_scatter + {gathers} all_gather", gather.bound)
