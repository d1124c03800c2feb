"""What `colls train --strategy ep` reports (expert.py's loop): per step and MoE block the experts'
load, drops and aux loss beside a serial run's, the dispatch bytes measured beside those the routing
implies and those an even routing would give, the gradient all-reduces beside their ring formula,
and each rank's parameter memory; `format_lines`, `problems` and `plot` for the terminal, the exit
status and the --plot picture."""

from __future__ import annotations

import numpy as np

from . import functional as F
from .accounting import ring_all_reduce_bytes
from .common import RunResult, Setup, local_batch
from .expert import DISPATCHES_PER_BLOCK, routing_stats
from .layers import MoE
from .serial import Replica


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
