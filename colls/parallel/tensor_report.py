"""What `colls train --strategy tp|dp_tp` reports (tensor.py's loop): each phase's measured
all-reduce bytes beside Megatron's formula (2 all-reduces forward and 2 backward per layer, a ring's
bytes each) and the data-parallel gradient sync beside its own; replicated parameters identical on
every rank; `format_lines` and `problems` for the terminal and the exit status."""

from __future__ import annotations

from .common import RunResult, Setup
from .tensor import ring_sent_bytes


def tp_formula(setup: Setup, rows: int, tp_rank: int) -> dict[str, int]:
    """One phase (forward or backward) of one step on one TP rank: 2 all-reduces per transformer layer
    (attention + MLP) of rows·T·d values, each sending ring_sent_bytes (2(t-1)/t of it if t divides)."""
    cfg = setup.model
    count = rows * cfg.seq_len * cfg.d_model
    calls = 2 * cfg.blocks if rows else 0
    return {"calls": calls, "bytes_sent": calls * ring_sent_bytes(count, setup.tp, tp_rank,
                                                                  setup.compute_dtype.itemsize),
            "values_per_all_reduce": count}


def dp_formula(setup: Setup, result: RunResult) -> dict[str, int]:
    """The DP gradient sync of one step on one rank: the replicated and the sharded part, one ring each."""
    if setup.dp == 1:
        return {"calls": 0, "bytes_sent": 0}
    replicated = result.extra["replicated_parameters"]
    sharded = result.extra["local_parameters"] - replicated
    itemsize, i = setup.working_dtype.itemsize, result.extra["dp_index"]
    return {"calls": 2, "bytes_sent": ring_sent_bytes(replicated, setup.dp, i, itemsize)
            + ring_sent_bytes(sharded, setup.dp, i, itemsize)}


def report(strategy: str, setup: Setup, results: list[RunResult]) -> dict:
    """Per step and rank: TP all-reduces forward/backward and DP sync, measured and by formula."""
    steps = []
    for index in range(len(results[0].steps)):
        ranks = []
        for r in results:
            phase = r.extra["phases"][index]
            rows, tp_rank = phase["rows"], r.extra["tp_index"]
            ranks.append({"rank": r.rank, "rows": rows,
                          **{name: {"measured": {k: phase[name][k] for k in ("calls", "bytes_sent")},
                                    "formula": tp_formula(setup, rows, tp_rank)}
                             for name in ("forward", "backward")},
                          "dp": {"measured": {k: phase["dp"][k] for k in ("calls", "bytes_sent")},
                                 "formula": dp_formula(setup, r)}})
        steps.append({"step": index, "seconds": max(r.steps[index].seconds for r in results), "ranks": ranks})
    first = results[0]
    return {"grid": {"dp": setup.dp, "tp": setup.tp, "order": "rank = dp_index * tp + tp_index"},
            "blocks": setup.model.blocks,
            "replicated": "embedding, every LayerNorm, output biases bo and b2, head",
            "replicated_identical": len({r.extra["replicated_digest"] for r in results}) == 1,
            "heads_per_rank": [r.extra["heads"] for r in results[: setup.tp]],
            "hidden_per_rank": [r.extra["hidden"] for r in results[: setup.tp]],
            "local_parameters": [r.extra["local_parameters"] for r in results[: setup.tp]],
            "replicated_parameters": first.extra["replicated_parameters"],
            "state_bytes": [r.state_bytes for r in results[: setup.tp]],
            "steps": steps}


def format_lines(part: dict) -> list[str]:
    """The TP figures for the terminal."""
    blocks, tp, dp = part["blocks"], part["grid"]["tp"], part["grid"]["dp"]
    lines = [f"  grid dp {dp} × tp {tp} ({part['grid']['order']}); heads per TP rank "
             f"{[h[0][1] - h[0][0] for h in part['heads_per_rank']]}, hidden units "
             f"{[h[0][1] - h[0][0] for h in part['hidden_per_rank']]}, local parameters "
             f"{part['local_parameters']} ({part['replicated_parameters']} replicated: {part['replicated']})"]
    for step in part["steps"]:
        rank = max(step["ranks"], key=lambda entry: entry["rows"])
        f, b, d = rank["forward"], rank["backward"], rank["dp"]
        per_layer = (f"{f['measured']['calls'] / blocks:g} fwd + {b['measured']['calls'] / blocks:g} bwd "
                     f"all-reduces/layer (formula {f['formula']['calls'] / blocks:g} + "
                     f"{b['formula']['calls'] / blocks:g})")
        lines.append(f"  step {step['step']:3d}  rank {rank['rank']}: {per_layer}, "
                     f"{f['formula']['values_per_all_reduce']} values each; TP sent fwd "
                     f"{f['measured']['bytes_sent']} B (formula {f['formula']['bytes_sent']}), bwd "
                     f"{b['measured']['bytes_sent']} B (formula {b['formula']['bytes_sent']}); DP sync sent "
                     f"{d['measured']['bytes_sent']} B (formula {d['formula']['bytes_sent']})")
    lines.append(f"  replicated parts identical on every rank: {part['replicated_identical']}")
    return lines


def problems(part: dict) -> list[str]:
    """Every measured count or byte figure that differs from its formula, and replicas that diverged."""
    found = [] if part["replicated_identical"] else ["replicated parameters differ between ranks"]
    for step in part["steps"]:
        for rank in step["ranks"]:
            for name in ("forward", "backward", "dp"):
                measured, formula = rank[name]["measured"], rank[name]["formula"]
                for key in ("calls", "bytes_sent"):
                    if measured[key] != formula[key]:
                        found.append(f"step {step['step']} rank {rank['rank']} {name} {key}: measured "
                                     f"{measured[key]}, formula {formula[key]}")
    return found
