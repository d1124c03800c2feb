"""mpi4py's own `demo/` programs, run unchanged under `colls run --as-mpi4py` and compared with real
mpi4py + MPICH (`mpiexec`) in the same run.

The demos come from mpi4py's source distribution on PyPI, fetched at test time and cached with the
test suite's files (`test_compat_mpi4py.fetch_suite`); never committed. Each demo runs at N = 2, 3, 4
ranks (by default one of them, see `sizes_for`) both ways and must exit 0 both ways with the same
output: lines sorted (ranks print concurrently) and, for the demos that print timings, every decimal
number masked.

Not run, because they use what the facade declares out of scope (it raises NotImplementedError naming
the feature): one-sided windows (compute-pi/cpi-rma, nxtval-onesided, nxtval-scalable, nxtval-mpi3),
dynamic processes (compute-pi/cpi-dpm, nxtval-dynproc, mandelbrot-master, spawning/), MPI I/O and
windows together (init-fini/test_0 creates a window and a file). Not programs of the facade's
subject: wrap-*, cython, embedding, libmpi-cffi, python-config, check-mpiexec (C, Fortran and
build-system demos), futures/ (mpi4py.futures spawns or needs `python -m mpi4py.futures`),
test-run/ (tests real mpi4py's own `python -m mpi4py` command line in subprocesses).

Run this file as a script to print every demo's outcome (`--sizes 2 3`, `--only osu`).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_compat_mpi4py import REPO_ROOT, fetch_demos

# (folder under demo/, script, arguments, standard input, prints timings)
DEMOS = [
    ("", "helloworld.py", (), "", False),
    ("compute-pi", "cpi-cco.py", (), "100\n0\n", False),
    ("sequential", "test_seq.py", (), "", False),
    ("reductions", "test_reductions.py", ("-q",), "", True),
    ("nxtval", "nxtval-threads.py", (), "", False),
    *[("mpi-ref-v1", f"ex-{number}.py", (), "", False)
      for number in ("2.01", "2.08", "2.16", "2.29", "2.32", "2.34", "2.35", "3.01", "3.02", "3.03",
                     "3.04", "3.05", "3.06", "3.07", "3.08", "3.09", "3.11", "3.12", "3.13")],
    ("mandelbrot", "mandelbrot.py", (), "", True),
    ("mandelbrot", "mandelbrot-seq.py", (), "", True),
    ("profiling", "cpi.py", (), "", False),
    ("profiling", "ring.py", (), "", True),
    ("profiling", "threads.py", (), "", False),
    ("threads", "sendrecv.py", (), "", False),
    *[("init-fini", f"test_{number}.py", (), "", False) for number in (1, 2, 3, 4, 5, 6)],
    *[("", f"osu_{name}.py", (), "", True)
      for name in ("allgather", "alltoall", "alltoallv", "barrier", "bcast", "bibw", "bw", "gather",
                   "latency", "multi_lat", "scatter")],
]
SIZES = (2, 3, 4)
# The whole matrix takes over ten minutes on 2 cores, so by default each demo runs at one size, 3
# ranks, and of the osu_* benchmarks (timing loops of 10-25 s each) one point-to-point and one
# collective at 2. COLLS_MPI4PY_DEMOS=full runs every demo at every size of SIZES.
DEFAULT_OSU = ("osu_bw.py", "osu_bcast.py")
FULL = os.environ.get("COLLS_MPI4PY_DEMOS", "") == "full"


def sizes_for(demo: tuple) -> tuple[int, ...]:
    """The world sizes a demo runs at (none: only in the full run)."""
    if FULL:
        if demo[1] == "osu_multi_lat.py":   # pairs rank i with i + n/2 (a float at odd n): at 3 its
            return (2, 4)                   # ranks wait forever under real mpi4py + MPICH as well
        return SIZES
    if demo[1].startswith("osu_"):   # timing loops of 10-25 s each: two stand for them by default
        return (2,) if demo[1] in DEFAULT_OSU else ()
    return (3,)
PROMPT_END = "(0 quits) "   # compute-pi's input() prompt
RANK_LABEL = re.compile(r"\[\d+\] ")
NUMBER = re.compile(r"[-+]?\d+\.\d*(?:[eE][-+]?\d+)?")


def demo_id(demo: tuple) -> str:
    folder, script = demo[0], demo[1]
    return f"{folder}/{script}" if folder else script


def normalized(output: str, timings: bool) -> list[str]:
    """The output's lines, sorted, with runs of blanks made one; where the demo prints timings,
    decimal numbers masked. A prompt (text before `PROMPT_END`, which has no line break of its own)
    is a line of its own: when it is relayed, relative to the lines after it, differs."""
    lines = output.replace(PROMPT_END, PROMPT_END + "\n").splitlines()
    lines = [NUMBER.sub("<t>", line) if timings else line for line in lines]
    return sorted(" ".join(line.split()) for line in lines if line.strip())


def run_demo(demo_dir: Path, demo: tuple, size: int, colls: bool) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one demo at `size` ranks, by colls' facade or by real mpi4py."""
    folder, script, args, stdin, _ = demo
    env = dict(os.environ, MPLBACKEND="Agg", COLLS_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("COLLS_TRANSPORT", None)
    if colls:
        command = [sys.executable, "-m", "colls.cli", "run", "--as-mpi4py", "-n", str(size), "--timeout",
                   "120", script, *args]
    else:
        mpiexec = Path(sys.executable).with_name("mpiexec")
        # (-prepend-rank: MPICH's launcher can merge two ranks' lines into one; its rank labels
        # show where each begins, so they are turned into line breaks)
        command = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-prepend-rank", "-n", str(size),
                   sys.executable, script, *args]
    done = subprocess.run(command, cwd=demo_dir / folder, input=stdin, capture_output=True, text=True,
                          env=env, timeout=180)
    output = done.stdout if colls else RANK_LABEL.sub("\n", done.stdout)
    return done.returncode, output, done.stderr[-3000:]


def compare(demo_dir: Path, demo: tuple, size: int) -> str | None:
    """None if the demo gives the same output and exit status both ways (a demo may refuse a world
    size, as osu_bw does all but 2), else what differs."""
    timings = demo[4]
    reference_status, reference, reference_errors = run_demo(demo_dir, demo, size, colls=False)
    status, ours, errors = run_demo(demo_dir, demo, size, colls=True)
    if status != reference_status:
        return (f"exit {status} under colls, {reference_status} under real mpi4py:\n--- mpi4py\n"
                f"{reference[-1000:]}{reference_errors[-1000:]}\n--- colls\n{ours[-1500:]}{errors}")
    if normalized(ours, timings) != normalized(reference, timings):
        return f"outputs differ:\n--- mpi4py\n{reference[-1500:]}\n--- colls\n{ours[-1500:]}"
    return None


@pytest.fixture(scope="module")
def demo_dir(request) -> Path:
    pytest.importorskip("mpi4py")
    return fetch_demos(Path(request.config.cache.mkdir("mpi4py-suite")))


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("demo", "size"), [(demo, size) for demo in DEMOS for size in sizes_for(demo)],
                         ids=[f"{demo_id(demo)}-{size}" for demo in DEMOS for size in sizes_for(demo)])
def test_demo_same_output(demo_dir: Path, demo: tuple, size: int) -> None:
    problem = compare(demo_dir, demo, size)
    assert problem is None, problem


def main() -> None:
    parser = argparse.ArgumentParser(description="run mpi4py's demos both ways and print the outcome")
    parser.add_argument("demo_dir", type=Path, help="mpi4py's demo/ folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--only", default="", help="run demos whose path contains this")
    args = parser.parse_args()
    for demo in DEMOS:
        if args.only not in demo_id(demo):
            continue
        for size in args.sizes:
            problem = compare(args.demo_dir, demo, size)
            print(f"{'ok  ' if problem is None else 'FAIL'} {demo_id(demo)} n={size}", flush=True)
            if problem is not None:
                print("     " + "\n     ".join(problem.splitlines()[-6:]), flush=True)


if __name__ == "__main__":
    main()
