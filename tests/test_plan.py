"""`colls plan`: the article's numbers, placements, pipeline bubbles, EP without TP, the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from colls.plan.cli import parse_bytes
from colls.plan.simulate import simulate
from colls.plan.topology import Cluster
from colls.plan.training import Training, compare_placements, plan_step
from transports.sim import IdealNetwork

SMALL = Training(params=1e9, layers=8, hidden=1024, seq=512, micro_batches=8)


@pytest.mark.timeout(60)
def test_the_articles_gradient_all_reduce_moves_about_400_gb_per_rank():
    # one gradient all-reduce of a 100B-parameter fp16 model: 200 GB of gradient, 2(n-1)/n of it sent
    n, gradient = 64, int(100e9) * 2
    result = simulate("all_reduce", "ring", gradient, IdealNetwork(n, 5e-6, 1 / 50e9), n)
    assert result.bytes_sent == pytest.approx(2 * (n - 1) / n * gradient, rel=1e-6)
    assert 390e9 < result.bytes_sent < 400e9
    assert result.seconds == pytest.approx(2 * (n - 1) * 5e-6 + result.bytes_sent / 50e9, rel=1e-3)


@pytest.mark.timeout(60)
def test_groups_follow_the_placement_order():
    t = Training(dp=2, tp=4, pp=2, placement="tp,dp,pp")
    assert t.groups("tp")[5] == [4, 5, 6, 7]
    assert t.groups("dp")[5] == [1, 5]
    assert t.groups("pp")[5] == [5, 13]
    assert Training(dp=4, tp=2, pp=1, ep=2).groups("ep")[3] == [1, 3]   # halves of the DP group [1, 3, 5, 7]
    with pytest.raises(ValueError):
        Training(placement="tp,dp").groups("tp")


@pytest.mark.timeout(120)
def test_tp_inside_a_node_beats_tp_across_nodes_and_pp_under_one_leaf_beats_spread():
    cluster = Cluster(nodes=8, nodes_per_leaf=2, oversubscription=4)
    training = Training(params=1e9, layers=8, hidden=1024, seq=512, micro_batches=4, dp=2, tp=8, pp=4)
    megatron, pp_close, tp_across = compare_placements(training, cluster)
    seconds = {plan.training.placement: {d.dimension: d.seconds for d in plan.dimensions}
               for plan in (megatron, pp_close, tp_across)}
    assert seconds["dp,pp,tp"]["tp"] > 3 * seconds["tp,dp,pp"]["tp"]     # TP belongs inside a server
    assert seconds["tp,pp,dp"]["pp"] < seconds["tp,dp,pp"]["pp"]         # stages close: cheaper sends
    # TP's all-reduces run inside every stage's forward and backward: the 1F1B step holds them
    # (each stage's TP per step on top of its compute), and the whole step DP's all-reduce after it
    for plan in (megatron, pp_close, tp_across):
        tp = seconds[plan.training.placement]["tp"]
        assert plan.pipeline_seconds >= plan.compute_seconds + tp
        dp = seconds[plan.training.placement]["dp"]
        assert plan.step_seconds == pytest.approx(plan.pipeline_seconds + dp)
    slower = seconds["dp,pp,tp"]["tp"] - seconds["tp,dp,pp"]["tp"]
    assert tp_across.step_seconds > megatron.step_seconds + 0.9 * slower


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pp,m", [(4, 4), (4, 12), (2, 8)])
def test_the_simulated_1f1b_bubble_matches_megatrons_formula_with_free_sends(pp, m):
    plan = plan_step(Training(params=1e9, layers=8, hidden=1024, seq=512, micro_batches=m, pp=pp),
                     Cluster(nodes=1))
    assert plan.bubble == pytest.approx((pp - 1) / (m + pp - 1), rel=0.01)
    assert plan.pipeline_seconds >= plan.pipeline_free_links


@pytest.mark.timeout(60)
def test_expert_parallel_without_tensor_parallel():
    plan = plan_step(Training(params=1e9, layers=8, hidden=1024, seq=512, micro_batches=2, dp=16, ep=8),
                     Cluster(nodes=2))
    by_name = {d.dimension: d for d in plan.dimensions}
    assert set(by_name) == {"ep", "dp"}
    ep = by_name["ep"]
    assert ep.calls == 4 * (8 // 2) * 2 and ep.seconds > 0
    assert ep.bytes_sent == pytest.approx(7 / 8 * ep.nbytes, rel=1e-6)   # pairwise: all blocks but mine


@pytest.mark.timeout(60)
def test_a_straggler_slows_the_pipeline():
    cluster = Cluster(nodes=1)
    fast = simulate("all_reduce", "ring", 64 << 20, cluster.network(), 8, cluster.gamma)
    slow = simulate("all_reduce", "ring", 64 << 20, cluster.network(), 8, cluster.gamma, slowdown={3: 50.0})
    assert slow.seconds > fast.seconds


def test_parse_bytes():
    # one convention (issue 43): decimal unless written binary, as the outputs are decimal GB
    assert parse_bytes("1G") == 10**9 and parse_bytes("1GiB") == 1 << 30 and parse_bytes("100") == 100


@pytest.mark.timeout(120)
def test_cli_prints_every_algorithm_and_a_training_plan():
    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "colls.cli", "plan", *args], capture_output=True,
                                text=True, timeout=100)
        assert result.returncode == 0, result.stderr
        return result.stdout

    table = run("collective", "-c", "all_reduce", "-s", "64M", "--nodes", "2")
    for name in ("ring", "rabenseifner", "tree", "ps", "hierarchical/ring"):
        assert f"\n{name} " in table, name
    plan = run("train", "--params", "1e9", "--layers", "8", "--hidden", "1024", "--seq", "512",
               "--dp", "2", "--tp", "8", "--pp", "2", "--nodes", "4", "--compare")
    assert "tp,dp,pp" in plan and "dp,pp,tp" in plan and "bubble" in plan
    assert "200 GB" in run("train", "--params", "100e9", "--dp", "2", "--tp", "1", "--pp", "1",
                           "--layers", "2", "--hidden", "256", "--seq", "64", "--nodes", "1")
    assert "binomial" in run("scale", "-c", "broadcast", "-s", "1M", "--nodes", "1,2")
