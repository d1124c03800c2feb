"""`ep`: expert parallelism, a mixture-of-experts model with its experts spread over the ranks.

After GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021): every MLP is an
MoE block (`layers.MoE`); its E experts are cut in contiguous blocks over the `ep` ranks (rank r
owns experts `owned_experts(E, ep, r)`, uneven when ep does not divide E; a rank may own none).
Everything else (embedding, attention, the MoE blocks' layer norm and router, head) is replicated
and trained data parallel: each rank routes its own rows of the global batch, and after backward
the replicated gradients are all-reduced. Per MoE block and (micro-)batch:

    forward   route locally -> all_gather the kept counts per (rank, expert) -> all_to_all_v the
              token rows to their experts' owners (dispatch) -> the owner runs its experts ->
              all_to_all_v the outputs back (combine) -> each output lands on its original token
    backward  all_to_all_v the output gradients to the owners -> expert backward there (the
              expert's gradient is complete on its owner: it saw every token routed to it) ->
              all_to_all_v the input gradients back -> router and layer-norm backward locally

Routing groups are the batch's rows (one sequence each): capacity ceil(C * T / E) * k and the
load-balancing loss are per group, so the serial model routes every token exactly as this does.
With `--dp D` the world is a D x ep grid (ep innermost): experts are replicated over the D groups
and their gradients all-reduced over them.

API for composing strategies (the pipeline's pp_ep uses these with its own ep sub-communicator):

    expert_parallel_layers(layers, ep_comm) -> layers   every MoE replaced by an ExpertParallelMoE
    ExpertParallelMoE.of(moe, ep_comm)                  a layer with forward(p, x, scale) / backward
                                                        like layers.py; collective over ep_comm, so
                                                        every ep rank runs each MoE forward/backward
    Model(config, dtype, layers=local_layers)           the rank's local model (its own flat layout)
    shard(full, full_flat, local, out, layer_map=None)  the rank's parameters out of the serial ones
                                                        (layer_map[i]: full index of local layer i,
                                                        for a stage holding some of the layers)
    gather(comm, full, local, local_flat, replicated=, experts=, layer_map=None) -> full flat buffer:
                                                        writers put theirs into zeros, all-reduce
    replicated_ranges(local), expert_ranges(local)      element ranges of the local flat buffer
    all_reduce_ranges(comm, buffer, ranges, algorithm)  sum those ranges over comm, in one call
    routing_stats(model, caches), off_rank_rows(model, caches)   per MoE block, for the report

A pipeline stage that runs layers itself must call an MoE block as `forward(p, x, scale)` (its
`adds_loss` is True), add `cache.loss` to the stage's loss, and run each micro-batch's MoE forward
and backward on every rank of the ep group in the same order (they are collectives). A rank with
no rows in a micro-batch still takes part.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from . import functional as F
from .common import RunResult, Setup, StepTimer, local_batch, merge_traffic
from .data import shard_rows
from .layers import MoE, Routing
from .model import Model
from .placement import to_host
from .serial import Replica

DISPATCHES_PER_BLOCK = 4   # all_to_all_v per MoE block and step: dispatch, combine, and their backward


def owned_experts(experts: int, size: int, rank: int) -> slice:
    """The experts rank `rank` of `size` owns: a contiguous block, as even as possible."""
    return shard_rows(experts, size, rank)


@dataclass(frozen=True, eq=False)
class ExpertParallelMoE(MoE):
    """An MoE block whose experts live on the ranks of `comm`; this rank holds `owned` of them."""

    comm: object = field(default=None, repr=False)

    @classmethod
    def of(cls, moe: MoE, comm) -> ExpertParallelMoE:
        """The expert-parallel version of `moe` over the ranks of `comm`."""
        return cls(**{f.name: getattr(moe, f.name) for f in fields(MoE)}, comm=comm)

    @property
    def owned(self) -> slice:
        return owned_experts(self.experts, self.comm.size, self.comm.rank)

    @property
    def specs(self):
        return self.shared_specs + self.expert_specs(self.owned.stop - self.owned.start)

    def experts_forward(self, p, rows: np.ndarray, routing: Routing):
        """Dispatch `rows` (sorted by expert) to the experts' owners, run ours, combine them back."""
        comm, size = self.comm, self.comm.size
        # everyone learns how many rows each rank sends each expert (E int64 per rank)
        table = comm.all_gather(routing.kept.astype(np.int64).reshape(1, -1))
        send_counts = [int(table[comm.rank, owned_experts(self.experts, size, q)].sum()) for q in range(size)]
        arriving = table[:, self.owned]                  # (source rank, our expert) -> rows
        received, recv_counts = comm.all_to_all_v(rows, send_counts)
        order = expert_major(arriving)                   # arrival order is by source, then expert
        out_sorted, cache = F.experts_forward(p["w1"], p["b1"], p["w2"], p["b2"], received[order],
                                              arriving.sum(axis=0))
        out = np.empty_like(out_sorted)
        out[order] = out_sorted
        # each source gets its rows back in the order it sent them: its kept assignments' order
        combined, _ = comm.all_to_all_v(out, recv_counts)
        return combined, (cache, order, send_counts, recv_counts, rows.itemsize * rows.shape[1])

    def experts_backward(self, p, g, cache, dout: np.ndarray) -> np.ndarray:
        """The backward of dispatch and combine are the same two all-to-alls, reversed."""
        expert_cache, order, send_counts, recv_counts, _ = cache
        arrived, _ = self.comm.all_to_all_v(dout, send_counts)
        drows_sorted = F.experts_backward(arrived[order], expert_cache, p["w1"], p["w2"], g)
        drows = np.empty_like(drows_sorted)
        drows[order] = drows_sorted
        returned, _ = self.comm.all_to_all_v(drows, recv_counts)
        return returned


def expert_major(counts: np.ndarray) -> np.ndarray:
    """Rows laid out source by source, expert by expert (`counts[s, e]` each), reordered expert by
    expert, source by source: the index array that gathers them so."""
    flat = counts.reshape(-1)
    starts = (np.cumsum(flat) - flat).reshape(counts.shape)
    pieces = [np.arange(starts[s, e], starts[s, e] + counts[s, e])
              for e in range(counts.shape[1]) for s in range(counts.shape[0])]
    return np.concatenate([np.zeros(0, np.int64), *pieces]).astype(np.int64)


def expert_parallel_layers(layers: list, comm) -> list:
    """`layers` with every MoE block made expert parallel over `comm`."""
    return [ExpertParallelMoE.of(layer, comm) if isinstance(layer, MoE) else layer for layer in layers]


def _is_expert(layer, name: str) -> bool:
    return isinstance(layer, MoE) and name in MoE.EXPERT_TENSORS


def _owned(layer: MoE) -> slice:
    """The experts a block holds here: its share if expert parallel, else all of them."""
    return layer.owned if isinstance(layer, ExpertParallelMoE) else slice(0, layer.experts)


def shard(full: Model, full_flat: np.ndarray, local: Model, out: np.ndarray,
          layer_map: list[int] | None = None) -> np.ndarray:
    """Copy this rank's parameters from the serial buffer `full_flat` into `out` (local layout);
    `layer_map[i]` is the full model's index of local layer i (default: the same)."""
    for index, layer in enumerate(local.layers):
        source = full.layout.views(full_flat, index if layer_map is None else layer_map[index])
        for name, view in local.layout.views(out, index).items():
            view[...] = source[name][_owned(layer)] if _is_expert(layer, name) else source[name]
    return out


def gather(comm, full: Model, local: Model, local_flat: np.ndarray, replicated: bool, experts: bool,
           layer_map: list[int] | None = None) -> np.ndarray:
    """The full parameters on every rank of `comm`: each rank writes its experts (if `experts`) and
    the replicated tensors (if `replicated`: one rank) into zeros, and an all-reduce sums them
    (exact: every element has one writer). Collective over `comm`."""
    flat = np.zeros_like(local_flat, shape=full.layout.total)   # on the parameters' device
    for index, layer in enumerate(local.layers):
        target = full.layout.views(flat, index if layer_map is None else layer_map[index])
        for name, view in local.layout.views(local_flat, index).items():
            if _is_expert(layer, name):
                if experts:
                    target[name][_owned(layer)] = view
            elif replicated:
                target[name][...] = view
    return comm.all_reduce(flat, out=flat) if comm.size > 1 else flat


def _ranges(local: Model, want_experts: bool) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for layer, segment in zip(local.layers, local.layout.segments, strict=True):
        for name, offset, shape in segment.tensors:
            if _is_expert(layer, name) != want_experts:
                continue
            start, stop = segment.start + offset, segment.start + offset + int(np.prod(shape))
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], stop)
            else:
                ranges.append((start, stop))
    return ranges


def replicated_ranges(local: Model) -> list[tuple[int, int]]:
    """(start, stop) element ranges of the local flat buffer that every ep rank holds alike."""
    return _ranges(local, want_experts=False)


def expert_ranges(local: Model) -> list[tuple[int, int]]:
    """(start, stop) element ranges of the local flat buffer holding this rank's experts."""
    return _ranges(local, want_experts=True)


def all_reduce_ranges(comm, buffer: np.ndarray, ranges: list[tuple[int, int]],
                      algorithm: str | None = None) -> None:
    """Sum `buffer[start:stop]` over `comm` for every range, packed into one all-reduce."""
    if comm is None or comm.size == 1 or not ranges:
        return
    packed = np.concatenate([buffer[a:b] for a, b in ranges])
    comm.all_reduce(packed, out=packed, algorithm=algorithm)
    offset = 0
    for a, b in ranges:
        buffer[a:b] = packed[offset: offset + b - a]
        offset += b - a


def routing_stats(model: Model, caches: list) -> np.ndarray:
    """One row per MoE block: routed per expert (E), kept per expert (E), the aux loss summed over
    groups, and the groups; summed over ranks, the serial run's rows."""
    rows = [np.concatenate([c.routing.routed, c.routing.kept, [c.routing.aux, c.routing.probs.shape[0]]])
            for layer, c in zip(model.layers, caches, strict=False) if isinstance(layer, MoE)]
    return np.array(rows, np.float64).reshape(len(rows), -1)


def off_rank_rows(model: Model, caches: list) -> list[tuple[int, int, int]]:
    """Per expert-parallel block: the rows this rank dispatched to other ranks, the rows it
    received from them, and the bytes of a row."""
    found = []
    for layer, c in zip(model.layers, caches, strict=False):
        if isinstance(layer, ExpertParallelMoE):
            _, _, send_counts, recv_counts, row_bytes = c.expert_cache
            rank = layer.comm.rank
            found.append((sum(send_counts) - send_counts[rank], sum(recv_counts) - recv_counts[rank],
                          row_bytes))
    return found


# -- the loop ------------------------------------------------------------------------------------

def world_size(strategy: str, setup: Setup) -> int:
    """dp x ep ranks (ValueError before anything starts if the setup has no experts)."""
    check_setup(setup, setup.dp * setup.ep)
    return setup.dp * setup.ep


def check_setup(setup: Setup, size: int) -> None:
    """Errors a user can act on, before any collective."""
    if setup.model.experts < 1:
        raise ValueError("strategy ep needs an MoE model: pass --experts E (E >= 1)")
    if size != setup.dp * setup.ep:
        raise ValueError(f"strategy ep with --dp {setup.dp} --ep {setup.ep} needs {setup.dp * setup.ep} "
                         f"ranks, got {size}")


def train(comm, setup: Setup) -> RunResult:
    """Train the MoE model with experts spread over ep ranks (and replicated over dp groups)."""
    check_setup(setup, comm.size)
    ep, dp = setup.ep, setup.dp
    grid_dp, grid_ep = divmod(comm.rank, ep)           # ep innermost: a group is consecutive ranks
    ep_comm = comm.split(grid_dp, grid_ep) if dp > 1 else comm
    dp_comm = comm.split(grid_ep, grid_dp) if dp > 1 else None
    full = setup.build()
    local = Model(setup.model, setup.compute_dtype, layers=expert_parallel_layers(full.layers, ep_comm),
                  device=setup.device)
    replica = Replica(setup, local)
    shard(full, setup.initial_params(full), local, replica.params)
    if replica.master is not None:
        replica.master[...] = replica.params
    shared, own = replicated_ranges(local), expert_ranges(local)
    records, stats = [], []
    groups = [sub for sub in (ep_comm, dp_comm) if sub is not None and sub is not comm]
    for step in range(setup.steps):
        timer = StepTimer(comm)
        for sub in groups:
            sub.reset_stats()
        tokens, targets, scale = local_batch(setup, step, comm.rank, comm.size)
        source = local.flat_source(replica.params)
        loss, caches = local.forward(source, tokens, targets, scale)
        mine, off_rank = routing_stats(local, caches), off_rank_rows(local, caches)
        local.backward(source, local.flat_source(replica.grads), caches)
        all_reduce_ranges(comm, replica.grads, shared, setup.algorithm)   # data parallel, every rank
        all_reduce_ranges(dp_comm, replica.grads, own, setup.algorithm)   # our experts' dp replicas
        replica.step()
        records.append(merge_traffic(timer.finish(step, loss), groups))
        total = comm.all_reduce(mine) if comm.size > 1 else mine
        stats.append({"global": total.tolist(), "off_rank_rows": off_rank, "rows": len(tokens)})
    final = gather(comm, full, local, replica.params, replicated=comm.rank == 0, experts=grid_dp == 0)
    owned = owned_experts(setup.model.experts, ep, grid_ep)
    extra = {"dp": dp, "ep": ep, "grid": (grid_dp, grid_ep), "owned": (owned.start, owned.stop),
             "replicated": np.concatenate([replica.params[a:b] for a, b in shared]).tolist(),
             "moe": stats, "gradient_values": {"shared": sum(b - a for a, b in shared),
                                               "experts": sum(b - a for a, b in own)},
             "gradient_bytes_per_value": replica.grads.itemsize}
    return RunResult("ep", comm.rank, comm.size, full.layout.parameters, records, replica.state_bytes(), 0,
                     to_host(full.layout.pack(final)).astype(np.float64), extra=extra)


__all__ = ["ExpertParallelMoE", "all_reduce_ranges", "expert_parallel_layers", "expert_ranges", "gather",
           "off_rank_rows", "owned_experts", "replicated_ranges", "routing_stats", "shard", "train",
           "world_size"]
