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
from .accounting import ring_all_reduce_bytes
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


def serial_routing(setup: Setup) -> list[np.ndarray]:
    """The serial reference run (as `train_serial`), keeping each step's routing_stats."""
    model = setup.build()
    replica = Replica(setup, model)
    stats = []
    for step in range(setup.steps):
        tokens, targets, scale = local_batch(setup, step, 0, 1)
        source = model.flat_source(replica.params)
        _, caches = model.forward(source, tokens, targets, scale)
        stats.append(routing_stats(model, caches))
        model.backward(source, model.flat_source(replica.grads), caches)
        replica.step()
    return stats


# -- the report ----------------------------------------------------------------------------------

def _block(row: list[float], experts: int) -> dict:
    """One MoE block's figures from a routing_stats row (summed over ranks)."""
    routed, kept = row[:experts], row[experts: 2 * experts]
    aux, groups = row[2 * experts], row[2 * experts + 1]
    assigned = sum(routed)
    return {"routed": [int(v) for v in routed], "load": [int(v) for v in kept],
            "dropped": int(assigned - sum(kept)), "assigned": int(assigned),
            "drop_fraction": (assigned - sum(kept)) / assigned if assigned else 0.0,
            "aux_loss": aux / groups if groups else 0.0}


def balanced_rows(result: RunResult, results: list[RunResult], step: int, cfg) -> float:
    """Rows a rank sends off-rank plus receives, per block, if every expert got its 1/E share of
    the assignments and none were dropped: k * (T_r (1 - E_r/E) + (T - T_r) E_r/E) for T_r tokens
    here, T in the ep group and E_r experts owned here (k * T_r * 2(ep-1)/ep when all is even)."""
    group = [r for r in results if r.extra["grid"][0] == result.extra["grid"][0]]
    tokens = result.extra["moe"][step]["rows"] * cfg.seq_len
    total = sum(r.extra["moe"][step]["rows"] for r in group) * cfg.seq_len
    share = (result.extra["owned"][1] - result.extra["owned"][0]) / cfg.experts
    return cfg.top_k * (tokens * (1 - share) + (total - tokens) * share)


def gradient_sync_formula(result: RunResult, setup: Setup) -> dict[str, float]:
    """Bytes a rank sends per step to sum gradients: a ring all-reduce of the replicated gradient
    over all n ranks, 2(n-1)/n * Psi_shared, plus one of its experts' gradient over the dp groups;
    `slack`: a ring's blocks are floor or ceil(count/n), one value off per step of each call."""
    values, per_value = result.extra["gradient_values"], result.extra["gradient_bytes_per_value"]
    n, dp = result.size, setup.dp
    return {"sent": ring_all_reduce_bytes(values["shared"], n, per_value)
            + ring_all_reduce_bytes(values["experts"], dp, per_value),
            "slack": 2 * ((n - 1) + (dp - 1)) * per_value}


def report(strategy: str, setup: Setup, results: list[RunResult]) -> dict:
    """Per step and MoE block: expert load, drops and aux loss beside the serial reference's; the
    dispatch bytes measured beside those the routing implies; replicas identical."""
    cfg = setup.model
    experts = cfg.experts
    serial = serial_routing(setup)
    first = results[0].extra
    steps = []
    for index, stat in enumerate(first["moe"]):
        blocks = [_block(row, experts) for row in stat["global"]]
        reference = [_block(row, experts) for row in serial[index].tolist()]
        measured, expected, balanced = [], [], []
        for result in results:
            record = result.steps[index].by_collective.get("all_to_all_v", {})
            measured.append(int(record.get("bytes_sent", 0)))
            # dispatch + backward send our rows off-rank; combine + backward return what we received;
            # every all_to_all_v first sends each peer its row count (one int64)
            off_rank = result.extra["moe"][index]["off_rank_rows"]
            headers = DISPATCHES_PER_BLOCK * len(off_rank) * (first["ep"] - 1) * 8
            implied = sum(2 * (sent + received) * row for sent, received, row in off_rank)
            expected.append(int(implied + headers))
            even = balanced_rows(result, results, index, cfg)
            balanced.append(int(sum(2 * even * row for _, _, row in off_rank) + headers))
        steps.append({"step": index, "seconds": max(r.steps[index].seconds for r in results),
                      "blocks": blocks, "serial": reference, "dispatch_bytes_sent": measured,
                      "dispatch_bytes_expected": expected, "dispatch_bytes_balanced": balanced,
                      "all_reduce_bytes_sent": [int(r.steps[index].by_collective.get("all_reduce", {})
                                                    .get("bytes_sent", 0)) for r in results]})
    replicas = [r.extra["replicated"] for r in results]
    capacity = F.expert_capacity(cfg.capacity_factor, cfg.seq_len, experts, cfg.top_k)
    # parameters held per rank: the replicated ones plus E_r of the E experts (Psi_expert each)
    moe = next(layer for layer in setup.build().layers if isinstance(layer, MoE))
    per_expert = sum(int(np.prod(shape)) for _, shape, _ in moe.expert_specs(1))
    all_experts = per_expert * experts * cfg.blocks
    memory = [{"rank": r.rank, "params_bytes": r.state_bytes["params"],
               "formula": (r.parameters - all_experts + per_expert * cfg.blocks
                           * (r.extra["owned"][1] - r.extra["owned"][0])) * setup.working_dtype.itemsize,
               "serial_bytes": r.parameters * setup.working_dtype.itemsize} for r in results]
    return {"experts": experts, "top_k": cfg.top_k, "capacity_factor": cfg.capacity_factor,
            "capacity_per_group": capacity, "groups": setup.batch, "aux_alpha": cfg.aux_alpha,
            "router": cfg.router, "ep": setup.ep, "dp": setup.dp, "algorithm": setup.algorithm,
            "owned": [r.extra["owned"] for r in results[: setup.ep]],
            "replicas_identical": all(r == replicas[0] for r in replicas), "memory": memory,
            "all_reduce_formula": [gradient_sync_formula(r, setup) for r in results], "steps": steps}


def format_lines(part: dict) -> list[str]:
    """The expert figures for the terminal."""
    owned = ", ".join(f"r{r}: {a}..{b - 1}" if b > a else f"r{r}: none"
                      for r, (a, b) in enumerate(part["owned"]))
    lines = [f"  MoE: E = {part['experts']} experts (owned {owned}), top-{part['top_k']}, "
             f"C = {part['capacity_factor']}: capacity {part['capacity_per_group']} per expert per group of "
             f"one sequence, {part['groups']} groups; router {part['router']}, α = {part['aux_alpha']}"]
    for row in part["steps"]:
        for b, (block, serial) in enumerate(zip(row["blocks"], row["serial"], strict=True)):
            lines.append(f"    step {row['step']:3d} moe{b}: load {block['load']} "
                         f"(routed {block['routed']}), "
                         f"dropped {block['dropped']}/{block['assigned']} = {block['drop_fraction']:.3f} "
                         f"(serial {serial['dropped']}), aux {block['aux_loss']:.6f} "
                         f"(serial {serial['aux_loss']:.6f})")
        sent = row["dispatch_bytes_sent"]
        lines.append(f"    step {row['step']:3d} all_to_all_v sent/rank {min(sent)}..{max(sent)} B "
                     f"(routing implies {min(row['dispatch_bytes_expected'])}.."
                     f"{max(row['dispatch_bytes_expected'])} B; balanced, no drops: "
                     f"{min(row['dispatch_bytes_balanced'])}..{max(row['dispatch_bytes_balanced'])} B)")
    formula = [f["sent"] for f in part["all_reduce_formula"]]
    for row in part["steps"]:
        sent = row["all_reduce_bytes_sent"]
        lines.append(f"    step {row['step']:3d} gradient all_reduce ({part['algorithm']}) sent/rank "
                     f"{min(sent)}..{max(sent)} B (ring formula {min(formula):.0f}..{max(formula):.0f} B)")
    held = [m["params_bytes"] for m in part["memory"]]
    expected = [m["formula"] for m in part["memory"]]
    lines.append(f"  parameters per rank {min(held)}..{max(held)} B (formula "
                 f"{min(expected)}..{max(expected)} B; whole model {part['memory'][0]['serial_bytes']} B)")
    lines.append(f"  replicated parameters identical on every rank: {part['replicas_identical']}")
    return lines


def problems(part: dict) -> list[str]:
    """Routing that differs from the serial reference, dispatch bytes off what the routing implies,
    replicas that differ, and (uniform router) an aux loss other than alpha."""
    found = []
    for row in part["steps"]:
        for b, (block, serial) in enumerate(zip(row["blocks"], row["serial"], strict=True)):
            if (block["load"], block["routed"]) != (serial["load"], serial["routed"]):
                found.append(f"step {row['step']} moe{b}: load {block['load']} routed {block['routed']}, "
                             f"serial {serial['load']} {serial['routed']}")
            if part["router"] == "uniform" and abs(block["aux_loss"] - part["aux_alpha"]) > 1e-12 * max(
                    1.0, part["aux_alpha"]):
                found.append(f"step {row['step']} moe{b}: uniform router but aux {block['aux_loss']!r} != "
                             f"α = {part['aux_alpha']}")
        if row["dispatch_bytes_sent"] != row["dispatch_bytes_expected"]:
            found.append(f"step {row['step']}: all_to_all_v sent {row['dispatch_bytes_sent']} B, routing "
                         f"implies {row['dispatch_bytes_expected']} B")
    for row in part["steps"]:
        for rank, sent in enumerate(row["all_reduce_bytes_sent"]):
            formula = part["all_reduce_formula"][rank]
            if part["algorithm"] == "ring" and abs(sent - formula["sent"]) > formula["slack"]:
                found.append(f"step {row['step']} rank {rank}: gradient all_reduce sent {sent} B, ring "
                             f"formula {formula['sent']:.0f} B ± {formula['slack']}")
    if not part["replicas_identical"]:
        found.append("replicated parameters differ between ranks")
    for entry in part["memory"]:
        if entry["params_bytes"] != entry["formula"]:
            found.append(f"rank {entry['rank']}: holds {entry['params_bytes']} B of parameters, formula "
                         f"{entry['formula']} B")
    return found


def plot(part: dict, path: str) -> None:
    """Expert load (kept tokens) over steps, one panel per MoE block; skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"  --plot {path}: matplotlib is not installed, no picture drawn (pip install matplotlib)")
        return
    steps = [row["step"] for row in part["steps"]]
    blocks = max(len(part["steps"][0]["blocks"]) if part["steps"] else 0, 1)
    figure, axes = plt.subplots(2, blocks, figsize=(5 * blocks, 6), squeeze=False, sharex=True,
                                gridspec_kw={"height_ratios": [3, 1]})
    for b in range(len(part["steps"][0]["blocks"]) if part["steps"] else 0):
        load, drops = axes[0][b], axes[1][b]
        for e in range(part["experts"]):
            load.plot(steps, [row["blocks"][b]["load"][e] for row in part["steps"]], marker="o",
                      label=f"expert {e}")
        load.axhline(part["capacity_per_group"] * part["groups"], linestyle="--", color="grey",
                     label="capacity × groups")
        load.set_title(f"moe{b}: tokens kept per expert (ep {part['ep']}, C = {part['capacity_factor']})")
        load.legend(fontsize="small")
        drops.plot(steps, [row["blocks"][b]["drop_fraction"] for row in part["steps"]], marker="o",
                   color="black", label="ep")
        drops.plot(steps, [row["serial"][b]["drop_fraction"] for row in part["steps"]], linestyle=":",
                   color="red", label="serial")
        drops.set_ylabel("drop fraction")
        drops.set_xlabel("step")
        drops.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


__all__ = ["ExpertParallelMoE", "all_reduce_ranges", "expert_parallel_layers", "expert_ranges", "gather",
           "off_rank_rows", "owned_experts", "replicated_ranges", "report", "routing_stats", "shard", "train",
           "world_size"]
