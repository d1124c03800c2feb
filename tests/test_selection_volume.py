"""Algorithm selection (cost model, COLLS_ALGO, tune file) and the byte counters' textbook volumes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import colls
from algorithms.blocks import bounds
from colls.selection import Selector

LATENCY_OPTIMAL = {"recursive_doubling", "binomial"}
BANDWIDTH_OPTIMAL = {"ring", "rabenseifner", "ps_sharded", "tree"}


@pytest.mark.parametrize("size", [2, 4, 8, 16])
@pytest.mark.parametrize("transport", ["local", "shm", "mpi"])
def test_explain_picks_latency_then_bandwidth(size, transport, monkeypatch, tmp_path):
    monkeypatch.setenv("COLLS_TUNE_FILE", str(tmp_path / "none.json"))
    monkeypatch.delenv("COLLS_ALGO", raising=False)
    selector = Selector(transport, size)
    small = selector.explain("all_reduce", 8)
    large = selector.explain("all_reduce", 64 << 20)
    assert small.chosen in LATENCY_OPTIMAL, str(small)
    assert large.chosen in BANDWIDTH_OPTIMAL, str(large)
    assert small.predicted[small.chosen] < small.predicted["ring"]
    assert large.predicted[large.chosen] < large.predicted["recursive_doubling"]
    assert "us" in str(large) and large.chosen in str(large)


def test_colls_algo_forces_and_comm_explain(monkeypatch):
    monkeypatch.setenv("COLLS_ALGO", "all_reduce:ps;broadcast:direct")

    def body(comm):
        comm.reset_stats()
        comm.all_reduce(np.ones(1000, np.int64))
        return comm.stats()["all_reduce"], str(colls.explain("all_reduce", 8, comm))

    results = colls.spawn(body, 4, transport="local")
    server, explanation = results[0]
    assert "ps (COLLS_ALGO)" in explanation
    assert server["bytes_received"] == 3 * 8000 and server["bytes_sent"] == 3 * 8000   # ps's signature
    assert all(stats["bytes_sent"] == 8000 for stats, _ in results[1:])


def test_tune_file_changes_the_choice(monkeypatch, tmp_path):
    path = tmp_path / "tune.json"
    monkeypatch.setenv("COLLS_TUNE_FILE", str(path))
    monkeypatch.delenv("COLLS_ALGO", raising=False)
    # a network where messages are free and bytes are dear favours moving as few bytes as possible
    path.write_text(json.dumps({"shm": {"alpha": 0.0, "beta": 1e-9, "gamma": 1e-12}}))
    assert Selector("shm", 8).explain("all_reduce", 8).chosen in BANDWIDTH_OPTIMAL
    # and one where each message costs a second favours the fewest rounds
    path.write_text(json.dumps({"shm": {"alpha": 1.0, "beta": 1e-12, "gamma": 1e-12}}))
    assert Selector("shm", 8).explain("all_reduce", 64 << 20).chosen == "recursive_doubling"


def _volumes(collective, name, size, count, root=0):
    def body(comm):
        x = np.ones(count, np.int32)
        comm.reset_stats()
        if collective == "all_reduce":
            comm.all_reduce(x, algorithm=name)
        elif collective == "broadcast":
            comm.broadcast(x, root=root, algorithm=name)
        else:
            comm.reduce(x, root=root, algorithm=name)
        stats = comm.stats()[collective]
        return stats["bytes_sent"], stats["bytes_received"]

    return colls.spawn(body, size, transport="local")


def _block_bytes(count, size, itemsize=4):
    starts = bounds(count, size)
    return [(starts[i + 1] - starts[i]) * itemsize for i in range(size)]


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_all_reduce_volumes_match_the_textbook(size):
    count = 1001
    total = count * 4
    blocks = _block_bytes(count, size)
    # ring: every block but my own in the reduce-scatter, every block but my right neighbour's in
    # the all-gather: 2(n-1)/n S up to the uneven block sizes
    for rank, (sent, received) in enumerate(_volumes("all_reduce", "ring", size, count)):
        assert sent == (total - blocks[rank]) + (total - blocks[(rank + 1) % size])
        assert received == (total - blocks[(rank - 1) % size]) + (total - blocks[rank])
        assert abs(sent - 2 * (size - 1) / size * total) <= 2 * max(blocks)
    # ps: (n-1) S into the server and out again; S each way for a worker
    for rank, (sent, received) in enumerate(_volumes("all_reduce", "ps", size, count)):
        expected = (size - 1) * total if rank == 0 else total
        assert sent == received == expected
    # ps_sharded: each rank ships everything but its own block out, then its block to n-1 ranks
    for rank, (sent, received) in enumerate(_volumes("all_reduce", "ps_sharded", size, count)):
        assert sent == (total - blocks[rank]) + (size - 1) * blocks[rank]
        assert received == (size - 1) * blocks[rank] + (total - blocks[rank])
    if size & (size - 1) == 0:
        # recursive doubling: log2 n whole buffers; Rabenseifner: 2(n-1)/n S
        for sent, received in _volumes("all_reduce", "recursive_doubling", size, count):
            assert sent == received == int(np.log2(size)) * total
        for sent, received in _volumes("all_reduce", "rabenseifner", size, count):
            assert abs(sent - 2 * (size - 1) / size * total) <= 2 * int(np.log2(size)) * 4
            assert sent == received
    # tree: the whole buffer goes up and comes down once: (n-1) S over all ranks each way
    tree = _volumes("all_reduce", "tree", size, count)
    assert sum(sent for sent, _ in tree) == 2 * (size - 1) * total
    assert sum(received for _, received in tree) == 2 * (size - 1) * total


@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_broadcast_and_reduce_volumes(size):
    count = 777
    total = count * 4
    root = size - 1
    for name in ("binomial", "pipeline", "direct", "scatter_allgather"):
        volumes = _volumes("broadcast", name, size, count, root)
        received = [r for _, r in volumes]
        if name != "scatter_allgather":
            assert received[root] == 0, name
            assert all(received[r] == total for r in range(size) if r != root), name
            assert sum(s for s, _ in volumes) == (size - 1) * total, name
    # scatter + all-gather: the root sends (n-1)/n S, then everyone the ring's (n-1)/n S
    spread = _volumes("broadcast", "scatter_allgather", size, count, root)
    assert abs(spread[root][0] - 2 * (size - 1) / size * total) <= 2 * 4 * size
    direct = _volumes("broadcast", "direct", size, count, root)
    assert direct[root][0] == (size - 1) * total
    for name in ("binomial", "direct"):
        volumes = _volumes("reduce", name, size, count, root)
        extra = total if name == "binomial" and root != 0 and size > 1 else 0
        assert sum(s for s, _ in volumes) == (size - 1) * total + extra, name
    assert _volumes("reduce", "direct", size, count, root)[root][1] == (size - 1) * total


@pytest.mark.timeout(120)
def test_colls_tune_measures_and_saves(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    path = tmp_path / "tune.json"
    env = dict(os.environ, COLLS_TUNE_FILE=str(path))
    done = subprocess.run([sys.executable, "-m", "colls.cli", "tune"], env=env, capture_output=True,
                          text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    entry = json.loads(path.read_text())["shm"]
    assert 0 < entry["alpha"] < 1e-3            # a message costs microseconds, not milliseconds
    assert 1 / 100e9 < entry["beta"] < 1 / 10e6  # between 10 MB/s and 100 GB/s
    assert 1 / 100e9 < entry["gamma"] < 1 / 10e6
    # and which algorithm of each collective was fastest where on its 2 ranks: from 8 B, sizes
    # rising, every name a real one
    measured = entry["rules"]["2"]
    assert set(measured) == {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                             "all_to_all"}
    for collective, rules in measured.items():
        starts = [n for n, _ in rules]
        assert starts[0] == 0 and starts == sorted(set(starts)), (collective, rules)
        assert {name for _, name in rules} <= set(colls.algorithms(collective)) - {"hierarchical"}
        assert f"{collective} {rules[0][1]} from 0 B" in done.stdout
    # and nothing of a transport's own: its thresholds are its constants
    assert "exchange_cma" not in entry
    monkeypatch.setenv("COLLS_TUNE_FILE", str(path))
    assert Selector("shm", 4).machine.alpha == pytest.approx(entry["alpha"])
    for collective, rules in measured.items():
        explained = Selector("shm", 2).explain(collective, 8)
        assert explained.chosen == rules[0][1] and "colls tune" in explained.reason, collective


def test_rules_change_algorithm_only_for_a_clear_win():
    from colls.tune import rules_from

    timed = [(8, {"a": 1.0, "b": 1.2}), (512, {"a": 1.0, "b": 0.97}),   # b 3% faster: noise
             (4096, {"a": 1.0, "b": 0.9}), (1 << 20, {"a": 0.97, "b": 1.0}),   # b 10%: a new rule
             (4 << 20, {"a": 0.5, "b": 1.0})]
    assert rules_from(timed) == [(0, "a"), (4096, "b"), (4 << 20, "a")]
    # many ranks round the smallest sizes up to one element per rank: a size seen again is skipped
    assert rules_from([(800, {"a": 1.0, "b": 2.0}), (800, {"a": 2.0, "b": 1.0})]) == [(0, "a")]


def test_a_new_rule_must_win_a_head_to_head_round_too(monkeypatch):
    import colls.tune as tune

    # per size, the round of every algorithm, then what a head-to-head round of two would give
    rounds = {8: [{"a": 1.0, "b": 2.0, "c": 3.0}],
              4096: [{"a": 1.0, "b": 0.5, "c": 0.8},    # b a burst's luck, then c: neither holds
                     {"a": 1.0, "b": 1.1}, {"a": 1.0, "c": 0.98}],
              1 << 20: [{"a": 1.0, "b": 0.5, "c": 2.0},    # b twice: a new rule
                        {"a": 1.0, "b": 0.6}],
              # a loses to b head to head, then a burst slows b in its round with c: neither a
              # (whose 1.1 beats b's 3.0) nor c (3% only) makes a rule
              16 << 20: [{"a": 0.5, "b": 1.0, "c": 0.8},
                         {"a": 1.1, "b": 1.0}, {"b": 3.0, "c": 2.9}]}
    asked = []

    def scripted(comm, calls, budget_s=tune.RULE_BUDGET_S):
        nbytes = current[0]
        asked.append((nbytes, sorted(calls)))
        return rounds[nbytes].pop(0)

    current = [0]
    from colls.bench import cases

    make_case = cases.make_case

    def tracking(collective, nbytes, *args, **kwargs):
        current[0] = nbytes
        return make_case(collective, nbytes, *args, **kwargs)

    monkeypatch.setattr(tune, "call_times", scripted)
    monkeypatch.setattr(cases, "make_case", tracking)
    monkeypatch.setattr(cases, "colls_call", lambda comm, case, name: (lambda: None, None))
    monkeypatch.setattr("algorithms.names", lambda collective: ["a", "b", "c"])
    found = colls.spawn(lambda comm: tune.rules(comm, "all_reduce", (8, 4096, 1 << 20, 16 << 20)), 1,
                        transport="local", timeout=30)[0]
    assert found == [(0, "a"), (1 << 20, "b")]
    assert asked == [(8, ["a", "b", "c"]), (4096, ["a", "b", "c"]), (4096, ["a", "b"]), (4096, ["a", "c"]),
                     (1 << 20, ["a", "b", "c"]), (1 << 20, ["a", "b"]),
                     (16 << 20, ["a", "b", "c"]), (16 << 20, ["a", "b"]), (16 << 20, ["b", "c"])]


def test_tune_collectives_argument_is_checked_before_measuring():
    from colls.tune import RULE_COLLECTIVES, collectives_asked

    assert collectives_asked(["colls.tune"]) == RULE_COLLECTIVES
    assert collectives_asked(["x", "--collectives", "broadcast,all_reduce,broadcast"]) == ("broadcast",
                                                                                         "all_reduce")
    for bad in (["x", "--collectives", "bogus"], ["x", "--collectives", ","], ["x", "--collectives"]):
        with pytest.raises(SystemExit, match="--collectives"):
            collectives_asked(bad)


def test_measured_rules_decide_for_their_group_size_only(monkeypatch, tmp_path):
    from algorithms.cost import Machine
    from colls.selection import load_rules, save_machine, save_rules

    path = tmp_path / "tune.json"
    monkeypatch.setenv("COLLS_TUNE_FILE", str(path))
    monkeypatch.delenv("COLLS_ALGO", raising=False)
    save_rules("shm", 2, "all_reduce", [(0, "ring"), (4096, "tree"), (1 << 20, "ps")])
    save_machine("shm", Machine(5e-6, 1e-10, 1e-10))   # keeps the rules
    assert load_rules("shm", 2) == {"all_reduce": [(0, "ring"), (4096, "tree"), (1 << 20, "ps")]}
    two = Selector("shm", 2)
    assert [two.explain("all_reduce", n).chosen for n in (8, 4095, 4096, 1 << 19, 1 << 20, 1 << 30)] == \
        ["ring", "ring", "tree", "tree", "ps", "ps"]
    assert two.machine.alpha == 5e-6
    # other group sizes, transports and collectives keep the model
    modelled = Selector("shm", 4).explain("all_reduce", 8)
    assert modelled.reason == "cost model"
    assert Selector("mpi", 2).explain("all_reduce", 8).reason == "cost model"
    assert two.explain("broadcast", 8).reason == "cost model"
    # COLLS_ALGO still wins, and a ruled name outside the candidates (a non-commutative op's) is skipped
    monkeypatch.setenv("COLLS_ALGO", "all_reduce:recursive_doubling")
    assert Selector("shm", 2).explain("all_reduce", 8).chosen == "recursive_doubling"
    monkeypatch.delenv("COLLS_ALGO")
    assert Selector("shm", 2).explain("all_reduce", 8, ["recursive_doubling", "tree"]).reason == "cost model"
    # a torn or foreign file is no rules
    path.write_text("{not json")
    assert load_rules("shm", 2) == {} and Selector("shm", 2).explain("all_reduce", 8).reason == "cost model"
