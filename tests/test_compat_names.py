"""The facade's MPI namespace against the real mpi4py, and the parts of it mpi4py's suite cannot see.

- every public name of `mpi4py.MPI`, and every public member of its communicator, group, info,
  error-handler and out-of-scope classes, exists on `colls.compat.MPI` (the real module is listed in a
  subprocess that does not initialize MPI); out-of-scope features raise NotImplementedError naming
  themselves;
- `Compute_dims` gives MPICH's answers;
- neighbour collectives (and their persistent form) pair repeated neighbours as MPI does (mpi4py's
  suite sends equal values everywhere, so it cannot tell): in a periodic dimension of size 1 or 2,
  the block a rank sends in the positive direction is the one its neighbour receives from the
  negative side (MPICH agrees);
- `mpi4py.rc.initialize = False`: COMM_WORLD raises MPI.Exception until MPI.Init;
- `Split_type(COMM_TYPE_SHARED)` groups ranks by host (`colls run --hosts`: virtual hosts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import colls
from colls.compat import MPI, bind

pytest.importorskip("mpi4py")

CLASSES = ("Comm", "Intracomm", "Topocomm", "Cartcomm", "Graphcomm", "Distgraphcomm", "Intercomm", "Group",
           "Info", "Errhandler", "Exception", "Win", "File", "Session", "Grequest", "buffer")
LISTING = textwrap.dedent(f"""
    import json, mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    public = lambda obj: sorted(name for name in dir(obj) if not name.startswith("_"))
    classes = {{name: public(getattr(MPI, name)) for name in {CLASSES!r}}}
    print(json.dumps({{"module": public(MPI), **classes}}))
""")


@pytest.fixture(scope="module")
def real_names() -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", LISTING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_name_of_mpi4py_exists(real_names: dict[str, list[str]]) -> None:
    missing = [name for name in real_names["module"] if not hasattr(MPI, name)]
    assert not missing, f"mpi4py.MPI names missing from colls.compat.MPI: {missing}"
    for cls in CLASSES:
        missing = [name for name in real_names[cls] if not hasattr(getattr(MPI, cls), name)]
        assert not missing, f"MPI.{cls} lacks {missing}"


@pytest.mark.parametrize("call, feature", [
    (lambda: MPI.Win.Create(np.zeros(1)), "one-sided"),
    (lambda: MPI.File.Open(MPI.COMM_SELF, "x"), "MPI I/O"),
    (lambda: MPI.Session.Init(), "sessions"),
    (lambda: MPI.Open_port(), "dynamic processes"),
    (lambda: MPI.COMM_SELF.Spawn("python"), "dynamic processes"),
    (lambda: MPI.COMM_SELF.Revoke(), "fault tolerance"),
    (lambda: MPI.Intercomm.Create_from_groups(MPI.GROUP_EMPTY, 0, MPI.GROUP_EMPTY, 0), "inter-communicators"),
    (lambda: MPI.Add_error_class(), "error classes"),
])
def test_out_of_scope_features_name_themselves(call, feature: str) -> None:
    with pytest.raises(NotImplementedError, match=feature):
        call()


def test_compute_dims_matches_mpich() -> None:
    cases = [(n, d) for n in range(1, 49) for d in (1, 2, 3, 4)] + [(12, [0, 3]), (24, [2, 0, 0]), (1, 0)]
    script = ("import json, sys\nfrom mpi4py import MPI\n"
              "print(json.dumps([MPI.Compute_dims(n, d) for n, d in json.loads(sys.argv[1])]))")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert [MPI.Compute_dims(n, d) for n, d in cases] == json.loads(done.stdout)


def _neighbour_exchanges(comm: colls.Communicator) -> list[list[int]]:
    with bind(comm):
        world = MPI.COMM_WORLD
        rank, size = world.Get_rank(), world.Get_size()
        got = []
        for dims in ([size], [1, size]):
            cart = world.Create_cart(dims, periods=True)
            sent = np.array([100 * rank + i for i in range(2 * len(dims))], "i")
            received = np.full(sent.size, -1, "i")
            cart.Neighbor_alltoall(sent, received)
            got.append(received.tolist())
            cart.Free()
        graph = world.Create_dist_graph_adjacent([(rank - 1) % size] * 2, [(rank + 1) % size] * 2)
        received = np.full(2, -1, "i")
        graph.Neighbor_alltoall(np.array([100 * rank, 100 * rank + 1], "i"), received)
        got.append(received.tolist())
        again = np.full(2, -1, "i")
        persistent = graph.Neighbor_alltoall_init(np.array([100 * rank, 100 * rank + 1], "i"), again)
        for _ in range(2):   # started twice: the same exchange
            persistent.Start()
            persistent.Wait()
            got.append(again.tolist())
        persistent.Free()
        got.append(graph.neighbor_alltoall([f"{rank}a", f"{rank}b"]))
        graph.Free()
        return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [1, 2, 3])
def test_neighbour_collectives_pair_repeated_neighbours(size: int) -> None:
    for rank, got in enumerate(colls.spawn(_neighbour_exchanges, size, timeout=30)):
        left, right = (rank - 1) % size, (rank + 1) % size
        # receive slot 0 (from the negative side) holds what that neighbour sent in the positive
        # direction (its block 1), slot 1 what the positive neighbour sent the other way (block 0)
        assert got[0] == [100 * left + 1, 100 * right]
        assert got[1] == [1 + 100 * rank, 100 * rank, 100 * left + 3, 100 * right + 2]
        assert got[2] == got[3] == got[4] == [100 * left, 100 * left + 1]   # a repeated edge: in order
        assert got[5] == [f"{left}a", f"{left}b"]


def test_rc_initialize_false_requires_init() -> None:
    script = textwrap.dedent("""
        from colls.compat import install
        install()
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        assert not MPI.Is_initialized() and not MPI.Is_finalized()
        try:
            MPI.COMM_WORLD.Get_rank()
        except MPI.Exception as error:
            assert "MPI.Init" in str(error), error
        else:
            raise AssertionError("COMM_WORLD worked before MPI.Init")
        assert MPI.Init_thread(MPI.THREAD_MULTIPLE) == MPI.THREAD_MULTIPLE == MPI.Query_thread()
        assert MPI.Is_initialized() and MPI.COMM_WORLD.Get_size() == 1
        MPI.Finalize()
        assert MPI.Is_initialized() and MPI.Is_finalized()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


SPLIT_BY_HOST = """
from mpi4py import MPI
import numpy as np
world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
total = np.zeros(1, "i")
node.Allreduce(np.array([world.rank], "i"), total)
print(world.rank, node.rank, node.size, int(total[0]), flush=True)
"""


@pytest.mark.timeout(120)
def test_split_type_shared_groups_ranks_by_host(tmp_path) -> None:
    script = tmp_path / "split.py"
    script.write_text(SPLIT_BY_HOST)
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "--as-mpi4py", "-n", "4", "--hosts", "2",
                           "--timeout", "90", str(script)], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    lines = sorted(tuple(map(int, line.split())) for line in done.stdout.split("\n") if line.strip())
    # virtual hosts of consecutive ranks: {0, 1} and {2, 3}
    assert lines == [(0, 0, 2, 1), (1, 1, 2, 1), (2, 0, 2, 5), (3, 1, 2, 5)]
