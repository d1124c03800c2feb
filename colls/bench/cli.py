"""`colls bench`: parse the options, start the ranks under mpiexec, then write the JSON and the plot.

The ranks measure and print (rank 0, row by row); this parent only prepares the spec, waits, cleans
up, and turns the records rank 0 left behind into `--json` and `--plot` files and an exit status.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.util
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import colls
from colls.plugins import load, with_plugins

from .report import markdown, plot, write_json
from .spec import BASELINES, COLLECTIVES, DTYPES, OPS, Spec, error_path, format_bytes, parse_size, size_steps

EXIT_WRONG = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
PR_SET_PDEATHSIG = 1   # prctl(2): the signal a child gets when its parent dies
_FOREIGN_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_")   # an outer mpiexec's variables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `colls bench` (nccl-tests' letters where they do not clash with -n ranks)."""
    parser.add_argument("-n", "--nprocs", type=int, default=2, metavar="N", help="ranks (default 2)")
    parser.add_argument("--transport", choices=("shm", "mpi", "cuda_ipc"), default="shm",
                        help="what colls runs over (default shm); MPI and Gloo baselines run beside it; "
                             "cuda_ipc: cupy buffers on the GPU, beside the device copy and a host-staged "
                             "path")
    parser.add_argument("-c", "--collectives", default="all_reduce", metavar="LIST",
                        help=f"comma-separated, or 'all': {','.join(COLLECTIVES)} (default all_reduce)")
    parser.add_argument("-b", "--minbytes", default=None, metavar="SIZE",
                        help="smallest buffer, K/M/G suffixes allowed (default 8; --memcheck: 1M)")
    parser.add_argument("-e", "--maxbytes", default=None, metavar="SIZE",
                        help="largest buffer (default 256M; --memcheck: the -b size)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2, metavar="F",
                        help="multiply the size by F between points (default 2)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--op", choices=OPS, default="sum", help="reduction operator (default sum)")
    parser.add_argument("--algorithm", default="auto", metavar="NAME",
                        help="force one colls algorithm for every collective, or 'auto' (the library's "
                             "choice, shown per row)")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="a module or .py file of colls.algorithm schedules, loaded here and on every "
                             "rank, so that --algorithm may name one (timed beside the catalogue's "
                             "own choice, 'auto', and the baselines); repeatable")
    parser.add_argument("-w", "--warmup", type=int, default=5, metavar="W",
                        help="untimed calls before timing each point (default 5)")
    parser.add_argument("--iters", type=int, default=None, metavar="N",
                        help="timed calls per point (default: as many as fit --budget, 5 to 200)")
    parser.add_argument("--budget", type=float, default=0.2, metavar="SECONDS",
                        help="without --iters, time spent on each implementation at each size (default 0.2)")
    parser.add_argument("--baselines", default="mpi,gloo", metavar="LIST",
                        help="what to time beside colls: mpi, gloo or both (default mpi,gloo; Gloo only "
                             "where torch is installed)")
    parser.add_argument("--no-baselines", action="store_true", help="time colls only (no MPI, no Gloo)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write every record to FILE")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw busbw against size")
    parser.add_argument("--markdown", default=None, metavar="FILE.md",
                        help="write the tables in Markdown (as in bench/RESULTS.md)")
    parser.add_argument("--memcheck", action="store_true",
                        help="instead: resident memory per rank before and after back-to-back calls")
    parser.add_argument("--memcheck-calls", type=int, default=1000, metavar="N",
                        help="calls in the memory check (default 1000)")
    parser.add_argument("--memcheck-limit", default="2M", metavar="SIZE",
                        help="fail if any rank grows by more than this (default 2M)")
    parser.add_argument("--pin", action="store_true",
                        help="pin rank r to the (r mod C)-th of the C CPUs it may run on, so that with "
                             "more ranks than CPUs every run shares the cores out alike (recorded as "
                             "each point's placement; unpinned, the kernel's sharing varies from run "
                             "to run)")
    parser.add_argument("--registered", action="store_true",
                        help="give colls its buffers in registered memory (colls.alloc: peers copy big "
                             "messages straight out of them); MPI and Gloo keep buffers of their own, "
                             "mapped as without the option, which suit them best")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="kill the ranks after this long and exit 124")


def build_spec(args: argparse.Namespace) -> Spec:
    """The run's settings from the options, or ValueError with what to change."""
    if args.nprocs < 1:
        raise ValueError(f"-n must be at least 1, not {args.nprocs}")
    names = COLLECTIVES if args.collectives == "all" else tuple(
        name.strip() for name in args.collectives.split(",") if name.strip())
    unknown = [name for name in names if name not in COLLECTIVES]
    if unknown or not names:
        raise ValueError(f"-c {args.collectives}: unknown {unknown}; choose from {','.join(COLLECTIVES)}")
    baselines = () if args.no_baselines else tuple(
        name.strip() for name in args.baselines.split(",") if name.strip())
    if set(baselines) - set(BASELINES):
        raise ValueError(f"--baselines {args.baselines}: choose from {','.join(BASELINES)}")
    algorithm = None if args.algorithm == "auto" else args.algorithm
    for plugin in args.plugin:   # here too, so that --algorithm is checked against its schedules
        load(plugin)
    for name in names if algorithm else ():
        if algorithm not in colls.algorithms(name):
            raise ValueError(f"--algorithm {algorithm}: {name} has no such algorithm; choose from "
                             f"{', '.join(colls.algorithms(name))} (or run one collective at a time)")
    if args.op in ("band", "bor", "bxor") and args.dtype.startswith("float"):
        raise ValueError(f"--op {args.op} needs an integer --dtype (int32 or int64)")
    low = parse_size(args.minbytes or ("1M" if args.memcheck else "8"))
    high = parse_size(args.maxbytes) if args.maxbytes else (low if args.memcheck else parse_size("256M"))
    if args.warmup < 0 or (args.iters is not None and args.iters < 1) or args.memcheck_calls < 1:
        raise ValueError("-w must be >= 0, --iters and --memcheck-calls >= 1")
    return Spec(ranks=args.nprocs, transport=args.transport, collectives=names,
                sizes=tuple(size_steps(low, high, args.stepfactor)), dtype=args.dtype, op=args.op,
                algorithm=algorithm, warmup=args.warmup, iters=args.iters, budget_s=args.budget,
                baselines=baselines, memcheck=args.memcheck,
                memcheck_calls=args.memcheck_calls, pin=args.pin, registered=args.registered,
                plugins=with_plugins(args.plugin))


def _child_environment(job: str, plugins: str = "") -> dict[str, str]:
    """Ours, minus an outer MPI job's variables, plus the path to this checkout, the job id and
    the plugins every rank loads (COLLS_PLUGINS)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_FOREIGN_LAUNCHER_PREFIXES)}
    if plugins:
        env["COLLS_PLUGINS"] = plugins
    root = str(Path(colls.__file__).resolve().parent.parent)   # transports/ and algorithms/ live here too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["COLLS_JOB"] = job   # segments are named after it, so a crashed rank's can be removed
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:
    """In mpiexec's process before exec: the kernel kills it should `colls bench` die first."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass   # not Linux: the SIGTERM handler still covers the usual ways to stop us


def _run_ranks(spec: Spec, spec_path: str, timeout: float | None) -> int:
    """mpiexec -n N python -m colls.bench.runner SPEC; returns its exit status (124 on timeout)."""
    from colls.launcher import find_mpiexec
    from transports.segment import mpich_segments, remove_job_segments, remove_orphaned_mpich_segments

    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("colls bench: needs mpiexec and mpi4py: pip install 'colls[bench]'", file=sys.stderr)
        return EXIT_USAGE
    job = secrets.token_hex(6)
    segments_before = mpich_segments()
    command = [mpiexec, "-n", str(spec.ranks), sys.executable, "-m", "colls.bench.runner", spec_path]
    child = subprocess.Popen(command, env=_child_environment(job, spec.plugins), start_new_session=True,
                             preexec_fn=_die_with_parent)
    terminated: list[int] = []

    def on_sigterm(signum: int, frame: object) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt   # leave the wait below and take the ranks down with us

    previous = None
    if threading.current_thread() is threading.main_thread():   # `timeout`, CI runners, kill(1)
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        status = child.wait(timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as stop:
        os.killpg(child.pid, signal.SIGKILL)   # Hydra's proxies then end the ranks themselves
        child.wait()
        timed_out = isinstance(stop, subprocess.TimeoutExpired)
        why = f"timed out after {timeout:g} s" if timed_out else "interrupted"
        print(f"colls bench: {why}; ranks killed", file=sys.stderr)
        status = EXIT_TIMEOUT if timed_out else 128 + (terminated[0] if terminated else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        remove_job_segments(job)
    if status != 0:
        _report_rank_errors(spec, spec_path)
    # (after a clean exit too: jobs whose ranks had all exited 0 have left one)
    remove_orphaned_mpich_segments(segments_before)
    return status


def _report_rank_errors(spec: Spec, spec_path: str) -> None:
    """Print the traceback of every rank that failed, as its rank left it (see runner.main)."""
    for rank in range(spec.ranks):
        try:
            with open(error_path(spec_path, rank)) as handle:
                reason = handle.read()
        except OSError:
            continue   # this rank did not fail, or was killed before it could say why
        print(f"colls bench: rank {rank} failed:\n{reason}", end="" if reason.endswith("\n") else "\n",
              file=sys.stderr)


def _read_records(path: str) -> tuple[dict, list[dict]]:
    """(rank 0's meta record, the measurement records) from the records file."""
    meta, records = {}, []
    if os.path.exists(path):
        with open(path) as handle:
            for line in handle:
                record = json.loads(line)
                if record.get("mode") == "meta":
                    meta = {key: value for key, value in record.items() if key != "mode"}
                else:
                    records.append(record)
    return meta, records


def _memcheck_failures(records: list[dict], limit: int) -> list[str]:
    """A line for every rank whose resident memory grew by more than `limit` bytes."""
    return [f"{record['collective']}: rank {rank} grew by {growth / 1024:.0f} KiB "
            f"(limit {format_bytes(limit)})"
            for record in records for rank, growth in enumerate(record["growth_bytes"]) if growth > limit]


def bench_command(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 when every result was right (and memory stayed flat), else non-zero."""
    try:
        spec = build_spec(args)
        limit = parse_size(args.memcheck_limit)
    except ValueError as error:
        args.parser.error(str(error))
    if spec.transport == "cuda_ipc":
        if importlib.util.find_spec("cupy") is None:
            print("colls bench --transport cuda_ipc: needs cupy and an NVIDIA GPU: pip install cupy-cuda12x "
                  "(or cupy-cuda13x)", file=sys.stderr)
            return EXIT_USAGE
        return gpu_bench(args, spec)
    if importlib.util.find_spec("mpi4py") is None:
        print("colls bench: needs mpi4py and mpiexec: pip install 'colls[bench]'", file=sys.stderr)
        return EXIT_USAGE
    started = time.time()
    command = shlex.join(["colls", *sys.argv[1:]])   # as typed, for the JSON and Markdown files
    with tempfile.TemporaryDirectory(prefix="colls-bench-") as folder:
        spec = dataclasses.replace(spec, records_path=os.path.join(folder, "records.jsonl"))
        spec_path = os.path.join(folder, "spec.json")
        spec.save(spec_path)
        status = _run_ranks(spec, spec_path, args.timeout)
        meta, records = _read_records(spec.records_path)
    if args.json:
        settings = {key: value for key, value in dataclasses.asdict(spec).items() if key != "records_path"}
        write_json(args.json, {"tool": "colls bench", "command": command,
                               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                               "wall_s": round(time.time() - started, 2), "spec": settings, **meta},
                   records)
        print(f"# wrote {len(records)} records to {args.json}")
    if args.markdown:
        heading = f"`{command}`, {time.strftime('%Y-%m-%d', time.localtime(started))}"
        Path(args.markdown).write_text(markdown(records, heading))
        print(f"# wrote the Markdown tables to {args.markdown}")
    if args.plot:
        title = f"colls bench: {spec.ranks} ranks, {spec.dtype} {spec.op}, colls over {spec.transport}"
        problem = plot(args.plot, records, title)
        print(f"# {problem}" if problem else f"# plotted busbw against size to {args.plot}")
    if status != 0:
        return status
    if any(record.get("wrong") for record in records):
        print("colls bench: some results were wrong (see #wrong)", file=sys.stderr)
        return EXIT_WRONG
    if spec.memcheck:
        failures = _memcheck_failures(records, limit)
        for line in failures:
            print(f"colls bench --memcheck: {line}", file=sys.stderr)
        if failures:
            return EXIT_WRONG
    return 0


def gpu_bench(args: argparse.Namespace, spec: Spec) -> int:
    """`colls bench --transport cuda_ipc`: the ranks run `colls.bench.gpu` under `colls run`."""
    from colls.launcher import launch

    started = time.time()
    command = shlex.join(["colls", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="colls-bench-") as folder:
        spec = dataclasses.replace(spec, records_path=os.path.join(folder, "records.jsonl"), baselines=())
        spec_path = os.path.join(folder, "spec.json")
        spec.save(spec_path)
        plugins = {"COLLS_PLUGINS": spec.plugins} if spec.plugins else {}
        status = launch(["-m", "colls.bench.gpu", spec_path], spec.ranks, "cuda_ipc", args.timeout,
                        env={"PYTHONUNBUFFERED": "1", **plugins})
        _, records = _read_records(spec.records_path)
    if args.json:
        settings = {key: value for key, value in dataclasses.asdict(spec).items() if key != "records_path"}
        write_json(args.json, {"tool": "colls bench", "command": command,
                               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                               "wall_s": round(time.time() - started, 2), "spec": settings}, records)
        print(f"# wrote {len(records)} records to {args.json}")
    if status != 0:
        return status
    if any(record.get("wrong") for record in records):
        print("colls bench: some results were wrong (see #wrong)", file=sys.stderr)
        return EXIT_WRONG
    return 0
