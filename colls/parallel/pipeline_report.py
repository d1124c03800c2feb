"""What `colls train --strategy gpipe|1f1b|interleaved` reports (pipeline.py's loop): the
measured bubble beside the formula and beside the schedule replayed with zero-cost messages
(schedule.py), stashed micro-batches, point-to-point bytes, replicas identical; `format_lines`,
`problems` and `plot` (a timeline of every rank's forwards and backwards) for the terminal, the
exit status and the --plot picture."""

from __future__ import annotations

import numpy as np

from .common import RunResult, Setup
from .pipeline import BACKWARD_COST
from .schedule import bubble_formula, bubble_of, schedule, simulate, stash_formula

BUBBLE_MARGIN = 0.05        # |measured - formula| bubble fraction allowed when stage costs are equal

def step_timeline(results: list[RunResult], step: int) -> list[list[tuple[str, int, int, float, float]]]:
    """One pipeline's ops of `step`, per stage rank, times in seconds from the step's first op."""
    pipeline = sorted((r for r in results if r.extra["position"] == 0), key=lambda r: r.extra["stage_rank"])
    events = [r.extra["events"][step] for r in pipeline]
    origin = min(e[3] for rank in events for e in rank)
    return [[(k, micro, c, a - origin, b - origin) for k, micro, c, a, b in rank] for rank in events]


def report(strategy: str, setup: Setup, results: list[RunResult]) -> dict:
    """Per step: the measured bubble per rank beside the formula and the simulated schedule, peak
    stashed micro-batches beside the formula, point-to-point bytes beside what the stages imply."""
    first = results[0].extra
    p, m, v = first["p"], first["m"], first["v"]
    ops = [schedule(strategy, p, m, v, r) for r in range(p)]
    equal = bubble_of(simulate(ops, p, v, lambda r, kind, c: BACKWARD_COST if kind == "B" else 1.0))
    steps = []
    for index in range(len(first["events"])):
        timeline = step_timeline(results, index)
        cost: dict[tuple[int, str, int], list[float]] = {}
        for r, rank in enumerate(timeline):
            for kind, _, c, a, b in rank:
                cost.setdefault((r, kind, c), []).append(b - a)
        means = {key: float(np.mean(durations)) for key, durations in cost.items()}
        measured_costs = bubble_of(simulate(ops, p, v, lambda r, kind, c, means=means: means[(r, kind, c)]))
        measured = bubble_of([[(a, b) for *_, a, b in rank] for rank in timeline])
        steps.append({"step": index, "span": max(rank[-1][4] for rank in timeline),
                      "bubble": measured, "bubble_mean": float(np.mean(measured)),
                      "simulated_with_measured_costs": float(np.mean(measured_costs))})
    by_rank = sorted(results, key=lambda r: r.rank)
    digests: dict[tuple, set[str]] = {}
    for r in results:   # the same part of the model (stage, tp/ep place), and the stage's shared part
        digests.setdefault((r.extra["stage_rank"], r.extra["position"] % r.extra["inner"]),
                           set()).add(r.extra["local_digest"])
        digests.setdefault((r.extra["stage_rank"], "shared"), set()).add(r.extra["shared_digest"])
    return {"schedule": strategy, "p": p, "m": m, "v": v, "stage_seconds": first["stage_seconds"],
            "stage_layers": [r.extra["stages"] for r in by_rank if r.extra["position"] == 0],
            "bubble_formula": bubble_formula(p, m, v), "bubble_simulated_equal_stages": float(np.mean(equal)),
            "bubble_margin": BUBBLE_MARGIN,
            "peak_stash": [max(r.extra["peak_stash"]) for r in by_rank],
            "stash_formula": [stash_formula(strategy, p, m, v, r.extra["stage_rank"]) for r in by_rank],
            "p2p_sent": [r.extra["p2p_sent"] for r in by_rank],
            "p2p_expected": [r.extra["p2p_expected"] for r in by_rank],
            "replicas_identical": all(len(d) == 1 for d in digests.values()),
            "steps": steps, "timeline": step_timeline(results, len(steps) - 1) if steps else []}


def format_lines(part: dict) -> list[str]:
    """The pipeline figures for the terminal."""
    p, m, v = part["p"], part["m"], part["v"]
    lines = [f"  pipeline {part['schedule']}: p = {p} stages{f' × v = {v} chunks' if v > 1 else ''}, "
             f"m = {m} micro-batches; layers per stage {part['stage_layers']}"
             + (f"; {part['stage_seconds'] * 1e3:g} ms sleep per stage forward (backward "
                f"{BACKWARD_COST:g}×)" if part["stage_seconds"] else "")]
    formula = "(p-1)/(v·m+p-1)" if v > 1 else "(p-1)/(m+p-1)"
    for row in part["steps"]:
        lines.append(f"    step {row['step']:3d} bubble {row['bubble_mean']:.3f} "
                     f"(per rank {', '.join(f'{b:.3f}' for b in row['bubble'])}; formula {formula} = "
                     f"{part['bubble_formula']:.3f}; this schedule at the measured stage costs "
                     f"{row['simulated_with_measured_costs']:.3f})")
    bound = {"gpipe": "GPipe: m·v", "1f1b": "1F1B: p - rank, at most p"}.get(part["schedule"],
                                                                        "interleaved: warm-up + 1")
    lines.append(f"  peak stashed micro-batches per rank {part['peak_stash']} "
                 f"(formula {part['stash_formula']}, {bound})")
    lines.append(f"  point-to-point sent per rank, step 0: {[s[0] for s in part['p2p_sent']]} B "
                 f"(the stages imply {part['p2p_expected']} B)")
    lines.append(f"  replicated parameters identical on every rank: {part['replicas_identical']}")
    return lines


def problems(part: dict) -> list[str]:
    """Stash or point-to-point bytes off their formulas, replicas that differ, and (stages of equal
    cost, --stage-seconds) a median bubble more than BUBBLE_MARGIN off the formula."""
    found = []
    if part["peak_stash"] != part["stash_formula"]:
        found.append(f"peak stash {part['peak_stash']} != formula {part['stash_formula']}")
    for rank, (sent, expected) in enumerate(zip(part["p2p_sent"], part["p2p_expected"], strict=True)):
        if any(s != expected for s in sent):
            found.append(f"rank {rank}: point-to-point sent {sent} B per step, stages imply {expected} B")
    if not part["replicas_identical"]:
        found.append("replicated parameters differ between ranks")
    if part["stage_seconds"] and part["steps"]:
        median = float(np.median([row["bubble_mean"] for row in part["steps"]]))
        if abs(median - part["bubble_formula"]) > part["bubble_margin"]:
            found.append(f"median bubble {median:.3f}, formula {part['bubble_formula']:.3f} "
                         f"± {part['bubble_margin']}")
    return found


COLOURS = {"F": "tab:blue", "B": "tab:orange"}


def plot(part: dict, path: str) -> None:
    """The last step's measured schedule: one row per pipeline rank, forwards blue, backwards
    orange (chunks lighter to darker), micro-batch numbers on the bars, gaps are the bubble."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"  --plot {path}: matplotlib is not installed, no picture drawn (pip install matplotlib)")
        return
    timeline, v = part["timeline"], part["v"]
    figure, axis = plt.subplots(figsize=(10, 0.6 * len(timeline) + 1.5))
    for rank, ops in enumerate(timeline):
        for kind, micro, chunk, start, stop in ops:
            axis.barh(rank, (stop - start) * 1e3, left=start * 1e3, color=COLOURS[kind],
                      alpha=1.0 - 0.5 * chunk / max(1, v), edgecolor="black", linewidth=0.5)
            axis.text((start + stop) / 2 * 1e3, rank, str(micro), ha="center", va="center", fontsize=7)
    from matplotlib.patches import Patch
    names = {"F": "forward", "B": "backward"}
    axis.legend(handles=[Patch(color=COLOURS[kind], alpha=1.0 - 0.5 * c / max(1, v),
                               label=names[kind] + (f" chunk {c}" if v > 1 else ""))
                         for kind in "FB" for c in range(v)],
                loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2 * v, fontsize="small", frameon=False)
    axis.set_yticks(range(len(timeline)), [f"rank {r}" for r in range(len(timeline))])
    axis.invert_yaxis()
    axis.set_xlabel("ms since the step's first forward")
    last = part["steps"][-1]
    axis.set_title(f"{part['schedule']}: p = {part['p']}, m = {part['m']}"
                   f"{f', v = {v}' if v > 1 else ''}; bubble {last['bubble_mean']:.3f} "
                   f"(formula {part['bubble_formula']:.3f}); numbers: micro-batches")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
