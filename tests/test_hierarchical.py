"""Hierarchical collectives over virtual hosts: threads, forked shm ranks, and mpiexec with shared
memory inside each host and MPI between hosts, all checked against numpy (and MPI's Allreduce)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hier_worker import check
from test_collectives_processes import REPO_ROOT, child_env, need_mpi
from test_sim import ALPHA, BETA, GAMMA, Recording, run_ranks

import colls
from algorithms import SUM, lookup
from algorithms.channel import Channel
from algorithms.hierarchical import Layout, Levels
from colls.plan.simulate import hierarchical_all_reduce
from transports.base import COLLECTIVE_TAG_BASE
from transports.local import LocalWorld
from transports.sim import IdealNetwork, SimWorld

WORKER = str(REPO_ROOT / "tests" / "hier_worker.py")
HIERARCHICAL = {"all_reduce": "hierarchical", "broadcast": "hierarchical", "all_to_all": "hierarchical"}


def test_layout_groups_ranks_by_host():
    layout = Layout.from_names(["b", "a", "b", "a", "c", "c"])
    assert layout.hosts == (0, 1, 0, 1, 2, 2)
    assert layout.members == ((0, 2), (1, 3), (4, 5))
    assert [layout.local_index(r) for r in range(6)] == [0, 0, 1, 1, 0, 1]
    assert layout.cross_members(1) == [2, 3, 5]
    assert layout.regular and layout.spans_hosts and layout.describe() == "3 hosts × 2 ranks"
    uneven = Layout.from_names(["a", "a", "b"])
    assert not uneven.regular and uneven.cross_members(1) == [1]
    assert uneven.subset([2, 0]).hosts == (0, 1)
    assert not Layout.one_host(4).spans_hosts                       # one host: flat
    assert not Layout.from_names(["a", "b", "c"]).spans_hosts       # one rank per host: flat


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts", ["aabb", "aabbcc", "ababcc", "aab", "abbccc", "aaaa"])
def test_hierarchical_collectives_on_threads(hosts):
    for report in colls.spawn(check, len(hosts), transport="local", timeout=60, hosts=list(hosts)):
        assert report["wrong"] == [], report
        spans = Layout.from_names(list(hosts)).spans_hosts
        assert (report["chosen"] == HIERARCHICAL) == spans, report
        assert report["levels"] == (["local", "local"] if spans else None), report


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts", ["aabb", "aabbcc"])
def test_hierarchical_collectives_on_shm_processes(hosts):
    for report in colls.spawn(check, len(hosts), transport="shm", timeout=60, hosts=list(hosts)):
        assert report["wrong"] == [] and report["chosen"] == HIERARCHICAL, report
        assert report["levels"] == ["shm", "shm"], report


def _reports(done: subprocess.CompletedProcess, folder: Path, size: int) -> list[dict]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((folder / f"{rank}.json").read_text()) for rank in range(size)]


@pytest.mark.timeout(180)
def test_mixed_transports_under_mpiexec_two_hosts_of_two(tmp_path):
    """`mpiexec` MPMD, as the README shows: shm inside each virtual host, MPI between them."""
    mpiexec = need_mpi()
    block = [sys.executable, WORKER, str(tmp_path)]
    command = [mpiexec, "-n", "2", "-env", "COLLS_HOST", "a", *block, ":", "-n", "2", "-env", "COLLS_HOST",
               "b", *block]
    done = subprocess.run(command, cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=150)
    for report in _reports(done, tmp_path, 4):
        assert report["wrong"] == [] and report["chosen"] == HIERARCHICAL, report
        assert report["levels"] == ["shm", "mpi"] and report["layout"] == "2 hosts × 2 ranks", report


@pytest.mark.timeout(180)
def test_mixed_transports_through_colls_run_three_hosts_of_two(tmp_path):
    need_mpi()
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "6", "--hosts", "3",
                           "--transport", "mpi", WORKER, str(tmp_path)], cwd=REPO_ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=150)
    for report in _reports(done, tmp_path, 6):
        assert report["wrong"] == [] and report["chosen"] == HIERARCHICAL, report
        assert report["levels"] == ["shm", "mpi"] and report["layout"] == "3 hosts × 2 ranks", report


@pytest.mark.timeout(120)
def test_colls_run_splits_ranks_into_uneven_virtual_hosts(tmp_path):
    done = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "5", "--hosts", "2", WORKER,
                           str(tmp_path)],
                          cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=100)
    for report in _reports(done, tmp_path, 5):
        assert report["wrong"] == [] and report["layout"] == "2 hosts (3, 2 ranks)", report


def _non_commutative(comm):
    left = colls.Op(lambda a, b: a.copy(), commutative=False, name="left")
    try:
        comm.all_reduce(np.ones(4), op=left, algorithm="hierarchical")
        refused = ""
    except ValueError as error:
        refused = str(error)
    chosen = colls.explain("all_reduce", 32, comm).chosen          # what a commutative op gets
    return refused, chosen, comm.all_reduce(np.full(4, float(comm.rank + 1)), op=left).tolist()


def test_non_commutative_operators_refuse_hierarchical_and_auto_picks_a_flat_schedule():
    for refused, chosen, result in colls.spawn(_non_commutative, 4, transport="local", timeout=30,
                                               hosts=list("aabb")):
        assert "reorders operands" in refused and chosen == "hierarchical"
        assert result == [1.0] * 4                   # `left` keeps rank 0's operand: order was kept


def _traced_real_run(layout: Layout, nbytes: int) -> list[list]:
    """Each rank's (verb, peer, bytes) sequence of the hierarchical all-reduce on threads, its two
    levels built from the layout as the communicator builds them."""
    size = len(layout.hosts)
    world, logs = LocalWorld(size), [[] for _ in range(size)]
    locals_ = [LocalWorld(len(group)) for group in layout.members]
    crosses = {i: LocalWorld(len(layout.cross_members(i))) for i in range(max(map(len, layout.members)))}

    def choose(level: str, collective: str, nbytes: int) -> str:
        return "ring" if level == "cross" else "binomial"       # as colls.plan.simulate does

    def rank_main(rank: int) -> None:
        host, index = layout.hosts[rank], layout.local_index(rank)
        transport = Recording(world.transport(rank), logs[rank])
        levels = Levels(layout, Recording(locals_[host].transport(index), logs[rank]),
                        Recording(crosses[index].transport(host), logs[rank]), choose)
        buf = np.ones(nbytes // 4, np.float32)
        lookup("all_reduce", "hierarchical").run(
            Channel(transport, COLLECTIVE_TAG_BASE, time.monotonic() + 60, "traced", levels=levels), buf, SUM)
        assert (buf == size).all()

    run_ranks(world, rank_main)
    return logs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nodes,per_node", [(2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20])   # the leaders' path and reduce-scatter's
def test_sim_runs_the_same_hierarchical_schedule_as_a_real_run(nodes, per_node, nbytes):
    size = nodes * per_node
    layout = Layout(tuple(rank // per_node for rank in range(size)))
    logs = [[] for _ in range(size)]
    world = SimWorld(size, IdealNetwork(size, ALPHA, BETA), GAMMA)
    world.run(lambda t: hierarchical_all_reduce(Recording(t, logs[t.rank]), nbytes, per_node))
    assert logs == _traced_real_run(layout, nbytes)
    assert all(math.isfinite(t) for t in world.finish_times)


def _fail_on_the_last_rank(comm):
    def add_or_fail(left, right):
        if comm.rank == comm.size - 1:
            raise RuntimeError("planted failure")
        return left + right

    start = time.monotonic()
    try:
        comm.all_reduce(np.ones(1 << 16, np.float32), op=colls.Op(add_or_fail, commutative=True))
        outcome = "returned"
    except Exception as error:   # the failing rank's own error, or the abort it caused
        outcome = type(error).__name__
    return outcome, time.monotonic() - start


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_a_rank_failing_inside_a_hierarchical_call_releases_both_levels(transport):
    """The failing rank aborts both levels; a rank released on one level passes the abort on, so
    that ranks waiting on the other level (for peers stuck on the first) are released too."""
    results = colls.spawn(_fail_on_the_last_rank, 6, transport=transport, timeout=30, hosts=list("aabbcc"))
    assert results[-1][0] == "RuntimeError", results
    assert all(outcome == "CommunicatorAborted" for outcome, _ in results[:-1]), results
    assert max(seconds for _, seconds in results) < 5.0, results   # not the 30 s deadline


def _random_calls(comm, seed: int) -> list:
    """150 hierarchical calls drawn from `seed` (the same on every rank): kind, dtype, count, op,
    root, in place or not; what differs from numpy."""
    rng = random.Random(seed)
    wrong = []
    for i in range(150):
        kind = rng.choice(["all_reduce", "broadcast", "all_to_all"])
        dtype = rng.choice([np.int64, np.float64, np.int32])
        count = rng.choice([0, 1, 3, 17, 1000, 9000, 20000, 70000])
        inputs = [((np.arange(count) * (r + 3) + i) % 97).astype(dtype) for r in range(comm.size)]
        mine = inputs[comm.rank].copy()
        if kind == "all_reduce":
            op, fold = rng.choice([(colls.SUM, np.sum), (colls.MAX, np.max), (colls.MIN, np.min)])
            where = rng.choice(["new", "out", "in place"])
            out = {"new": None, "out": np.empty_like(mine), "in place": mine}[where]
            got = comm.all_reduce(mine, op=op, out=out)
            want = fold(np.stack(inputs), axis=0).astype(dtype) if count else np.zeros(0, dtype)
            if not np.array_equal(got, want):
                wrong.append((i, kind, op.name, count, where))
        elif kind == "broadcast":
            root = rng.randrange(comm.size)
            if not np.array_equal(comm.broadcast(mine, root=root), inputs[root]):
                wrong.append((i, kind, root, count))
        else:
            rows = rng.choice([1, 2, 5])
            blocks = [((np.arange(comm.size * rows * 3) + 1000 * r + i) % 1009).astype(dtype)
                      .reshape(comm.size * rows, 3) for r in range(comm.size)]
            want = np.concatenate([b[comm.rank * rows:(comm.rank + 1) * rows] for b in blocks])
            if not np.array_equal(comm.all_to_all(blocks[comm.rank]), want):
                wrong.append((i, kind, rows))
    return wrong


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts,transport", [("aabb", "shm"), ("abcabc", "shm"), ("aab", "local"),
                                             ("abbccc", "local"), ("aaaabbbb", "local")])
def test_random_hierarchical_programs_match_numpy(hosts, transport):
    results = colls.spawn(_random_calls, len(hosts), transport=transport, args=(len(hosts) * 7919,),
                          timeout=100, hosts=list(hosts))
    assert all(wrong == [] for wrong in results), results
