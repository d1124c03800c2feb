"""Communication per training step of a DP × TP × PP (× EP) job, by simulating its collectives.

Each parallel dimension's traffic is simulated with every group of that dimension running at once
(so that groups sharing a NIC or a leaf uplink slow each other), using the registered algorithms:

- TP (Megatron-LM, Shoeybi et al. 2019): the f and g operators, 2 all-reduces forward and 2 backward
  per layer and micro-batch, of the activations b·s·h;
- PP: the 1F1B schedule (Narayanan et al. 2021) *simulated*, each stage's work included (its
  compute and its TP and EP collectives, which run inside every micro-batch), so the bubble is
  measured rather than taken from (p-1)/(m+p-1); each TP rank sends its 1/tp of the activations
  (Megatron's scatter-gather);
- DP: one all-reduce per step of each rank's gradient shard Ψ/(tp·pp), after the pipeline;
- EP (GShard, Switch): 4 all-to-alls per MoE layer and micro-batch (dispatch and combine, forward and
  backward) of the micro-batch's tokens × h × top-k; every other layer is an MoE layer.

The step is the simulated 1F1B schedule, then DP's all-reduce (no overlap).

Placement is the order of the dimensions from innermost (consecutive GPUs) to outermost:
"tp,dp,pp" is Megatron's (TP inside a node, PP stages far apart), "tp,pp,dp" keeps the stages of a
pipeline under one leaf, "dp,pp,tp" puts TP across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .pipeline import simulate_pipeline
from .simulate import simulate
from .topology import Cluster

GB = 1e9


@dataclass(frozen=True)
class Training:
    """A training configuration: model shape, batch, parallel sizes and their placement."""

    params: float = 100e9          # Ψ
    layers: int = 80
    hidden: int = 10240
    seq: int = 2048
    micro_batch: int = 1           # sequences per micro-batch
    micro_batches: int = 16        # m, per step and pipeline
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1                    # expert-parallel group size, carved out of the DP ranks
    top_k: int = 1
    bytes_per_value: int = 2       # fp16 / bf16
    placement: str = "tp,dp,pp"
    gpu_flops: float = 989e12 * 0.5   # H100 dense bf16 at 50% utilisation
    zero: int = 0                  # ZeRO stage 0-3 over the DP group (DeepSpeed; Rajbhandari et al. 2020)
    interleave: int = 1            # v: model chunks per pipeline rank (Megatron's interleaved 1F1B)
    experts: int = 0               # E experts per MoE layer (0: a dense model)
    expert_fraction: float = 0.0   # share of the parameters in expert weights (sharded over EP)

    @property
    def world(self) -> int:
        """GPUs the configuration needs: dp · tp · pp."""
        return self.dp * self.tp * self.pp

    @property
    def activation_bytes(self) -> int:
        """One micro-batch's activations b·s·h at one layer boundary."""
        return self.micro_batch * self.seq * self.hidden * self.bytes_per_value

    def groups(self, dimension: str) -> list[list[int]]:
        """groups[r]: the ranks of rank r's `dimension` group ("dp", "tp", "pp", "ep", or "edp": the
        DP ranks holding the same experts, over which expert gradients are reduced)."""
        order = [d.strip() for d in self.placement.split(",")]
        if sorted(order) != ["dp", "pp", "tp"]:
            raise ValueError(f"placement {self.placement!r} must order dp, tp and pp, e.g. tp,dp,pp")
        sizes = {"dp": self.dp, "tp": self.tp, "pp": self.pp}
        strides, stride = {}, 1
        for d in order:
            strides[d] = stride
            stride *= sizes[d]
        split, width = dimension, None
        if dimension in ("ep", "edp"):   # EP groups: consecutive runs of `ep` members of each DP group
            split, width = "dp", self.ep
        result = []
        for rank in range(self.world):
            index = rank // strides[split] % sizes[split]
            base = rank - index * strides[split]
            if dimension == "edp":   # the DP ranks that hold the same experts (one per EP group)
                members = range(index % width, sizes[split], width)
            else:
                members = range(sizes[split]) if width is None else range(index // width * width,
                                                                         index // width * width + width)
            result.append([base + i * strides[split] for i in members])
        return result

    def compute_seconds(self) -> tuple[float, float]:
        """(forward, backward) seconds of one micro-batch on one stage of one TP rank."""
        tokens = self.micro_batch * self.seq
        forward = 2 * self.params / (self.pp * self.tp) * tokens / self.gpu_flops
        return forward, 2 * forward


@dataclass(frozen=True)
class DimensionTime:
    """One dimension's communication per step: calls, bytes per call and rank, seconds."""

    dimension: str
    calls: int
    nbytes: int
    seconds_per_call: float
    algorithm: str
    bytes_sent: int

    @property
    def seconds(self) -> float:
        """Seconds of this dimension's communication in one step."""
        return self.calls * self.seconds_per_call


@dataclass(frozen=True)
class StepPlan:
    """The predicted communication of one step, and the simulated pipeline."""

    training: Training
    dimensions: list[DimensionTime]
    pipeline_seconds: float       # the simulated 1F1B step (each stage's work and stage-to-stage sends)
    pipeline_free_links: float    # the same schedule with sends that cost nothing
    pipeline_ideal: float         # m · a stage's work per micro-batch: the same with no bubble and no sends
    compute_seconds: float = 0.0  # m · (forward + backward): the stage's compute alone

    @property
    def step_seconds(self) -> float:
        """One step: the 1F1B schedule (TP's and EP's collectives inside each stage's work), then
        the gradient all-reduce (DP, not overlapped)."""
        return self.pipeline_seconds + sum(d.seconds for d in self.dimensions if d.dimension == "dp")

    @property
    def bubble(self) -> float:
        """Idle fraction of the simulated step with free links (1F1B's is (p-1)/(m+p-1))."""
        return 1 - self.pipeline_ideal / self.pipeline_free_links if self.pipeline_free_links else 0.0

    @property
    def communication_seconds(self) -> float:
        """Every dimension's communication in one step, added up (none of it overlapped)."""
        return sum(d.seconds for d in self.dimensions)


def _best(collective: str, algorithms: tuple[str, ...], nbytes: int, cluster: Cluster,
          training: Training, dimension: str) -> tuple[float, str, int]:
    groups = training.groups(dimension)
    results = [simulate(collective, name, nbytes, cluster.network(), training.world, cluster.gamma,
                        groups=groups) for name in algorithms]
    best = min(results, key=lambda r: r.seconds)
    return best.seconds, best.algorithm, best.bytes_sent


def plan_step(training: Training, cluster: Cluster) -> StepPlan:
    """Simulate every dimension's traffic of one step of `training` on `cluster`."""
    if training.world > cluster.size:
        raise ValueError(f"dp·tp·pp = {training.world} GPUs but the cluster has {cluster.size}")
    t, m = training, training.micro_batches
    layers_per_stage = t.layers // t.pp
    dimensions = []
    if t.tp > 1:
        seconds, name, sent = _best("all_reduce", ("ring", "rabenseifner", "tree"), t.activation_bytes,
                                    cluster, t, "tp")
        calls = 4 * layers_per_stage * m
        dimensions.append(DimensionTime("tp", calls, t.activation_bytes, seconds, name, sent))
    if t.ep > 1:
        nbytes = t.activation_bytes * t.top_k // t.ep * t.ep
        seconds, name, sent = _best("all_to_all", ("pairwise",), nbytes, cluster, t, "ep")
        dimensions.append(DimensionTime("ep", 4 * (layers_per_stage // 2) * m, nbytes, seconds, name, sent))
    if t.dp > 1:
        gradient = int(t.params / (t.tp * t.pp)) * t.bytes_per_value
        seconds, name, sent = _best("all_reduce", ("ring", "rabenseifner"), gradient, cluster, t, "dp")
        dimensions.append(DimensionTime("dp", 1, gradient, seconds, name, sent))
    forward, backward = t.compute_seconds()
    # TP's all-reduces and EP's all-to-alls run inside every micro-batch's forward and backward (half
    # of each dimension's calls in either), on the pipeline's critical path: Megatron-LM waits for
    # them before the next layer. So a stage's work per micro-batch includes them
    inside = sum(d.seconds for d in dimensions if d.dimension in ("tp", "ep")) / m / 2
    pipeline = simulate_pipeline(t, cluster, forward + inside, backward + inside)
    if t.pp > 1:   # one "call": what the stage-to-stage sends add to the simulated step
        dimensions.append(DimensionTime("pp", 1, t.activation_bytes // t.tp, pipeline.send_seconds,
                                        "1F1B p2p", pipeline.bytes_sent))
    return StepPlan(t, dimensions, pipeline.seconds, pipeline.seconds_free_links,
                    m * (forward + backward + 2 * inside), m * (forward + backward))


def compare_placements(training: Training, cluster: Cluster,
                       placements: tuple[str, ...] = ("tp,dp,pp", "tp,pp,dp", "dp,pp,tp")) -> list[StepPlan]:
    """The same job placed several ways on the same cluster."""
    return [plan_step(replace(training, placement=p), cluster) for p in placements]
