"""`pp_ep` and `3d`: the pipeline of pipeline.py with expert or tensor parallelism inside each stage.

The ranks form a grid, PP outermost, then DP, then the innermost tp or ep ranks on consecutive
ranks (Megatron-LM's order: TP needs the fastest links, so it stays inside a server; Narayanan et
al. 2021): rank = (stage · dp + dp_rank) · inner + inner_rank, e.g. 8 ranks as PP 2 × DP 2 × TP 2.
Every group is a `split` of the world: one pipeline (same dp and inner place, every stage) carries
the activations; inside a stage the inner group runs the tensor- or expert-parallel layers, and
after the pipeline flush the gradients of what is replicated are summed over the stage's
data-parallel ranks.

- `pp_ep`: every MLP an MoE block whose experts are spread over the ep ranks of the stage
  (expert.py); the ep ranks are data parallel for everything else, so a stage's dp × ep ranks
  each take their own rows; replicated gradients are summed over those dp · ep ranks, an expert's
  over the dp ranks that hold it.
- `3d`: DP × TP × PP; attention and MLP are tensor.py's Megatron column/row-parallel layers over
  the tp ranks of the stage (Shoeybi et al. 2019: f = identity forward / all-reduce backward, g =
  all-reduce forward / identity backward; 2 + 2 all-reduces per block); the tp ranks see the same
  rows and compute the replicated parts alike, and every gradient is summed over dp.

The schedule is 1F1B (interleaved with --chunks > 1).
"""

from __future__ import annotations

import numpy as np

from . import pipeline, tensor
from .common import RunResult, Setup
from .expert import all_reduce_ranges, expert_parallel_layers, expert_ranges, replicated_ranges, shard
from .layers import MoE
from .model import Model
from .tensor import tensor_parallel


class ExpertStages(pipeline.Replicated):
    """A stage's MoE blocks expert parallel over `ep_comm`; replicated parts summed over the stage's
    dp · ep ranks (`data_comm`), experts over the dp ranks holding them (`expert_dp_comm`)."""

    def __init__(self, ep_comm, data_comm, expert_dp_comm, data_rank: int, data_size: int,
                 expert_writer: bool) -> None:
        super().__init__(data_comm, data_rank, data_size)
        self.ep_comm, self.expert_dp_comm, self.expert_writer = ep_comm, expert_dp_comm, expert_writer
        self.comms = [c for c in (ep_comm, data_comm, expert_dp_comm) if c is not None]

    def layers(self, layers: list) -> list:
        return expert_parallel_layers(layers, self.ep_comm)

    def load(self, full: Model, full_flat: np.ndarray, local: Model, out: np.ndarray, layer_map: list[int]):
        shard(full, full_flat, local, out, layer_map)

    def shared(self, local: Model, params: np.ndarray) -> np.ndarray:
        return np.concatenate([params[a:b] for a, b in replicated_ranges(local)])

    def sync(self, local: Model, grads: np.ndarray) -> None:
        all_reduce_ranges(self.data_comm, grads, replicated_ranges(local))
        all_reduce_ranges(self.expert_dp_comm, grads, expert_ranges(local))

    def store(self, full: Model, local: Model, local_flat: np.ndarray, flat: np.ndarray,
              layer_map: list[int]) -> None:
        """Rank (dp 0, ep 0) of a stage writes the replicated tensors, dp 0 its own experts."""
        for index, (layer, full_index) in enumerate(zip(local.layers, layer_map, strict=True)):
            target = full.layout.views(flat, full_index)
            for name, view in local.layout.views(local_flat, index).items():
                if isinstance(layer, MoE) and name in MoE.EXPERT_TENSORS:
                    if self.expert_writer:
                        target[name][layer.owned] = view
                elif self.data_rank == 0:
                    target[name][...] = view


def expert_plan(comm, setup: Setup, stage: int, position: int) -> ExpertStages:
    """The groups of a PP × DP × EP grid (collective over `comm`: every rank makes every split)."""
    dp, ep = setup.dp, setup.ep
    dp_rank, ep_rank = divmod(position, ep)
    ep_comm = comm.split(stage * dp + dp_rank, ep_rank)
    data_comm = comm.split(stage, position) if dp * ep > 1 else None
    expert_dp_comm = comm.split(stage * ep + ep_rank, dp_rank) if dp > 1 else None
    return ExpertStages(ep_comm, data_comm, expert_dp_comm, position, dp * ep, expert_writer=dp_rank == 0)


def schedule_of(setup: Setup) -> str:
    """1F1B, or interleaved 1F1B with --chunks > 1."""
    return "interleaved" if setup.chunks > 1 else "1f1b"


def train_pp_ep(comm, setup: Setup) -> RunResult:
    """PP × DP × EP: an MoE model whose experts are spread over each stage's ep ranks."""
    if setup.model.experts < 1:
        raise ValueError("pp_ep needs an MoE model: pass --experts E (E >= 1)")
    if setup.tp > 1:
        raise ValueError("pp_ep is PP × DP × EP; --tp belongs to 3d")
    result = pipeline.run_pipeline(comm, setup, schedule_of(setup), setup.ep, expert_plan)
    result.strategy = "pp_ep"
    return result


def train_3d(comm, setup: Setup) -> RunResult:
    """DP × TP × PP: Megatron tensor-parallel layers in every stage of the pipeline."""
    if setup.ep > 1:
        raise ValueError("3d is PP × DP × TP; --ep belongs to pp_ep")
    plan = tensor_plan if setup.tp > 1 else pipeline.data_parallel_plan
    result = pipeline.run_pipeline(comm, setup, schedule_of(setup), setup.tp, plan)
    result.strategy = "3d"
    return result


def train(comm, setup: Setup) -> RunResult:
    """pp_ep when --ep > 1 or the model has experts, else 3d."""
    return train_pp_ep(comm, setup) if setup.ep > 1 else train_3d(comm, setup)


def coordinates(rank: int, setup: Setup, strategy: str) -> tuple[int, int, int]:
    """(stage, dp rank, tp or ep rank) of `rank`: rank = (stage · dp + dp_rank) · inner + inner_rank."""
    inner = setup.ep if strategy == "pp_ep" else setup.tp
    stage, position = divmod(rank, setup.dp * inner)
    return (stage, *divmod(position, inner))


def world_size(strategy: str, setup: Setup) -> int:
    """pp × dp × (tp or ep) ranks (ValueError before anything starts if the setup cannot run)."""
    inner = setup.ep if strategy == "pp_ep" else setup.tp
    if strategy == "pp_ep" and setup.model.experts < 1:
        raise ValueError("pp_ep needs an MoE model: pass --experts E (E >= 1)")
    pipeline.check_setup(schedule_of(setup), setup, setup.pp * setup.dp * inner, inner)
    if strategy != "pp_ep":
        tensor.check_split(setup)
    return setup.pp * setup.dp * inner


# -- tensor parallelism inside a stage (tensor.py's Megatron-LM layers) ----------------------------

def cut_of(layer, name: str):
    """(axis, slice) of the serial tensor `name` that this tp rank holds, or None if replicated."""
    return getattr(layer, "sharded", {}).get(name)


def sharded_view(layer, name: str, full: np.ndarray) -> np.ndarray:
    """This rank's part of the serial tensor `full` (a view; all of it if `name` is replicated)."""
    cut = cut_of(layer, name)
    if cut is None:
        return full
    index = [slice(None)] * full.ndim
    index[cut[0]] = cut[1]
    return full[tuple(index)]


class TensorStages(pipeline.Replicated):
    """A stage's attention and MLP cut over `tp_comm`; every gradient summed over the dp ranks
    holding the same cut (`data_comm`); replicated gradients are equal on the tp ranks already."""

    def __init__(self, tp_comm, data_comm, dp_rank: int, dp: int) -> None:
        super().__init__(data_comm, dp_rank, dp)
        self.tp_comm = tp_comm
        self.counts_loss = tp_comm.rank == 0   # the tp ranks compute the same loss
        self.comms = [c for c in (tp_comm, data_comm) if c is not None]
        self._ranges: tuple[list, list] | None = None   # (replicated, cut) ranges of the flat gradient

    def sync(self, local: Model, grads: np.ndarray) -> None:
        """Sum over the dp ranks holding this cut: the replicated tensors and the cut ones in two
        all-reduces, so that the replicated part is cut in the same blocks on every tp rank (and so
        stays bitwise identical across them) when uneven cuts give the tp ranks buffers of different
        sizes, as `tensor.sync_gradients` does. (One all-reduce of the whole buffer summed three dp
        ranks' replicated gradients in a different order on each tp rank: found by review.)"""
        if self.data_comm is None or self.data_comm.size == 1:
            return
        if self._ranges is None:
            parts: tuple[list, list] = ([], [])
            for _, layer, name, view in self._pairs(local, np.arange(grads.size)):
                if view.size:
                    positions = view.reshape(-1)
                    parts[cut_of(layer, name) is not None].append((int(positions[0]), int(positions[-1]) + 1))
            self._ranges = parts
        for ranges in self._ranges:
            all_reduce_ranges(self.data_comm, grads, ranges)

    def layers(self, layers: list) -> list:
        return [tensor_parallel(layer, self.tp_comm) for layer in layers]

    def figures(self, local: Model) -> dict:
        """All-reduces on the tp group this step, beside Megatron's 2 per cut layer and micro-batch
        (g forward, f backward): 2 · layers · m."""
        calls = int(self.tp_comm.stats().get("all_reduce", {}).get("calls", 0))
        cut = sum(hasattr(layer, "sharded") for layer in local.layers)
        return {"tp_all_reduces": calls, "tp_all_reduces_per_micro_batch_formula": 2 * cut}

    def _pairs(self, local: Model, flat: np.ndarray):
        """(local layer index, layer, tensor name, view) for every tensor of `flat`."""
        for index, layer in enumerate(local.layers):
            for name, view in local.layout.views(flat, index).items():
                yield index, layer, name, view

    def load(self, full: Model, full_flat: np.ndarray, local: Model, out: np.ndarray, layer_map: list[int]):
        for index, layer, name, view in self._pairs(local, out):
            view[...] = sharded_view(layer, name, full.layout.views(full_flat, layer_map[index])[name])

    def shared(self, local: Model, params: np.ndarray) -> np.ndarray:
        return np.concatenate([view.reshape(-1) for _, layer, name, view in self._pairs(local, params)
                               if cut_of(layer, name) is None])

    def store(self, full: Model, local: Model, local_flat: np.ndarray, flat: np.ndarray,
              layer_map: list[int]) -> None:
        """dp rank 0 writes its cut of the sharded tensors; (dp 0, tp 0) the replicated ones."""
        if self.data_rank != 0:
            return
        for index, layer, name, view in self._pairs(local, local_flat):
            if cut_of(layer, name) is not None or self.tp_comm.rank == 0:
                sharded_view(layer, name, full.layout.views(flat, layer_map[index])[name])[...] = view


def tensor_plan(comm, setup: Setup, stage: int, position: int) -> TensorStages:
    """The groups of a PP × DP × TP grid (collective over `comm`: every rank makes every split)."""
    dp, tp = setup.dp, setup.tp
    dp_rank, tp_rank = divmod(position, tp)
    tp_comm = comm.split(stage * dp + dp_rank, tp_rank)          # consecutive ranks
    data_comm = comm.split(stage * tp + tp_rank, dp_rank) if dp > 1 else None
    return TensorStages(tp_comm, data_comm, dp_rank, dp)
