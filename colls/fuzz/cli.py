"""`colls fuzz`: the command line over `Session`, `Progress` and the snippet printer."""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys

from algorithms import names

from .. import config
from .execute import REGISTERED_VARIABLE
from .program import COLLECTIVES, MAX_BYTES, MODES, Program, Space

EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `colls fuzz`."""
    parser.add_argument("--transport", choices=("local", "shm", "mpi"), default=None,
                        help="local: threads; shm: processes; mpi: under mpiexec (started for you if "
                             "needed). Default: mpi under mpiexec, else local")
    parser.add_argument("--ranks", default=None, metavar="MIN-MAX",
                        help="group sizes to draw, e.g. 2-8 or 4 (default 2-8; under mpiexec 2-N)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=None, help="stop drawing programs after this long")
    budget.add_argument("--programs", type=int, default=None, help="stop after this many programs")
    parser.add_argument("--seed", type=int, default=None, help="session seed (default: random, printed)")
    parser.add_argument("--collectives", nargs="+", default=None, metavar="NAME",
                        help=f"only these (also 'split', 'p2p', 'invalid'); from {', '.join(COLLECTIVES)}")
    parser.add_argument("--algorithms", nargs="+", default=None, metavar="NAME",
                        help="only force these algorithm names ('auto': also let the library choose)")
    parser.add_argument("--replay", default=None, metavar="SEED",
                        help="rerun exactly the program a failing run printed (its replay seed)")
    parser.add_argument("--deadline", type=float, default=30.0, metavar="SECONDS",
                        help="a program still running after this long is a hang (default 30)")
    parser.add_argument("--shrink-seconds", type=float, default=120.0,
                        help="time allowed for shrinking a failure (default 120)")
    parser.add_argument("--max-steps", type=int, default=50, help="steps per program, at most (default 50)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES,
                        help=f"largest buffer per rank in bytes (default {MAX_BYTES >> 20} MiB)")
    parser.add_argument("--skip", action="append", default=[], metavar="COLLECTIVE:MODE",
                        help="never draw this output mode (new, out, inplace) for this collective")
    parser.add_argument("--registered", action="store_true",
                        help="every call's buffers in registered memory (colls.alloc); with "
                             "COLLS_SHM_MAPPED_BYTES small, shm moves the fuzzer's small messages mapped")
    parser.add_argument("--plugin", action="append", default=[], metavar="PATH[:ARG]",
                        help="load this Python file or module first (its setup(ARG) called): schedules "
                             "of your own (colls.algorithm) for --algorithms, or the test suite's "
                             "planted faults; the replay line and snippet load it too")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def _ranks(text: str | None, world: int | None) -> tuple[int, int]:
    if text is None:
        return (min(2, world), world) if world else (2, 8)
    low, _, high = text.partition("-")
    low_n, high_n = int(low), int(high or low)
    if not 1 <= low_n <= high_n:
        raise ValueError(f"--ranks {text}: give MIN-MAX with 1 <= MIN <= MAX")
    if world is not None and high_n > world:
        raise ValueError(f"--ranks {text}: mpiexec started only {world} ranks")
    return low_n, high_n


def _space(args: argparse.Namespace, low: int, high: int) -> Space:
    chosen = tuple(args.collectives or COLLECTIVES)
    extras = ("split", "p2p", "invalid")
    unknown = [c for c in chosen if c not in (*COLLECTIVES, *extras)]
    if unknown:
        raise ValueError(f"--collectives: unknown {unknown}; choose from {list(COLLECTIVES)} or {extras}")
    known = {name for collective in COLLECTIVES for name in names(collective)} | {"auto"}
    if args.algorithms and not set(args.algorithms) <= known:
        raise ValueError(f"--algorithms: unknown {sorted(set(args.algorithms) - known)} (a plugin's: "
                         f"load it with --plugin)")
    for pair in args.skip:
        kind, _, mode = pair.partition(":")
        if mode not in MODES.get(kind, ()):
            raise ValueError(f"--skip {pair}: give COLLECTIVE:MODE, e.g. all_to_all:inplace")
    collectives = tuple(c for c in chosen if c not in extras) or ("barrier",)
    every = args.collectives is None
    return Space(low, high, max(1, args.max_steps), collectives,
                 tuple(args.algorithms) if args.algorithms else None,
                 splits=every or "split" in chosen, p2p=every or "p2p" in chosen,
                 invalid=every or "invalid" in chosen, max_bytes=args.max_bytes, skip=tuple(args.skip))


def _relaunch_under_mpiexec(args: argparse.Namespace, high: int) -> int:
    """`--transport mpi` outside mpiexec: start `high` ranks of this same command under mpiexec."""
    from ..launcher import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("colls fuzz: --transport mpi needs mpiexec: pip install 'colls[mpi]'", file=sys.stderr)
        return 2
    command = [mpiexec, "-n", str(high), sys.executable, "-m", "colls.cli", "fuzz", *_argv(args)]
    return subprocess.call(command)


def _argv(args: argparse.Namespace) -> list[str]:
    """The options of `args` as a command line (for the relaunch under mpiexec)."""
    argv = ["--transport", "mpi"]
    for name in ("ranks", "seconds", "programs", "seed", "replay", "deadline", "shrink_seconds",
                 "max_steps", "max_bytes"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    for name in ("collectives", "algorithms"):
        if getattr(args, name):
            argv += [f"--{name}", *getattr(args, name)]
    for pair in args.skip:
        argv += ["--skip", pair]
    for spec in args.plugin:
        argv += ["--plugin", spec]
    return argv + (["--quiet"] if args.quiet else []) + (["--registered"] if args.registered else [])


def replay_command(transport: str, program: Program, plugins: list[str] = ()) -> str:
    """The command line that reruns `program` exactly (loading the same `plugins`)."""
    prefix = ""
    if config.get(REGISTERED_VARIABLE):
        names = (REGISTERED_VARIABLE, "COLLS_SHM_MAPPED_BYTES")
        prefix += " ".join(f"{name}={config.get(name)}" for name in names if config.is_set(name)) + " "
    launch = f"mpiexec -n {program.size} " if transport == "mpi" else ""
    loads = "".join(f"--plugin {spec} " for spec in plugins)
    return f"{prefix}{launch}colls fuzz {loads}--transport {transport} --replay {program.token()}"


def fuzz_command(args: argparse.Namespace) -> int:
    """Run a session (or one replay) and return the exit status: 0 passed, 1 failed."""
    from ..bootstrap import under_mpiexec
    from .plugins import load

    transport = args.transport or ("mpi" if under_mpiexec() else "local")
    try:
        for spec in args.plugin:   # before any group exists: forked ranks inherit what it did
            load(spec)
    except ValueError as error:
        args.parser.error(str(error))
    if args.registered:   # read by every rank's executor (forked, or started by mpiexec with it)
        os.environ[REGISTERED_VARIABLE] = "1"
    world = None
    if transport == "mpi" and under_mpiexec():
        from .groups import MpiGroup

        group = MpiGroup()
        world = group.max_ranks
    try:
        low, high = _ranks(args.ranks, world)
        space = _space(args, low, high)
        program = Program.from_token(args.replay) if args.replay else None
    except ValueError as error:
        args.parser.error(str(error))
    if transport == "mpi" and world is None:
        return _relaunch_under_mpiexec(args, program.size if program else high)
    if transport == "mpi":
        if group.rank != 0:
            group.serve()
            return 0
    else:
        from .groups import make_group

        group = make_group(transport, max(high, program.size if program else 0))
    try:
        if program is not None:
            return _replay(group, transport, program, args)
        return _fuzz(group, transport, space, args, f"{low}-{high}" if low != high else str(low))
    finally:
        group.close()


def _replay(group, transport: str, program: Program, args: argparse.Namespace) -> int:
    from .report import describe_failure
    from .session import judge
    from .snippet import render

    verdict = judge(program, group.run(program, args.deadline), args.deadline)
    print(f"replaying {program.collective_steps()} steps on {program.size} ranks over {transport}: "
          f"{'passed' if verdict.ok else 'FAILED'}")
    if not verdict.ok:
        print(describe_failure(verdict))
        print()
        print(render(program, transport, args.plugin, "replayed program").rstrip())
    return 0 if verdict.ok else EXIT_FAILED


def _fuzz(group, transport: str, space: Space, args: argparse.Namespace, ranks: str) -> int:
    from .report import Progress, failure_story, summary
    from .session import Session
    from .snippet import render

    seed = args.seed if args.seed is not None else secrets.randbelow(1 << 31)
    seconds = args.seconds if args.seconds is not None or args.programs is not None else 60.0
    budget = f"{args.programs} programs" if args.programs is not None else f"{seconds:g} s"
    plugins = f"; plugins: {' '.join(args.plugin)}" if args.plugin else ""
    print(f"colls fuzz: {transport}, {ranks} ranks, seed {seed}, {budget}{plugins}", flush=True)
    progress = Progress(transport, quiet=args.quiet)
    session = Session(group, space, seed=seed, programs=args.programs, seconds=seconds,
                      deadline_s=args.deadline, shrink_seconds=args.shrink_seconds, on_progress=progress)
    found = session.run()
    progress.done()
    print(summary(session.stats, transport, ranks))
    if found is None:
        return 0
    headline = f"colls fuzz on {transport}, seed {seed}: {found.verdict.primary['kind']}"
    print()
    print(failure_story(found, transport, render(found.program, transport, args.plugin, headline),
                        replay_command(transport, found.program, args.plugin)))
    sys.stdout.flush()
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    """`python -m colls.fuzz.cli ...`: the same as `colls fuzz ...`."""
    parser = argparse.ArgumentParser(prog="colls fuzz")
    add_arguments(parser)
    parser.set_defaults(parser=parser)
    return fuzz_command(parser.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
