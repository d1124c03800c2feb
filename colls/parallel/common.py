"""What every training loop shares: the run's settings, a rank's slice of the batch, per-step records.

Every loop trains the same model on the same global batches; rank r takes its rows of batch `step`
and scales its loss by 1 / (tokens in the *global* batch), so the SUM of the ranks' gradients is
the serial gradient of the mean loss and data parallelism reproduces serial training up to the
order of additions.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .data import global_batch, shard_rows
from .model import Model, ModelConfig
from .optim import make_optimizer
from .placement import array_module, to_device

DATA_PARALLEL = ("serial", "ps", "ddp", "zero1", "zero2", "zero3")
# model-parallel strategies -> the module of colls.parallel that implements them: each provides
# train(comm, setup) -> RunResult, and <module>_report beside it report/format_lines/problems/plot
# (see train.py)
MODEL_PARALLEL = {"gpipe": "pipeline", "1f1b": "pipeline", "interleaved": "pipeline", "tp": "tensor",
                  "ep": "expert", "dp_tp": "tensor", "pp_ep": "hybrid", "3d": "hybrid"}
STRATEGIES = DATA_PARALLEL + tuple(MODEL_PARALLEL)


@dataclass(frozen=True)
class Setup:
    """One training run: model, task, optimizer, precision and each strategy's knobs."""

    model: ModelConfig = ModelConfig()
    steps: int = 4
    batch: int = 12
    seed: int = 0
    optimizer: str = "adam"
    lr: float | None = None
    dtype: str = "float64"          # compute dtype: float64 or float32
    mixed: bool = False             # float16 working params/grads + float32 master weights
    micro_steps: int = 1            # DDP gradient accumulation: micro-batches per step
    bucket_bytes: int = 25 * 2**20  # DDP bucket cap (25 MB as in PyTorch DDP)
    first_bucket_bytes: int = 2**20  # DDP's first (last-layer) bucket is small: 1 MB
    algorithm: str = "ring"         # all_reduce algorithm for ddp (any of colls.algorithms("all_reduce"))
    # model parallelism (issue 7): grid sizes (TP innermost, then DP, PP outermost, as Megatron)
    dp: int = 1                     # data-parallel replicas
    tp: int = 1                     # tensor-parallel ranks per layer
    pp: int = 1                     # pipeline stages
    ep: int = 1                     # expert-parallel ranks (experts spread over them)
    micro_batches: int = 4          # pipeline: micro-batches per mini-batch (m)
    chunks: int = 1                 # interleaved pipeline: model chunks per rank (v)
    device: str = "cpu"             # "cuda": parameters, batches and collectives on cupy (ranks over
                                    # the cuda_ipc transport)
    stage_seconds: float = 0.0      # pipeline: sleep added to every stage's micro-batch forward (backward
                                    # twice that), so stage costs are equal and dominate (bubble checks)

    @property
    def compute_dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.mixed else self.dtype)

    @property
    def working_dtype(self) -> np.dtype:
        """Dtype of the parameter and gradient buffers that collectives move."""
        return np.dtype(np.float16) if self.mixed else self.compute_dtype

    @property
    def state_dtype(self) -> np.dtype:
        return np.dtype(np.float32) if self.mixed else self.compute_dtype

    def build(self, align: int = 1) -> Model:
        """The model, its flat buffers padded to multiples of `align`."""
        return Model(self.model, self.compute_dtype, align, device=self.device)

    def optimizer_for(self, size: int):
        """A fresh optimizer over `size` elements in the state dtype."""
        return make_optimizer(self.optimizer, size, self.lr, self.state_dtype, array_module(self.device))

    def initial_params(self, model: Model) -> np.ndarray:
        """The initial flat parameters (in float64 draws, cast), identical on every rank."""
        return model.init_params(self.seed, self.working_dtype)


def local_batch(setup: Setup, step: int, rank: int, size: int):
    """(tokens, targets, scale): this rank's rows of global batch `step`, loss scale 1/global tokens."""
    cfg = setup.model
    tokens, targets = global_batch(setup.seed, step, setup.batch, cfg.seq_len, cfg.vocab)
    rows = shard_rows(setup.batch, size, rank)
    return to_device(tokens[rows], setup.device), to_device(targets[rows], setup.device), 1.0 / targets.size


def micro_batches(tokens: np.ndarray, targets: np.ndarray, count: int):
    """Split a rank's rows into `count` micro-batches (some may be empty when rows < count)."""
    return [(tokens[s], targets[s]) for s in (shard_rows(len(tokens), count, i) for i in range(count))]


@dataclass
class StepRecord:
    """One step on one rank: global loss, seconds, bytes this rank sent/received per collective."""

    step: int
    loss: float
    seconds: float
    bytes_sent: int
    bytes_received: int
    by_collective: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class RunResult:
    """What one rank reports after training."""

    strategy: str
    rank: int
    size: int
    parameters: int                       # Psi
    steps: list[StepRecord]
    state_bytes: dict[str, int]           # bytes held between steps: params, grads, optimizer
    peak_transient_bytes: int             # largest buffer gathered/allocated inside a step
    params: np.ndarray                    # final parameters, unpadded, full (gathered for zero3)
    replicated: bool = True               # whether `params` is this rank's own replica
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """A JSON-ready dict (without the parameter vector)."""
        out = asdict(self)
        out.pop("params")
        return out


def traffic(comm, since: dict | None = None) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(bytes sent, bytes received, per collective) from `comm.stats()` (counters reset per step)."""
    per = {name: {"calls": int(s["calls"]), "bytes_sent": int(s["bytes_sent"]),
                  "bytes_received": int(s["bytes_received"])} for name, s in comm.stats().items()}
    return (sum(p["bytes_sent"] for p in per.values()), sum(p["bytes_received"] for p in per.values()), per)


def merge_traffic(record: StepRecord, groups: list) -> StepRecord:
    """Add the sub-communicators' traffic (pipeline sends, tensor/expert/data-parallel collectives)
    to a step record of the world communicator."""
    for sub in groups:
        sent, received, per = traffic(sub)
        record.bytes_sent += sent
        record.bytes_received += received
        for name, counts in per.items():
            mine = record.by_collective.setdefault(name, {"calls": 0, "bytes_sent": 0, "bytes_received": 0})
            for key, value in counts.items():
                mine[key] += value
    return record


class StepTimer:
    """Times a step and closes it with a record: traffic read *before* the loss is all-reduced, so
    the one-scalar loss report is not counted as training traffic."""

    def __init__(self, comm) -> None:
        self.comm = comm
        comm.reset_stats()
        self.start = time.perf_counter()

    def finish(self, step: int, local_loss: float) -> StepRecord:
        seconds = time.perf_counter() - self.start
        sent, received, per = traffic(self.comm)
        loss = float(self.comm.all_reduce(np.array([local_loss]))[0]) if self.comm.size > 1 else local_loss
        return StepRecord(step, loss, seconds, sent, received, per)


def nbytes(*arrays: np.ndarray) -> int:
    """Total bytes of `arrays`."""
    return int(sum(a.nbytes for a in arrays))
