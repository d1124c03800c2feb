"""The plugin API (docs/plugins.md): registration errors, loading by module, file and entry point,
the example plugin on local, shm, mpi and sim, and the tutorial's walk (a planted bug fuzzed and
shrunk, the fix fuzzed clean, benchmarked, planned at 1,024 ranks) with short budgets."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colls
from algorithms.channel import Channel
from algorithms.registry import CATALOGUE, SIGNATURES
from colls.launcher import find_mpiexec

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "plugin" / "tree_broadcast.py"
CHECK = ROOT / "examples" / "plugin" / "check_tree.py"
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and find_mpiexec() is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec (pip install 'colls[mpi]')")


def child_env(*paths: Path, **extra: str) -> dict[str, str]:
    """Our environment without COLLS_* choices, the repo (and `paths`) importable, a short timeout."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("COLLS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, paths), str(ROOT), env.get("PYTHONPATH")]))
    env["COLLS_TIMEOUT"] = "60"
    env["COLLS_JOB"] = "test" + secrets.token_hex(4)
    env.update(extra)
    return env


def colls_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`colls args…` as a subprocess in the repo, output captured."""
    return subprocess.run([sys.executable, "-m", "colls.cli", *args], cwd=ROOT, env=env or child_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def restored_catalogue():
    """The catalogue as it was, after a test that registers into this process's."""
    saved = {collective: dict(table) for collective, table in CATALOGUE.items()}
    modules = set(sys.modules)
    yield
    CATALOGUE.clear()
    CATALOGUE.update(saved)
    for name in set(sys.modules) - modules:
        if name.startswith("colls_plugin_"):
            del sys.modules[name]


# -- registration ----------------------------------------------------------------------------------

def test_registration_refuses_what_cannot_run_naming_the_argument(restored_catalogue) -> None:
    def ok(channel, buf, op):
        pass

    with pytest.raises(colls.InvalidArgument, match=r"collective='allreduce'"):
        colls.algorithm("allreduce", "mine", summary="s")(ok)
    with pytest.raises(colls.InvalidArgument, match=r"name='ring'.*already has"):
        colls.algorithm("all_reduce", "ring", summary="s")(ok)
    with pytest.raises(colls.InvalidArgument, match=r"must take \(channel, buf, op\)"):
        colls.algorithm("all_reduce", "mine", summary="s")(lambda channel, buf: None)
    with pytest.raises(colls.InvalidArgument, match=r"cost=3"):
        colls.algorithm("all_reduce", "mine", summary="s", cost=3)
    with pytest.raises(colls.InvalidArgument, match=r"name='my ring'"):
        colls.algorithm("all_reduce", "my ring", summary="s")
    assert "mine" not in colls.algorithms("all_reduce")
    colls.algorithm("all_reduce", "mine", summary="s", keeps_rank_order=True)(ok)
    registered = CATALOGUE["all_reduce"]["mine"]
    assert registered.plugin and not registered.commutative_only
    colls.algorithm("all_reduce", "mine", summary="s")(ok)   # the same definition again: replaced
    assert CATALOGUE["all_reduce"]["mine"].commutative_only


def test_every_catalogue_algorithm_takes_its_collectives_arguments() -> None:
    # (the catalogue registers through the same checked function: this holds by construction)
    for collective, table in CATALOGUE.items():
        for algorithm in table.values():
            if not algorithm.plugin:
                wanted = 1 + len(SIGNATURES[collective]) + algorithm.takes_source
                inspect.signature(algorithm.run).bind(*range(wanted))


def test_the_docs_tables_match_the_channel_and_the_signatures() -> None:
    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    verbs = re.findall(r"^\| `channel\.(\w+)\(", page, re.M)
    public = sorted(name for name in vars(Channel) if not name.startswith("_")
                    and callable(getattr(Channel, name)) and name != "exchange_init")
    assert sorted(verbs) == public
    rows = dict(re.findall(r"^\| (\w+) \| (`[^|]*`|\(none\)) \|$", page, re.M))
    assert {collective: tuple(re.findall(r"\w+", arguments.replace("(none)", "")))
            for collective, arguments in rows.items()} == SIGNATURES


# -- by module, on local and sim in this process ----------------------------------------------------

def test_a_plugin_file_runs_on_local_threads_and_the_simulator(restored_catalogue) -> None:
    from colls.plan.simulate import simulate
    from colls.plan.topology import Cluster
    from colls.plugins import load

    load(str(PLUGIN))
    assert "binary_tree" in colls.algorithms("broadcast")

    def body(comm):
        for count in (0, 1, 4097, 70001):
            for root in range(comm.size):
                want = np.arange(count, dtype=np.int64) * (root + 1)
                got = comm.broadcast(want if comm.rank == root else np.zeros(count, np.int64), root=root,
                                     algorithm="binary_tree")
                assert np.array_equal(got, want)

    for ranks in (1, 2, 5):
        colls.spawn(body, ranks, transport="local", timeout=60)
    cluster = Cluster(nodes=2, ranks_per_node=4)
    result = simulate("broadcast", "binary_tree", 1 << 20, cluster.network(), cluster.size, cluster.gamma)
    assert result.seconds > 0 and result.messages == (cluster.size - 1) * 64   # every rank gets 64 pieces


# -- by module on processes: shm (colls run --plugin) and mpi (COLLS_PLUGINS under mpiexec) ---------

@pytest.mark.timeout(60)
def test_colls_run_hands_the_plugin_to_shm_ranks() -> None:
    result = colls_cli("run", "-n", "3", "--timeout", "50", "--plugin", str(PLUGIN), str(CHECK))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("binary_tree right on shm x3") == 3


@needs_mpi
@pytest.mark.timeout(60)
def test_colls_plugins_loads_it_under_mpiexec() -> None:
    result = subprocess.run([find_mpiexec(), "-n", "3", sys.executable, str(CHECK)], cwd=ROOT,
                            env=child_env(COLLS_PLUGINS=str(PLUGIN)), capture_output=True, text=True,
                            timeout=50)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("binary_tree right on mpi x3") == 3


# -- by entry point: an installed package's, through importlib.metadata -----------------------------

@pytest.fixture
def installed(tmp_path) -> Path:
    """A folder holding a module and its dist-info with a `colls.algorithms` entry point, as pip
    installs a package: its broadcast is the example's, registered as `binary_tree_ep`."""
    source = PLUGIN.read_text(encoding="utf-8").replace('"binary_tree"', '"binary_tree_ep"')
    (tmp_path / "colls_tree_ep.py").write_text(source, encoding="utf-8")
    info = tmp_path / "colls_tree_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: colls-tree-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[colls.algorithms]\ntree = colls_tree_ep\n")
    return tmp_path


LOCAL_CHECK = """
import numpy as np, colls
def body(comm):
    for count in (0, 4097, 70001):
        want = np.arange(count, dtype=np.float64)
        got = comm.broadcast(want if comm.rank == 1 else np.zeros(count), root=1, algorithm="binary_tree_ep")
        assert np.array_equal(got, want)
colls.spawn(body, 3, transport="local", timeout=50)
print("right on local x3")
"""


@pytest.mark.timeout(60)
def test_an_entry_point_plugin_runs_on_local_and_shm(installed: Path) -> None:
    # nothing names the plugin: its name, looked up, loads the installed entry points
    local = subprocess.run([sys.executable, "-c", LOCAL_CHECK], cwd=ROOT, env=child_env(installed),
                           capture_output=True, text=True, timeout=50)
    assert local.returncode == 0 and "right on local x3" in local.stdout, local.stderr
    shm = colls_cli("run", "-n", "3", "--timeout", "50", str(CHECK), "binary_tree_ep",
                    env=child_env(installed))
    assert shm.returncode == 0, shm.stderr
    assert shm.stdout.count("binary_tree_ep right on shm x3") == 3


@needs_mpi
@pytest.mark.timeout(60)
def test_an_entry_point_plugin_runs_under_mpiexec_and_in_the_simulator(installed: Path) -> None:
    mpi = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(CHECK), "binary_tree_ep"], cwd=ROOT,
                         env=child_env(installed), capture_output=True, text=True, timeout=50)
    assert mpi.returncode == 0, mpi.stderr
    assert mpi.stdout.count("binary_tree_ep right on mpi x2") == 2
    plan = colls_cli("plan", "collective", "-c", "broadcast", "-s", "1MiB", "--algorithm", "binary_tree_ep",
                     "--nodes", "2", env=child_env(installed))
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"^binary_tree_ep +\S+ \w+ .* sim$", plan.stdout, re.M), plan.stdout
    assert "binary_tree_ep's declared alpha-beta cost" in plan.stdout


# -- the tutorial's walk ------------------------------------------------------------------------------

FUZZ = ("--collectives", "broadcast", "--algorithms", "binary_tree", "--quiet")


@pytest.mark.timeout(120)
def test_the_tutorial_walk(tmp_path) -> None:
    # 2. the planted bug: found, shrunk to one broadcast on 2 ranks just past a 16 KiB piece, replayable
    found = colls_cli("fuzz", "--plugin", f"{PLUGIN}:planted-bug", *FUZZ, "--programs", "200", "--seed", "1")
    assert found.returncode == 1, found.stdout + found.stderr
    assert "wrong result" in found.stdout and "to 1 step on 2 ranks" in found.stdout, found.stdout
    shrunk = re.search(r"broadcast\(binary_tree, (\d+) x (\w+)", found.stdout)
    rows, dtype = int(shrunk.group(1)), np.dtype(shrunk.group(2))
    assert (rows * dtype.itemsize) % (16 << 10) and rows * dtype.itemsize > 16 << 10   # a short last piece
    replay = re.search(r"^replay: colls (.*)$", found.stdout, re.M).group(1).split()
    again = colls_cli(*replay)
    assert again.returncode == 1 and "FAILED" in again.stdout, again.stdout + again.stderr
    # 3. fixed (no flag): clean on threads and on processes
    for transport, programs in (("local", "40"), ("shm", "10")):
        clean = colls_cli("fuzz", "--transport", transport, "--plugin", str(PLUGIN), *FUZZ, "--programs",
                          programs, "--seed", "2")
        assert clean.returncode == 0 and "0 failing programs" in clean.stdout, clean.stdout + clean.stderr
    # 5. predicted at 1,024 ranks, beside its declared cost (4 pieces: a short simulation)
    plan = colls_cli("plan", "collective", "-c", "broadcast", "-s", "64KiB", "--plugin", str(PLUGIN),
                     "--algorithm", "binary_tree", "--nodes", "128")
    assert plan.returncode == 0, plan.stderr
    assert "(1024)" in plan.stdout and re.search(r"^binary_tree .* sim$", plan.stdout, re.M), plan.stdout
    assert "binary_tree's declared alpha-beta cost" in plan.stdout


@needs_mpi
@pytest.mark.timeout(120)
def test_the_tutorial_benchmark(tmp_path) -> None:
    # 4. timed beside colls' own choice and MPI on the same ranks, every result right
    report = tmp_path / "bench.json"
    bench = colls_cli("bench", "-n", "2", "--plugin", str(PLUGIN), "-c", "broadcast", "--algorithm",
                      "binary_tree", "-b", "8", "-e", "64K", "-f", "64", "--iters", "5", "-w", "1",
                      "--baselines", "mpi", "--json", str(report), "--timeout", "100")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    import json

    records = json.loads(report.read_text())["records"]
    assert [r["algorithm"] for r in records] == ["binary_tree"] * 3
    assert all(r["wrong"] == 0 and "time_median_s" in r["baselines"]["auto"]
               and "time_median_s" in r["baselines"]["mpi"] for r in records)


def test_colls_plugins_that_cannot_load_fails_the_communicator_naming_it(monkeypatch) -> None:
    from colls.selection import Selector

    monkeypatch.setenv("COLLS_PLUGINS", "no_such_colls_plugin")
    with pytest.raises(colls.InvalidArgument, match="COLLS_PLUGINS: plugin no_such_colls_plugin"):
        Selector("local", 2)


def test_the_fuzzer_gives_non_commutative_ops_only_to_plugins_keeping_rank_order(restored_catalogue) -> None:
    from colls.fuzz.program import Space

    def schedule(channel, buf, op):
        pass

    colls.algorithm("all_reduce", "ordered_plugin", summary="s", keeps_rank_order=True)(schedule)
    colls.algorithm("all_reduce", "unordered_plugin", summary="s")(schedule)
    space = Space(algorithms=("ordered_plugin", "unordered_plugin"))
    assert space.choices("all_reduce", commutative=False) == ["ordered_plugin"]
    assert space.choices("all_reduce", commutative=True) == ["ordered_plugin", "unordered_plugin"]
