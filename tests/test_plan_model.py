"""`colls plan`'s NCCL model, presets and units, plan train's options and plan search (issue 43)."""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
from dataclasses import replace

import pytest

from colls.plan.cli import add_arguments, cluster_of
from colls.plan.estimate import estimate, memory
from colls.plan.nccl_model import best, price, whole_cluster
from colls.plan.presets import markdown as presets_markdown
from colls.plan.presets import preset
from colls.plan.published import FIGURES, markdown
from colls.plan.search import search
from colls.plan.simulate import simulate
from colls.plan.topology import Cluster
from colls.plan.training import Training, plan_step
from colls.plan.units import parse_rate, parse_size

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "planning.md"
SMALL = Training(params=1e9, layers=8, hidden=1024, seq=512, micro_batches=8, dp=4, tp=2, pp=2)


def plan_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_published_figure_is_within_10_percent_and_the_docs_table_is_the_models():
    assert len([f for f in FIGURES if f.role == "check"]) >= 8
    for figure in FIGURES:
        assert abs(figure.error) <= 0.10, (figure.case, figure.model().busbw, figure.busbw)
    assert markdown() in DOCS.read_text(), "docs/planning.md's table is not the model's: paste markdown()"
    assert presets_markdown() in DOCS.read_text(), "docs/planning.md's presets are not PRESETS"


def test_the_issues_three_rows():
    one, two = preset("dgx-h100", nodes=1), preset("dgx-h100", nodes=2)
    size = 8 << 30
    ring1 = price("all_reduce", "ring", size, one, whole_cluster(one)).busbw
    nvls1 = best("all_reduce", size, one, whole_cluster(one))
    ring2 = price("all_reduce", "ring", size, two, whole_cluster(two)).busbw
    tree2 = best("all_reduce", size, two, whole_cluster(two))
    assert ring1 == pytest.approx(370, rel=0.10) and ring2 == pytest.approx(396, rel=0.10)
    assert nvls1.algorithm == "nvls" and nvls1.busbw == pytest.approx(480, rel=0.10)
    assert tree2.algorithm == "nvls_tree" and tree2.busbw == pytest.approx(470, rel=0.10)
    # without NVLink SHARP (an A100 node) there is no NVLS to choose
    a100 = preset("dgx-a100", nodes=1)
    assert price("all_reduce", "nvls", size, a100, whole_cluster(a100)) is None


@pytest.mark.timeout(60)
def test_the_ring_model_agrees_with_the_simulated_ring_on_one_nic_per_node():
    # an independent check of the link-load arithmetic: the sim transport runs colls' ring message
    # by message over the same links (efficiencies 1, so both see the line rate)
    cluster = Cluster(nodes=8, ranks_per_node=1, nics_per_node=1, nic_efficiency=1.0, nvlink_efficiency=1.0)
    size = 256 << 20
    simulated = simulate("all_reduce", "ring", size, cluster.network(), cluster.size, 0.0)
    modelled = price("all_reduce", "ring", size, cluster, whole_cluster(cluster))
    assert modelled.seconds == pytest.approx(simulated.seconds, rel=0.05)


@pytest.mark.timeout(60)
def test_the_closed_form_1f1b_agrees_with_the_simulated_one():
    # the simulated 1F1B runs the schedule message by message; with v = 1 and no TP the two
    # pipelines differ only in how the sends are counted
    cluster = preset("dgx-h100", nodes=1)
    model = Training(params=1e9, layers=8, hidden=1024, seq=512, micro_batches=8, dp=1, tp=1, pp=4,
                     gpu_flops=cluster.gpu_flops * 0.5)
    simulated = plan_step(model, cluster)
    assert estimate(model, cluster).pipeline == pytest.approx(simulated.pipeline_seconds, rel=0.03)


def test_sizes_are_decimal_unless_binary_and_rates_need_a_unit():
    assert parse_size("1G") == 10**9 and parse_size("1GB") == 10**9 and parse_size("64M") == 64 * 10**6
    assert parse_size("1GiB") == 1 << 30 and parse_size("64Mi") == 64 << 20 and parse_size("100") == 100
    assert parse_rate("400Gb/s", "--nic") == 50e9 and parse_rate("450GB/s", "--nvlink") == 450e9
    assert parse_rate("3.2Tbps", "--nic") == 400e9
    for bare in ("400", "900", "450 G"):
        with pytest.raises(ValueError, match=r"--nic needs a unit.*Gb/s.*GB/s"):
            parse_rate(bare, "--nic")
    with pytest.raises(SystemExit, match="--nvlink needs a unit"):
        cluster_of(plan_args("collective", "--nvlink", "900"), 2)
    cluster = cluster_of(plan_args("collective", "--preset", "dgx-a100", "--nic", "100Gb/s",
                                   "--nvlink", "300GB/s", "--hbm", "40G"), 2)
    assert (cluster.nic_bandwidth, cluster.intra_bandwidth, cluster.hbm) == (12.5e9, 300e9, 40e9)
    with pytest.raises(ValueError, match="dgx-h100"):
        preset("dgx-h1000")


def test_zero_memory_is_deepspeeds_and_zero3_moves_half_again():
    # DeepSpeed's figures for Ψ = 7.5e9 on Nd = 64 (the brief): 120 / 31.4 / 16.6 / 1.9 GB
    model = Training(params=7.5e9, layers=32, hidden=4096, seq=1024, dp=64, tp=1, pp=1)
    states = [memory(replace(model, zero=z)) for z in range(4)]
    assert [round((m.total - m.activations) / 1e9, 1) for m in states] == [120.0, 31.4, 16.6, 1.9]
    cluster = preset("dgx-h100", nodes=8)
    dp = {z: {d.dimension: d for d in estimate(replace(model, zero=z), cluster).dimensions}["dp"]
          for z in range(4)}
    assert dp[1].seconds == dp[2].seconds and dp[3].calls == 3 and dp[1].calls == 2
    assert dp[3].seconds == pytest.approx(dp[1].seconds * 1.5, rel=0.05)
    with pytest.raises(ValueError, match="--zero 4"):
        estimate(replace(model, zero=4), cluster)


def test_interleaving_divides_the_bubble_and_multiplies_the_sends():
    cluster = preset("dgx-h100", nodes=2)
    base = replace(SMALL, dp=1, tp=4, pp=4, micro_batches=8)
    plain, interleaved = estimate(base, cluster), estimate(replace(base, interleave=2), cluster)
    assert interleaved.bubble == pytest.approx((4 - 1) / 2 / (8 + (4 - 1) / 2))
    assert plain.bubble == pytest.approx(3 / 11) and interleaved.pipeline < plain.pipeline
    sends = [{d.dimension: d for d in s.dimensions}["pp"].calls for s in (plain, interleaved)]
    assert sends == [2 * (4 - 1), 2 * (2 * 4 - 1)]
    assert interleaved.memory.activations == pytest.approx(plain.memory.activations * (1 + 3 / 8))
    with pytest.raises(ValueError, match="--v 3"):
        estimate(replace(base, interleave=3), cluster)


def test_expert_weights_leave_the_dp_all_reduce_for_their_own_replicas():
    cluster = preset("dgx-h100", nodes=4)
    dense = Training(params=8e9, layers=8, hidden=2048, seq=1024, micro_batches=4, dp=16, tp=2, pp=1)
    moe = replace(dense, ep=8, experts=8, expert_fraction=0.75, top_k=2)
    by_name = {d.dimension: d for d in estimate(moe, cluster).dimensions}
    assert by_name["dp"].nbytes == int(8e9 * 0.25 / 2) * 2            # only the dense quarter
    assert by_name["edp"].nbytes == int(8e9 * 0.75 / (2 * 8)) * 2     # each expert over dp / ep = 2
    assert by_name["ep"].calls == 4 * (8 // 2) * 4
    assert memory(moe).parameters < memory(dense).parameters / 2
    with pytest.raises(ValueError, match="--ep 8 needs --experts"):
        estimate(replace(dense, ep=8), cluster)


def test_a_straggler_slows_every_collective_and_the_step_and_bad_ones_are_refused():
    cluster = preset("dgx-h100", nodes=2)
    groups, size = whole_cluster(cluster), 1 << 30
    for algorithm in ("ring", "tree", "nvls_tree"):
        fast = price("all_reduce", algorithm, size, cluster, groups)
        slow = price("all_reduce", algorithm, size, cluster, groups, {3: 4.0})
        assert slow.seconds > 2 * fast.seconds, algorithm
    model = replace(SMALL, dp=2, tp=4, pp=2)
    fast, slow = estimate(model, cluster), estimate(model, cluster, {5: 3.0})
    assert slow.compute == pytest.approx(3 * fast.compute) and slow.seconds > 2 * fast.seconds
    # the simulated collectives slow the straggler's links too, not only its latency
    args = plan_args("collective", "--nodes", "1", "--slow-rank", "2", "--slow-factor", "4")
    assert cluster_of(args, 1).slow_links["gpu2.out"] == 4.0
    with pytest.raises(SystemExit, match="--slow-rank 99"):
        cluster_of(plan_args("collective", "--slow-rank", "99"), 1)
    result = subprocess.run([sys.executable, "-m", "colls.cli", "plan", "train", "--simulate", "--slow-rank",
                             "1", "--nodes", "1", "--dp", "1", "--tp", "4", "--pp", "2"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "drop --simulate" in result.stderr


@pytest.mark.timeout(120)
def test_search_answers_the_1024_gpu_question():
    cluster = preset("dgx-h100", nodes=128, oversubscription=2)
    model = Training(params=100e9, layers=80, hidden=10240, seq=2048)
    result = search(model, cluster, global_batch=1024, top=3)
    win = result.ranked[0]
    assert result.fitting > 100 and win.fits and win.training.world == 1024
    assert win.seconds <= min(s.seconds for s in result.ranked)
    assert win.training.tp <= 8 and "beats the best other shape" in result.reason()
    # TP across nodes never wins: every top layout keeps TP inside a node's NVLink
    assert all(s.training.placement.startswith("tp") or s.training.tp == 1 for s in result.ranked)


@pytest.mark.timeout(120)
def test_json_on_collective_train_and_search():
    def run(*args: str) -> dict:
        result = subprocess.run([sys.executable, "-m", "colls.cli", "plan", *args, "--json"],
                                capture_output=True, text=True, timeout=100)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    collective = run("collective", "-s", "16MiB", "--nodes", "2")
    names = {a["name"]: a for a in collective["algorithms"]}
    assert {"ring", "nccl/ring", "nccl/nvls_tree"} <= set(names)
    assert all(a["time_s"] > 0 and a["busbw_GBps"] > 0 for a in collective["algorithms"])
    train = run("train", "--params", "1e9", "--layers", "8", "--hidden", "1024", "--seq", "512", "--dp", "2",
                "--tp", "8", "--pp", "2", "--nodes", "4", "--zero", "2")
    dims = train["steps"][0]["dimensions"]
    assert set(dims) == {"tp", "pp", "dp"} and all(d["time_s"] > 0 and d["bytes"] > 0 for d in dims.values())
    found = run("search", "--params", "1e9", "--layers", "8", "--hidden", "1024", "--seq", "512",
                "--nodes", "2", "--global-batch", "16", "--top", "2")
    assert len(found["ranked"]) == 2 and found["ranked"][0]["step_s"] <= found["ranked"][1]["step_s"]
