"""The `colls` command: one argparse subcommand per task, each added by a small `add_<name>` function."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def add_run(subparsers: argparse._SubParsersAction) -> None:
    """`colls run -n N [--transport T] [--timeout S] script.py args…` or `... -m module args…`."""
    parser = subparsers.add_parser(
        "run", help="start N ranks of a Python program on this machine",
        description="Start N ranks of a Python script (or -m module), each told its rank through "
                    "COLLS_* variables; prefix their output with [rank]; if one fails, stop all.",
        usage="colls run -n N [--transport {shm,mpi,cuda_ipc}] [--hosts H] [--timeout SECONDS] "
              "[--plugin MODULE] [python] (script.py | -m module) [args ...]")
    parser.add_argument("-n", "--nprocs", type=int, required=True, metavar="N", help="number of ranks")
    parser.add_argument("--transport", choices=("shm", "mpi", "cuda_ipc"), default=None,
                        help="how ranks exchange data (default: $COLLS_TRANSPORT, else shm; cuda_ipc: "
                             "cupy buffers on GPUs, by CUDA IPC)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="kill the whole job after this many seconds and exit 124")
    parser.add_argument("--hosts", type=int, default=None, metavar="H",
                        help="split the ranks into H virtual hosts (COLLS_HOST), consecutive ranks "
                             "together, so that collectives run across hosts (hierarchically)")
    parser.add_argument("--as-mpi4py", action="store_true",
                        help="run an unmodified mpi4py script on colls: `from mpi4py import MPI` gives "
                             "colls' facade (colls.compat); output unprefixed, as mpiexec prints it")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="a module or .py file of colls.algorithm schedules every rank loads "
                             "(COLLS_PLUGINS), so that algorithm= may name them; repeatable")
    # REMAINDER on both, so the program's own options (even -n) are passed through untouched.
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="module args",
                        help="run a library module as a script, like python -m")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="script.py args",
                        help="the script to run and its arguments")
    parser.set_defaults(handler=run_command, parser=parser)


def run_command(args: argparse.Namespace) -> int:
    """Launch the ranks and return the job's exit status."""
    from .launcher import interpreter_and_program, launch

    if args.module:
        argv_of_program = ["-m", *args.module]
    else:
        program = args.program[1:] if args.program[:1] == ["--"] else args.program
        argv_of_program = program
    if not argv_of_program:
        args.parser.error("give a script (or -m module) to run")
    if args.nprocs < 1:
        args.parser.error(f"-n must be at least 1, not {args.nprocs}")
    if args.timeout is not None and not args.timeout > 0:   # (NaN too)
        args.parser.error(f"--timeout must be positive, not {args.timeout:g}")
    if args.hosts is not None and not 1 <= args.hosts <= args.nprocs:
        args.parser.error(f"--hosts must be between 1 and -n ({args.nprocs}), not {args.hosts}")
    try:
        as_mpi4py = getattr(args, "as_mpi4py", False)
        if as_mpi4py:   # the facade's runner between the Python and the program; output as mpiexec's
            python, rest = interpreter_and_program(argv_of_program)
            argv_of_program = [python, "-m", "colls.compat.run", *rest]
        env = None
        if args.plugin:   # every rank loads them as its communicator is made
            from .plugins import with_plugins

            env = {"COLLS_PLUGINS": with_plugins(args.plugin)}
        return launch(argv_of_program, args.nprocs, transport=args.transport, timeout=args.timeout,
                      env=env, hosts=args.hosts, prefix=not as_mpi4py)
    except ValueError as error:   # refused before any rank starts (a bad COLLS_TRANSPORT too)
        args.parser.error(str(error))


def add_tune(subparsers: argparse._SubParsersAction) -> None:
    """`colls tune [-n N] [--transport T] [--collectives LIST]`: measure what algorithm selection
    needs on this machine."""
    from .bench.spec import COLLECTIVES

    parser = subparsers.add_parser(
        "tune", help="measure per-message and per-byte costs here, and the fastest algorithms by size",
        description="Ping-pong between two ranks and time a numpy reduction, then save alpha, beta "
                    "and gamma for the transport to $COLLS_TUNE_FILE (default ~/.cache/colls/tune.json); "
                    "then time every algorithm of each collective from 8 B to 64 MiB on N ranks and "
                    "save which was fastest where (a new rule only where another algorithm wins by 5%): "
                    "groups of N ranks over that transport follow it.")
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--transport", choices=("shm", "mpi"), default="shm")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES), metavar="LIST",
                        help=f"which collectives to rank by measurement (default {','.join(COLLECTIVES)})")
    parser.set_defaults(handler=tune_command, parser=parser)


def tune_command(args: argparse.Namespace) -> int:
    """Run N ranks of `colls.tune` over the chosen transport."""
    from .bench.spec import COLLECTIVES
    from .launcher import launch

    if args.nprocs < 2:
        args.parser.error("-n must be at least 2")
    asked = [name for name in args.collectives.split(",") if name]
    unknown = sorted(set(asked) - set(COLLECTIVES))
    if unknown or not asked:
        args.parser.error(f"--collectives: {unknown or 'none named'}; choose from {','.join(COLLECTIVES)}")
    return launch(["-m", "colls.tune", "--collectives", args.collectives], args.nprocs,
                  transport=args.transport, timeout=900)


def add_fuzz(subparsers: argparse._SubParsersAction) -> None:
    """`colls fuzz [--transport T] [--ranks 2-8] [--seconds N | --programs N] [--replay SEED] ...`."""
    from .fuzz.cli import add_arguments, fuzz_command

    parser = subparsers.add_parser(
        "fuzz", help="run random collective programs on real ranks, checked against numpy",
        description="Draw random collective programs (hypothesis), run them on real ranks, check every "
                    "result against a numpy oracle and across ranks; shrink a failure to a minimal "
                    "program, printed as a Python snippet and a seed that --replay reruns exactly.")
    add_arguments(parser)
    parser.set_defaults(handler=fuzz_command, parser=parser)


def add_train(subparsers: argparse._SubParsersAction) -> None:
    """`colls train --strategy ps|ddp|zero1|zero2|zero3 -n N [--transport T] [--steps S] [--check-serial]`."""
    from .parallel.train import add_arguments, train_command

    parser = subparsers.add_parser(
        "train", help="train the reference model with a parallel strategy and report volume and memory",
        description="Train the small reference model with one strategy on N ranks; print per-step loss, "
                    "time, measured bytes per rank beside the formula, bytes held per rank beside the "
                    "ZeRO formulas, and with --check-serial the largest difference from serial training.")
    add_arguments(parser)
    parser.set_defaults(handler=train_command, parser=parser)


def add_bench(subparsers: argparse._SubParsersAction) -> None:
    """`colls bench [-n 2] [--transport T] [-c LIST] [-b 8] [-e 256M] [-f 2] [--json F] [--plot F.png]`."""
    from .bench.cli import add_arguments, bench_command

    parser = subparsers.add_parser(
        "bench", help="time collectives nccl-tests style, beside MPI's and Gloo's on the same ranks",
        description="Start N ranks under mpiexec and time colls' collectives over a range of sizes, "
                    "and on the same ranks and buffers MPI's native collectives (mpi4py) and "
                    "torch.distributed with Gloo (when torch is installed); print time, algbw, busbw, "
                    "#wrong and colls/baseline ratios per size, with a memcpy roofline.")
    add_arguments(parser)
    parser.set_defaults(handler=bench_command, parser=parser)


def add_plan(subparsers: argparse._SubParsersAction) -> None:
    """`colls plan collective|train|scale [cluster options]`: predicted times on a simulated cluster."""
    from .plan.cli import add_arguments, plan_command

    parser = subparsers.add_parser(
        "plan", help="predict collective and training-step times on a simulated GPU cluster",
        description="Run the registered algorithms on the sim transport (symbolic buffers, virtual "
                    "clocks, a leaf-spine cluster with link contention) and print predicted times: "
                    "every algorithm of one collective, a training step's communication per parallel "
                    "dimension and placement, or time against cluster size.")
    add_arguments(parser)
    parser.set_defaults(handler=plan_command, parser=parser)


def add_config(subparsers: argparse._SubParsersAction) -> None:
    """`colls config [--markdown]`: the COLLS_* variables, their values here, or their docs page."""
    parser = subparsers.add_parser(
        "config", help="show every COLLS_* variable's value here (or --markdown: the docs page)",
        description="Print every COLLS_* environment variable colls reads with its value in this "
                    "environment (* marks those set), after checking each one set; with --markdown, "
                    "the page docs/configuration.md.")
    parser.add_argument("--markdown", action="store_true", help="print the docs page instead")
    parser.set_defaults(handler=config_command, parser=parser)


def config_command(args: argparse.Namespace) -> int:
    """Print the variables (or the page); 1 when one set in the environment does not parse."""
    from . import config

    return config.main(["--markdown"] if args.markdown else [])


# Only implemented subcommands appear here.
SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (add_run, add_tune, add_fuzz,
                                                                         add_train, add_bench, add_plan,
                                                                         add_config)


def build_parser() -> argparse.ArgumentParser:
    """The `colls` parser with every implemented subcommand."""
    parser = argparse.ArgumentParser(prog="colls", description="Collective communication in Python.")
    subparsers = parser.add_subparsers(title="commands", metavar="command", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `colls` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
