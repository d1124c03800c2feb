"""`colls train`: run one training strategy on n ranks and report loss, time, measured communication
and memory beside the formulas of `accounting`, and (`--check-serial`) the distance to serial training.

    colls train --strategy zero2 -n 4 --transport shm --steps 5 --check-serial --json out.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os

import numpy as np

from .accounting import Bytes, state_formula, volume_formula, volume_slack
from .common import MODEL_PARALLEL, STRATEGIES, RunResult, Setup
from .ddp import train_ddp
from .model import ModelConfig
from .placement import DEVICES
from .ps import train_ps
from .serial import train_serial
from .zero import train_zero1, train_zero2, train_zero3

LOOPS = {"ps": train_ps, "ddp": train_ddp, "zero1": train_zero1, "zero2": train_zero2, "zero3": train_zero3}


def strategy_module(strategy: str):
    """The module of a model-parallel strategy. It provides
        train(comm, setup) -> RunResult      the per-rank loop (RunResult.params: the full parameters
                                             in the serial layout, gathered, so serial_difference works)
        world_size(strategy, setup) -> int   the ranks its grid needs (the default of -n)"""
    return importlib.import_module(f"{__package__}.{MODEL_PARALLEL[strategy]}")


def report_module(strategy: str):
    """The report module beside a model-parallel strategy's (`<module>_report`). It provides
        report(strategy, setup, results) -> dict   what it measured beside its formulas (JSON-ready)
        format_lines(part) -> list[str]      those figures for the terminal
        problems(part) -> list[str]          measured-vs-formula failures (colls train exits 1)
        plot(part, path) -> None             the --plot picture (optional)"""
    return importlib.import_module(f"{__package__}.{MODEL_PARALLEL[strategy]}_report")


def run(strategy: str, setup: Setup, nprocs: int, transport: str = "local",
        timeout: float | None = None) -> list[RunResult]:
    """Train with `strategy` on `nprocs` ranks (threads for local, processes for shm); per-rank results."""
    import colls

    if strategy == "serial":
        return [train_serial(setup)]
    if strategy in MODEL_PARALLEL:
        module = strategy_module(strategy)   # a module of several strategies may tell them apart by
        loop = getattr(module, f"train_{strategy}", module.train)   # train_<strategy>, e.g. train_gpipe
    elif strategy in LOOPS:
        loop = LOOPS[strategy]
    else:
        raise ValueError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return colls.spawn(loop, nprocs, transport=transport, args=(setup,), timeout=timeout)


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
    steps = []
    for index in range(len(results[0].steps)):
        records = [r.steps[index] for r in results]
        row = {"step": index, "loss": records[0].loss, "seconds": max(r.seconds for r in records),
               "bytes_sent_per_rank": [r.bytes_sent for r in records],
               "bytes_received_per_rank": [r.bytes_received for r in records],
               "calls": {name: c["calls"] for name, c in records[0].by_collective.items()}}
        steps.append(row)
    report = {"strategy": strategy, "ranks": n, "parameters": psi, "bytes_per_value": sizes.grads,
              "setup": {"model": vars(setup.model), "steps": setup.steps, "batch": setup.batch,
                        "optimizer": setup.optimizer, "dtype": setup.dtype, "mixed": setup.mixed,
                        "dp": setup.dp, "tp": setup.tp, "pp": setup.pp, "ep": setup.ep,
                        "micro_batches": setup.micro_batches, "chunks": setup.chunks},
              "steps": steps}
    if serial is not None:
        report["serial_difference"] = serial_difference(results, serial)
    if strategy in MODEL_PARALLEL:
        report["details"] = report_module(strategy).report(strategy, setup, results)
        return report
    volume = volume_formula(strategy, psi, n, sizes.grads)
    memory = []
    for result in results[: 2 if strategy == "ps" else 1]:   # ps: the server and one worker
        formula = state_formula(strategy, psi, n, sizes, result.rank)
        memory.append({"rank": result.rank, "measured": result.state_bytes, "formula": formula,
                       "peak_transient": result.peak_transient_bytes})
    report.update({"sizes": {"P": sizes.params, "G": sizes.grads, "K": sizes.optimizer},
                   "volume_formula": volume, "memory": memory})
    if strategy == "ddp":
        report["buckets"] = len(results[0].extra["buckets"])
    return report


def format_report(report: dict) -> str:
    """The human-readable report."""
    strategy, n = report["strategy"], report["ranks"]
    if "details" in report:
        return format_model_parallel(report)
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
    lines += serial_lines(report)
    return "\n".join(lines)


def serial_lines(report: dict) -> list[str]:
    """The --check-serial line, if it was asked for."""
    if "serial_difference" not in report:
        return []
    diff = report["serial_difference"]
    return [f"  vs serial: max |Δparam| = {diff['max_abs']:.3e} (relative {diff['relative']:.3e}); "
            f"ranks identical: {diff['identical_across_ranks']}"]


def format_model_parallel(report: dict) -> str:
    """The report of a model-parallel strategy: steps, then what its module measured."""
    setup = report["setup"]
    grid = " × ".join(f"{k.upper()} {setup[k]}" for k in ("dp", "tp", "pp", "ep") if setup[k] > 1)
    lines = [f"colls train: {report['strategy']} on {report['ranks']} ranks ({grid or 'one rank'}), "
             f"Ψ = {report['parameters']} parameters"]
    for row in report["steps"]:
        sent = row["bytes_sent_per_rank"]
        lines.append(f"  step {row['step']:3d}  loss {row['loss']:.6f}  {row['seconds'] * 1e3:8.2f} ms  "
                     f"sent/rank {min(sent)}..{max(sent)} B")
    lines += report_module(report["strategy"]).format_lines(report["details"])
    lines += serial_lines(report)
    return "\n".join(lines)


def check_volume(report: dict, results: list[RunResult]) -> list[str]:
    """Problems where a measured volume is off its formula by more than the padding allows."""
    strategy, n = report["strategy"], report["ranks"]
    if "details" in report:
        return report_module(strategy).problems(report["details"])
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
                        seq_len=args.seq_len, experts=args.experts, top_k=args.top_k,
                        capacity_factor=args.capacity_factor, aux_alpha=args.aux_alpha, router=args.router)
    return Setup(model=model, steps=args.steps, batch=args.batch, seed=args.seed, optimizer=args.optimizer,
                 lr=args.lr, dtype=args.dtype, mixed=args.mixed, micro_steps=args.micro_steps,
                 bucket_bytes=int(args.bucket_mb * 2**20),
                 first_bucket_bytes=int(args.first_bucket_mb * 2**20),
                 algorithm=args.algorithm, dp=args.dp, tp=args.tp, pp=args.pp, ep=args.ep,
                 micro_batches=args.micro_batches, chunks=args.chunks, stage_seconds=args.stage_seconds,
                 device=args.device)


def at_least(lowest: int):
    """An argparse type: an int no smaller than `lowest` (0 micro-steps, say, would train nothing)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, not {value}")
        return value

    parse.__name__ = "int"   # argparse names the type in its message
    return parse


def above_zero(text: str) -> float:
    """An argparse type: a number > 0 (NaN too is refused)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `colls train`."""
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("-n", "--nprocs", type=at_least(1), default=None, metavar="N",
                        help="number of ranks (default 2; model-parallel: what the grid needs)")
    parser.add_argument("--transport", choices=("local", "shm"), default="local",
                        help="local: ranks are threads; shm: processes over shared memory")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cuda: train on cupy arrays on the GPU, ranks as processes over the cuda_ipc "
                             "transport")
    parser.add_argument("--steps", type=at_least(1), default=5)
    parser.add_argument("--check-serial", action="store_true", help="also train serially and compare")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--mixed", action="store_true",
                        help="float16 working parameters/gradients, float32 compute and master weights")
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--batch", type=at_least(1), default=12, help="global batch (sequences)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=at_least(1), default=17)
    parser.add_argument("--d-model", type=at_least(1), default=16)
    parser.add_argument("--heads", type=at_least(1), default=2)
    parser.add_argument("--blocks", type=at_least(1), default=2, help="attention + MLP block pairs")
    parser.add_argument("--seq-len", type=at_least(1), default=8)
    parser.add_argument("--micro-steps", type=at_least(1), default=1,
                        help="ddp: gradient accumulation micro-steps")
    parser.add_argument("--bucket-mb", type=above_zero, default=25.0, help="ddp: bucket cap")
    parser.add_argument("--first-bucket-mb", type=above_zero, default=1.0, help="ddp: first bucket cap")
    parser.add_argument("--algorithm", default="ring", help="ddp: all_reduce algorithm")
    grid = parser.add_argument_group("model parallelism (gpipe, 1f1b, interleaved, tp, ep, dp_tp, pp_ep, 3d)")
    grid.add_argument("--dp", type=at_least(1), default=None, help="data-parallel size")
    grid.add_argument("--tp", type=at_least(1), default=None,
                      help="tensor-parallel size (innermost, consecutive ranks)")
    grid.add_argument("--pp", type=at_least(1), default=None, help="pipeline stages (outermost)")
    grid.add_argument("--ep", type=at_least(1), default=None, help="expert-parallel size")
    grid.description = ("A size left out is 1, or, with -n, the one the others leave: --strategy tp -n 4 "
                        "gives tp 4, --strategy 3d --pp 2 --tp 2 -n 8 gives dp 2.")
    grid.add_argument("--micro-batches", type=at_least(1), default=4,
                      help="pipeline: micro-batches m per step")
    grid.add_argument("--chunks", type=at_least(1), default=1, help="interleaved: model chunks v per rank")
    grid.add_argument("--stage-seconds", type=float, default=0.0,
                      help="pipeline: sleep this long per stage forward (twice per backward), so stages "
                           "cost the same and the measured bubble is judged against the formula")
    grid.add_argument("--experts", type=at_least(0), default=0, help="MoE: experts E (0: dense MLPs)")
    grid.add_argument("--top-k", type=int, default=1, choices=(1, 2), help="MoE: experts per token")
    grid.add_argument("--capacity-factor", type=float, default=1.0, help="MoE: capacity factor C")
    grid.add_argument("--aux-alpha", type=float, default=0.01, help="MoE: load-balancing loss weight")
    grid.add_argument("--router", choices=("learned", "uniform"), default="learned",
                      help="MoE: learned router, or a forced uniform one")
    grid.add_argument("--plot", metavar="FILE.png", help="pipeline: schedule timeline; ep: expert load")


# The sizes that make each model-parallel strategy's grid, and those of them that are 1 unless given
# (the data-parallel copies added to a model-parallel strategy): `fill_grid` derives the one left.
GRID = {"gpipe": ("pp", "dp"), "1f1b": ("pp", "dp"), "interleaved": ("pp", "dp"), "tp": ("tp",),
        "dp_tp": ("dp", "tp"), "ep": ("dp", "ep"), "pp_ep": ("pp", "dp", "ep"), "3d": ("pp", "dp", "tp")}
ONE_UNLESS_GIVEN = {"gpipe": ("dp",), "1f1b": ("dp",), "interleaved": ("dp",), "ep": ("dp",),
                    "pp_ep": ("dp",)}


def fill_grid(strategy: str, nprocs: int | None, given: dict[str, int | None]) -> dict[str, int]:
    """The sizes dp, tp, pp, ep of `strategy`'s grid: those `given`, and with `nprocs` ranks the one
    size left out, as nprocs over the product of the others (`--strategy tp -n 4`: tp 4).

    Args:
        strategy: a `colls train` strategy.
        nprocs: the ranks asked for (-n), or None.
        given: {"dp": size or None, ...}, None where the flag was left out.

    Returns:
        Every size, 1 where the strategy does not use it or nothing says otherwise.

    Raises:
        ValueError: with -n, more than one size is left out (ambiguous), or the sizes given do not
            divide nprocs; the message says what to give.
    """
    sizes = {name: given.get(name) for name in ("dp", "tp", "pp", "ep")}
    grid = GRID.get(strategy, ())
    missing = [name for name in grid if sizes[name] is None]
    if nprocs is not None and len(missing) > 1:
        missing = [name for name in missing if name not in ONE_UNLESS_GIVEN.get(strategy, ())]
    if nprocs is not None and len(missing) > 1:
        flags = " ".join(f"--{name}" for name in grid)
        raise ValueError(f"-n {nprocs} with --strategy {strategy} is ambiguous: its grid is {flags}; give "
                         f"all but one of {', '.join('--' + name for name in missing)} and -n fills that one")
    if nprocs is not None and missing:
        others = math.prod(sizes[name] or 1 for name in grid if name != missing[0])
        if nprocs % others:
            shown = " ".join(f"--{name} {sizes[name]}" for name in grid if sizes[name] is not None)
            raise ValueError(f"-n {nprocs} is not a multiple of {others} ({shown}): "
                             f"no --{missing[0]} fills it")
        sizes[missing[0]] = nprocs // others
    return {name: 1 if size is None else size for name, size in sizes.items()}


def train_command(args: argparse.Namespace) -> int:
    """Run, print the report, optionally write JSON; exit 1 if a check failed."""
    try:
        given = {name: getattr(args, name) for name in ("dp", "tp", "pp", "ep")}
        sizes = fill_grid(args.strategy, args.nprocs, given)
    except ValueError as error:
        args.parser.error(str(error))
    for name, size in sizes.items():
        setattr(args, name, size)
    setup = setup_from_args(args)
    if args.d_model % args.heads:
        args.parser.error(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    nprocs = args.nprocs
    if args.strategy in MODEL_PARALLEL:
        module = strategy_module(args.strategy)
        try:
            needed = module.world_size(args.strategy, setup)
        except ValueError as error:   # a grid or model the strategy cannot run: say so, no traceback
            args.parser.error(str(error))
        if nprocs is not None and nprocs != needed:
            args.parser.error(f"-n {nprocs}: --strategy {args.strategy} with --dp {setup.dp} --tp {setup.tp} "
                              f"--pp {setup.pp} --ep {setup.ep} needs {needed} ranks")
        nprocs = needed
    transport = args.transport
    if setup.device == "cuda":
        if importlib.util.find_spec("cupy") is None:
            args.parser.error("--device cuda needs cupy and an NVIDIA GPU: pip install cupy-cuda12x (or "
                              "cupy-cuda13x)")
        transport = "cuda_ipc"   # processes (forked before this process touches the GPU) over CUDA IPC
    results = run(args.strategy, setup, 2 if nprocs is None else nprocs, transport)
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
    if args.plot:
        if "details" not in report or not hasattr(report_module(args.strategy), "plot"):
            args.parser.error(f"--plot: strategy {args.strategy} draws no picture")
        report_module(args.strategy).plot(report["details"], args.plot)
        if os.path.exists(args.plot):
            print(f"  picture: {args.plot}")
    return 1 if problems else 0
