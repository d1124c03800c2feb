"""`colls train`: run one training strategy on n ranks and report loss, time, measured communication
and memory beside the formulas of `accounting`, and (`--check-serial`) the distance to serial training.

    colls train --strategy zero2 -n 4 --transport shm --steps 5 --check-serial --json out.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from .accounting import Bytes, state_formula, volume_formula, volume_slack
from .common import STRATEGIES, RunResult, Setup
from .ddp import train_ddp
from .model import ModelConfig
from .ps import train_ps
from .serial import train_serial
from .zero import train_zero1, train_zero2, train_zero3

LOOPS = {"ps": train_ps, "ddp": train_ddp, "zero1": train_zero1, "zero2": train_zero2, "zero3": train_zero3}


def run(strategy: str, setup: Setup, nprocs: int, transport: str = "local",
        timeout: float | None = None) -> list[RunResult]:
    """Train with `strategy` on `nprocs` ranks (threads for local, processes for shm); per-rank results."""
    import colls

    if strategy == "serial":
        return [train_serial(setup)]
    if strategy not in LOOPS:
        raise ValueError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return colls.spawn(LOOPS[strategy], nprocs, transport=transport, args=(setup,), timeout=timeout)


def serial_difference(results: list[RunResult], serial: RunResult) -> dict[str, float | bool]:
    """Largest |parameter - serial parameter| over ranks, relative to the largest serial parameter."""
    largest = max(float(np.abs(r.params - serial.params).max()) for r in results)
    return {"max_abs": largest, "relative": largest / float(np.abs(serial.params).max()),
            "identical_across_ranks": all(np.array_equal(r.params, results[0].params) for r in results)}


def build_report(strategy: str, setup: Setup, results: list[RunResult],
                 serial: RunResult | None = None) -> dict:
    """Everything `colls train` prints, as one JSON-ready dict."""
    n, psi = results[0].size, results[0].parameters
    sizes = Bytes.of_setup(setup)
    volume = volume_formula(strategy, psi, n, sizes.grads)
    steps = []
    for index in range(len(results[0].steps)):
        records = [r.steps[index] for r in results]
        row = {"step": index, "loss": records[0].loss, "seconds": max(r.seconds for r in records),
               "bytes_sent_per_rank": [r.bytes_sent for r in records],
               "bytes_received_per_rank": [r.bytes_received for r in records],
               "calls": {name: c["calls"] for name, c in records[0].by_collective.items()}}
        steps.append(row)
    memory = []
    for result in results[: 2 if strategy == "ps" else 1]:   # ps: the server and one worker
        formula = state_formula(strategy, psi, n, sizes, result.rank)
        memory.append({"rank": result.rank, "measured": result.state_bytes, "formula": formula,
                       "peak_transient": result.peak_transient_bytes})
    report = {"strategy": strategy, "ranks": n, "parameters": psi, "bytes_per_value": sizes.grads,
              "sizes": {"P": sizes.params, "G": sizes.grads, "K": sizes.optimizer},
              "setup": {"model": vars(setup.model), "steps": setup.steps, "batch": setup.batch,
                        "optimizer": setup.optimizer, "dtype": setup.dtype, "mixed": setup.mixed},
              "volume_formula": volume, "steps": steps, "memory": memory}
    if strategy == "ddp":
        report["buckets"] = len(results[0].extra["buckets"])
    if serial is not None:
        report["serial_difference"] = serial_difference(results, serial)
    return report


def format_report(report: dict) -> str:
    """The human-readable report."""
    strategy, n = report["strategy"], report["ranks"]
    volume = report["volume_formula"]
    sizes = report["sizes"]
    lines = [f"colls train: {strategy} on {n} ranks, Ψ = {report['parameters']} parameters, "
             f"P/G/K = {sizes['P']}/{sizes['G']}/{sizes['K']} bytes per parameter"]
    for row in report["steps"]:
        sent = row["bytes_sent_per_rank"]
        if strategy == "ps":
            server_in = row["bytes_received_per_rank"][0]
            comm = (f"server in {server_in} B (formula (n-1)·Ψ·{report['bytes_per_value']} = "
                    f"{volume.get('server_received', 0):.0f} B), worker sent {sent[-1]} B "
                    f"(formula {volume['sent']:.0f} B)")
        else:
            comm = f"sent/rank {min(sent)}..{max(sent)} B (formula {volume['sent']:.0f} B)"
        lines.append(f"  step {row['step']:3d}  loss {row['loss']:.6f}  {row['seconds'] * 1e3:8.2f} ms  "
                     f"{comm}")
    for entry in report["memory"]:
        measured, formula = entry["measured"], entry["formula"]
        parts = ", ".join(f"{k} {measured[k]} B (formula {formula[k]:.0f})" for k in ("params", "grads",
                                                                                   "optimizer"))
        lines.append(f"  memory rank {entry['rank']}: {parts}; total {sum(measured.values())} B "
                     f"(formula {sum(formula.values()):.0f}); peak temporaries {entry['peak_transient']} B")
    if "serial_difference" in report:
        diff = report["serial_difference"]
        lines.append(f"  vs serial: max |Δparam| = {diff['max_abs']:.3e} (relative {diff['relative']:.3e}); "
                     f"ranks identical: {diff['identical_across_ranks']}")
    return "\n".join(lines)


def check_volume(report: dict, results: list[RunResult]) -> list[str]:
    """Problems where a measured volume is off its formula by more than the padding allows."""
    strategy, n = report["strategy"], report["ranks"]
    volume, problems = report["volume_formula"], []
    layers = len(ModelConfig(**report["setup"]["model"]).layers())
    for row in report["steps"]:
        calls = sum(row["calls"].values())
        slack = volume_slack(strategy, n, calls, layers, report["bytes_per_value"])
        measured = row["bytes_received_per_rank"][0] if strategy == "ps" else max(row["bytes_sent_per_rank"])
        expected = volume.get("server_received", 0.0) if strategy == "ps" else volume["sent"]
        if abs(measured - expected) > slack:
            problems.append(f"step {row['step']}: measured {measured} B, formula {expected:.0f} B ± {slack}")
    return problems


def setup_from_args(args: argparse.Namespace) -> Setup:
    """A `Setup` from the command-line flags."""
    model = ModelConfig(vocab=args.vocab, d_model=args.d_model, heads=args.heads, blocks=args.blocks,
                        seq_len=args.seq_len)
    return Setup(model=model, steps=args.steps, batch=args.batch, seed=args.seed, optimizer=args.optimizer,
                 lr=args.lr, dtype=args.dtype, mixed=args.mixed, micro_steps=args.micro_steps,
                 bucket_bytes=int(args.bucket_mb * 2**20),
                 first_bucket_bytes=int(args.first_bucket_mb * 2**20),
                 algorithm=args.algorithm)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `colls train`."""
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("-n", "--nprocs", type=int, default=2, metavar="N", help="number of ranks")
    parser.add_argument("--transport", choices=("local", "shm"), default="local",
                        help="local: ranks are threads; shm: processes over shared memory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check-serial", action="store_true", help="also train serially and compare")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--mixed", action="store_true",
                        help="float16 working parameters/gradients, float32 compute and master weights")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--batch", type=int, default=12, help="global batch (sequences)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=17)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=2, help="attention + MLP block pairs")
    parser.add_argument("--seq-len", type=int, default=8)
    parser.add_argument("--micro-steps", type=int, default=1, help="ddp: gradient accumulation micro-steps")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="ddp: bucket cap")
    parser.add_argument("--first-bucket-mb", type=float, default=1.0, help="ddp: first bucket cap")
    parser.add_argument("--algorithm", default="ring", help="ddp: all_reduce algorithm")


def train_command(args: argparse.Namespace) -> int:
    """Run, print the report, optionally write JSON; exit 1 if a check failed."""
    setup = setup_from_args(args)
    if args.d_model % args.heads:
        args.parser.error(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    results = run(args.strategy, setup, args.nprocs, args.transport)
    serial = train_serial(setup) if args.check_serial else None
    report = build_report(args.strategy, setup, results, serial)
    problems = check_volume(report, results)
    report["volume_problems"] = problems
    print(format_report(report))
    for problem in problems:
        print(f"  VOLUME MISMATCH {problem}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return 1 if problems else 0
