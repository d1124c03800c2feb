"""mpi4py's own test modules, run against colls' facade (`colls.compat`) on real ranks.

The test files come from mpi4py's source distribution on PyPI, fetched at test time (never
committed) and cached in pytest's cache dir; without network the tests skip saying so. Every rank
runs mpi4py's unittest classes with `mpi4py` in `sys.modules` being the facade, the way a user runs
a script: `colls run --as-mpi4py -n N --transport shm|mpi`, one process per rank. Run this file as a
script (`--worker`) to be one rank, or with `--threads N` all ranks as threads of one process
(`local`; each rank gets its own copy of the modules).

Jobs: shm at 1, 2 and 3 ranks, mpi at 2, each running MODULES (test_datatype, which sends nothing,
at 2 ranks only) with numpy arrays, and with every buffer backend of arrayimpl (FakeGPU arrays
too) on shm at 2 ranks; COLLS_MPI4PY_SUITE=full: everything everywhere. Nothing is
excluded but the tests of EXCLUDED, each for a feature the facade declares out of scope; what
mpi4py skips by itself is listed, with its reason, in docs/mpi4py.md (the test checks that every
skip reason it meets is there).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
MPI4PY_VERSION = "4.1.2"
MODULES = ("test_cco_buf", "test_cco_vec", "test_cco_nb_buf", "test_cco_nb_vec", "test_cco_obj",
           "test_cco_ngh_buf", "test_cco_ngh_obj", "test_p2p_buf", "test_p2p_obj", "test_comm",
           "test_op", "test_status", "test_request", "test_datatype", "test_util_pkl5")
SUPPORT = ("mpiunittest", "mpitestutil", "arrayimpl", "dlpackimpl")
EXCLUDED: dict[str, str] = {}   # test method -> the out-of-scope feature it needs (none now)
JOBS = (("shm", 1), ("shm", 2), ("shm", 3), ("mpi", 2))
FULL = os.environ.get("COLLS_MPI4PY_SUITE", "") == "full"
# test_datatype sends no message (it builds and inspects datatypes): its outcome cannot depend on
# the world's size, and it is the slowest module, so it runs at 2 ranks only (every job: FULL)
SIZE_FREE = ("test_datatype",)


def modules_for(size: int) -> list[str]:
    """The modules a job of `size` ranks runs."""
    return [name for name in MODULES if FULL or size == 2 or name not in SIZE_FREE]
DOCS = REPO_ROOT / "docs" / "mpi4py.md"


def backends_for(transport: str, size: int) -> str:
    """"all" buffer backends of arrayimpl (shm at 2 ranks), or "numpy" only: the others differ
    only in how a buffer is acquired, which depends on neither the world's size nor the transport."""
    return "all" if FULL or (transport, size) == ("shm", 2) else "numpy"


# -- the worker: one rank (or all ranks as threads) running mpi4py's unittest classes --------------

def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_modules(suite_dir: Path, modules: list[str], backends: str = "all") -> list:
    """`arrayimpl` (keeping the backends asked for) and the test modules bound to it."""
    arrayimpl = _load(suite_dir / "arrayimpl.py", "arrayimpl")
    arrayimpl.ArrayBackends[:] = [backend for backend in arrayimpl.ArrayBackends
                                  if backends == "all" or backend.backend == backends]
    return [_load(suite_dir / f"{name}.py", name) for name in modules]


def load_rank_copy(suite_dir: Path, modules: list[str], backends: str = "all") -> list:
    """Fresh copies of the modules for one thread rank (their `loop`/`scalar` keep state in
    function attributes, which threads would share); sys.modules restored."""
    saved = {name: sys.modules.get(name) for name in ("arrayimpl", *modules)}
    try:
        return load_modules(suite_dir, modules, backends)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def build_suite(modules: list) -> unittest.TestSuite:
    """Every test of the modules except the excluded ones."""
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for module in modules:
        for test in _flatten(loader.loadTestsFromModule(module)):
            if test.id().rsplit(".", 1)[-1] not in EXCLUDED:
                suite.addTest(test)
    return suite


def _flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _flatten(item)
        else:
            yield item


def run_suite(modules: list) -> dict:
    """Run the suite on this rank; the counts and the text of any failure."""
    result = unittest.TestResult()
    build_suite(modules).run(result)
    return {"run": result.testsRun, "skipped": len(result.skipped),
            "skip_reasons": sorted({reason for _, reason in result.skipped}),
            "failures": [f"{test.id()}: {text}" for test, text in result.failures],
            "errors": [f"{test.id()}: {text}" for test, text in result.errors]}


def worker(suite_dir: Path, modules: list[str], results: Path, threads: int, backends: str) -> None:
    """Run the suite as the ranks of this job and write results/rank<r>.json for each."""
    sys.path.insert(0, str(suite_dir))
    from colls.compat import install

    install()
    if threads:
        import colls
        from colls.compat import bind

        copies = [load_rank_copy(suite_dir, modules, backends) for _ in range(threads)]

        def rank_main(comm):
            with bind(comm):
                return run_suite(copies[comm.rank])

        for rank, outcome in enumerate(colls.spawn(rank_main, threads, transport="local")):
            (results / f"rank{rank}.json").write_text(json.dumps(outcome))
        return
    from colls.compat import MPI

    outcome = run_suite(load_modules(suite_dir, modules, backends))
    (results / f"rank{MPI.COMM_WORLD.Get_rank()}.json").write_text(json.dumps(outcome))


# -- pytest side ------------------------------------------------------------------------------------

def fetch_sdist(cache_dir: Path) -> Path:
    """mpi4py's test/ and demo/ folders from its sdist (downloaded once into cache_dir), or a skip."""
    root = cache_dir / f"mpi4py-{MPI4PY_VERSION}"
    if (root / "complete").exists():
        return root
    download = Path(tempfile.mkdtemp(prefix="mpi4py-sdist-"))
    try:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   f"mpi4py=={MPI4PY_VERSION}", "-d", str(download), "--quiet"]
        # without build isolation pip only reads the metadata (~2 s); with it, it first installs
        # the build backend (minutes), so that is the fallback
        for extra in (["--no-build-isolation"], []):
            done = subprocess.run(command + extra, capture_output=True, text=True, timeout=600)
            archives = list(download.glob("mpi4py-*.tar.gz"))
            if archives:
                break
        else:
            pytest.skip(f"cannot download mpi4py {MPI4PY_VERSION}'s sdist from PyPI (no network?): "
                        f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
        staging = root.with_suffix(".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        prefix = f"mpi4py-{MPI4PY_VERSION}/"
        with tarfile.open(archives[0]) as archive:
            members = [member for member in archive.getmembers() if member.isfile()
                       and member.name.startswith((prefix + "test/", prefix + "demo/"))]
            for member in members:
                target = staging / member.name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.extractfile(member).read())
        (staging / "complete").write_text("")
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
        return root
    finally:
        shutil.rmtree(download, ignore_errors=True)


def fetch_suite(cache_dir: Path) -> Path:
    """mpi4py's test/ folder (see `fetch_sdist`)."""
    return fetch_sdist(cache_dir) / "test"


def fetch_demos(cache_dir: Path) -> Path:
    """mpi4py's demo/ folder (see `fetch_sdist`)."""
    return fetch_sdist(cache_dir) / "demo"


@pytest.fixture(scope="module")
def suite_dir(request) -> Path:
    return fetch_suite(Path(request.config.cache.mkdir("mpi4py-suite")))


def run_job(suite_dir: Path, transport: str, size: int, tmp_path: Path) -> list[dict]:
    """Run MODULES on `size` ranks over `transport` ("local": thread ranks); every rank's results."""
    env = dict(os.environ, COLLS_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("COLLS_TRANSPORT", None)
    worker_args = [__file__, "--worker", str(suite_dir), "--results", str(tmp_path),
                   "--backends", backends_for(transport, size), *modules_for(size)]
    if transport == "local":
        command = [sys.executable, *worker_args, "--threads", str(size)]
    else:
        command = [sys.executable, "-m", "colls.cli", "run", "--as-mpi4py", "-n", str(size),
                   "--transport", transport, "--timeout", "500", *worker_args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(size)]


def documented_skips() -> str:
    """The docs page's text, where every reason mpi4py gives for skipping a test must appear."""
    return DOCS.read_text()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("transport", "size"), JOBS, ids=[f"{t}-{n}" for t, n in JOBS])
def test_mpi4py_suite(suite_dir: Path, transport: str, size: int, tmp_path: Path) -> None:
    if transport == "mpi":
        pytest.importorskip("mpi4py")
    start = time.perf_counter()
    outcomes = run_job(suite_dir, transport, size, tmp_path)
    problems = [line for rank, outcome in enumerate(outcomes)
                for line in (f"rank {rank}: {text}" for text in outcome["failures"] + outcome["errors"])]
    assert not problems, "\n".join(problems[:5])
    counts = {(outcome["run"], outcome["skipped"]) for outcome in outcomes}
    assert len(counts) == 1, f"ranks ran different numbers of tests: {counts}"
    (run, skipped), = counts
    assert run > 0
    docs = documented_skips()
    undocumented = sorted({reason for outcome in outcomes for reason in outcome["skip_reasons"]
                           if f"`{reason}`" not in docs})
    assert not undocumented, f"skip reasons missing from docs/mpi4py.md: {undocumented}"
    backends = backends_for(transport, size)
    print(f"mpi4py {MPI4PY_VERSION} suite on {transport} x {size} ({backends} backends): "
          f"{run} run, {run - skipped} passed, {skipped} skipped by mpi4py itself, "
          f"{len(EXCLUDED)} excluded, {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description="one rank (or, with --threads, all) of the suite")
    parser.add_argument("--worker", type=Path, required=True, help="folder with mpi4py's test files")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--backends", choices=("all", "numpy"), default="all")
    parser.add_argument("modules", nargs="+")
    args = parser.parse_args()
    worker(args.worker, args.modules, args.results, args.threads, args.backends)


if __name__ == "__main__":
    main()
