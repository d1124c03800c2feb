"""What `colls train --strategy pp_ep|3d` reports (hybrid.py's loop): the pipeline's figures
(pipeline_report.py) and the grid, with 3d's tensor-parallel all-reduces per rank beside Megatron's
count."""

from __future__ import annotations

from . import pipeline_report
from .common import RunResult, Setup
from .hybrid import schedule_of


def report(strategy: str, setup: Setup, results: list[RunResult]) -> dict:
    """The pipeline's figures (bubble, stash, point-to-point bytes, replicas) and the grid."""
    part = pipeline_report.report(schedule_of(setup), setup, results)
    inner = "ep" if strategy == "pp_ep" else "tp"
    if strategy == "3d" and setup.tp > 1:   # per rank: measured all-reduces per step, and the formula
        by_rank = sorted(results, key=lambda r: r.rank)
        part["tp_all_reduces"] = [[f["tp_all_reduces"] for f in r.extra["plan"]] for r in by_rank]
        part["tp_all_reduces_formula"] = [r.extra["plan"][0]["tp_all_reduces_per_micro_batch_formula"]
                                          * setup.micro_batches for r in by_rank]
    part["grid"] = {"pp": setup.pp, "dp": setup.dp, inner: getattr(setup, inner),
                    "order": f"{inner} innermost, then dp, pp outermost"}
    return part


def format_lines(part: dict) -> list[str]:
    """The grid, then the pipeline's lines."""
    grid = part["grid"]
    sizes = " × ".join(f"{k.upper()} {v}" for k, v in grid.items() if k != "order")
    lines = [f"  grid {sizes} ({grid['order']})", *pipeline_report.format_lines(part)]
    if "tp_all_reduces" in part:
        lines.append(f"  tp all-reduces per rank, step 0: {[c[0] for c in part['tp_all_reduces']]} "
                     f"(Megatron: 2 per cut layer and micro-batch = {part['tp_all_reduces_formula']})")
    return lines


def problems(part: dict) -> list[str]:
    """The pipeline's problems, and tp all-reduce counts off Megatron's."""
    found = pipeline_report.problems(part)
    for rank, (calls, expected) in enumerate(zip(part.get("tp_all_reduces", []),
                                                 part.get("tp_all_reduces_formula", []), strict=True)):
        if any(c != expected for c in calls):
            found.append(f"rank {rank}: {calls} tp all-reduces per step, formula {expected}")
    return found


plot = pipeline_report.plot
