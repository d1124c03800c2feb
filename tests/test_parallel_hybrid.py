"""Hybrid parallelism: `pp_ep` (PP × DP × EP) and `3d` (PP × DP × TP), ranks in Megatron's grid order.

Each grid shape, on threads (`local`) and processes (`shm`), ends with the serial run's parameters
(float64, relative <= 1e-10), the same on every rank; the ranks holding the same part of the model
(and, within a stage, the replicated parts) hold identical bytes; peak stash and point-to-point
bytes equal their formulas, and (3d) every rank makes Megatron's 2 all-reduces per cut layer and
micro-batch. Uneven shapes: p = 3 stages, 3 experts over 2 ep ranks, 4 heads over 3 tp ranks.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache

import pytest

from colls.parallel import hybrid
from colls.parallel.common import Setup
from colls.parallel.model import ModelConfig
from colls.parallel.serial import train_serial
from colls.parallel.train import build_report, check_volume, fill_grid, run, serial_difference

FLOAT64_TOLERANCE = 1e-10
DENSE = ModelConfig(vocab=17, d_model=16, heads=2, blocks=2, seq_len=8)
MOE = ModelConfig(vocab=17, d_model=16, heads=2, blocks=2, seq_len=8, experts=3, top_k=2,
                  capacity_factor=1.25)


@cache
def serial(setup: Setup):
    return train_serial(setup)


def check_run(strategy: str, setup: Setup, transport: str) -> dict:
    n = hybrid.world_size(strategy, setup)
    results = run(strategy, setup, n, transport, timeout=60)
    diff = serial_difference(results, serial(setup))
    assert diff["relative"] <= FLOAT64_TOLERANCE, diff
    assert diff["identical_across_ranks"], diff
    report = build_report(strategy, setup, results, serial(setup))
    assert check_volume(report, results) == [], report["details"]
    part = report["details"]
    assert part["replicas_identical"] and part["peak_stash"] == part["stash_formula"]
    return part


PP_EP = [dict(pp=2, ep=2, micro_batches=2),                     # 4 ranks
         dict(pp=3, ep=2, micro_batches=3),                     # p = 3, 6 ranks
         dict(pp=2, dp=2, ep=2, micro_batches=3),               # 8 ranks: PP 2 × DP 2 × EP 2
         dict(pp=2, ep=2, chunks=2, micro_batches=2)]           # interleaved


@pytest.mark.timeout(60)
@pytest.mark.parametrize("grid", PP_EP, ids=lambda g: "-".join(f"{k}{v}" for k, v in g.items()))
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_pp_ep_equals_serial(grid, transport):
    check_run("pp_ep", Setup(model=MOE, steps=3, batch=12, **grid), transport)


FOUR_HEADS = ModelConfig(vocab=17, d_model=16, heads=4, blocks=2, seq_len=8)
THREE_D = [dict(pp=2, dp=2, micro_batches=3),                   # DP 2 × PP 2 (TP 1)
           dict(pp=2, dp=2, tp=2, micro_batches=3),             # 8 ranks: DP 2 × TP 2 × PP 2
           dict(pp=3, tp=2, micro_batches=3),                   # p = 3, 6 ranks
           dict(pp=2, tp=3, micro_batches=2, model=FOUR_HEADS),  # uneven TP: heads 2/1/1, hidden 22/21/21
           # uneven TP under DP 3: the replicated gradients summed in one order on every tp rank
           # (found by review: their copies drifted apart in the last bits)
           dict(pp=1, dp=3, tp=3, micro_batches=2, model=FOUR_HEADS),
           dict(pp=2, tp=2, chunks=2, micro_batches=2)]         # interleaved


@pytest.mark.timeout(60)
@pytest.mark.parametrize("grid", THREE_D,
                         ids=lambda g: "-".join(f"{k}{v}" for k, v in g.items() if k != "model"))
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_3d_equals_serial(grid, transport):
    grid = {"model": DENSE, **grid}
    part = check_run("3d", Setup(steps=3, batch=12, **grid), transport)
    if grid.get("tp", 1) > 1:   # Megatron: 2 all-reduces per cut layer (attention, MLP) and micro-batch
        assert all(set(calls) == {formula} for calls, formula in
                   zip(part["tp_all_reduces"], part["tp_all_reduces_formula"], strict=True)), part


def test_grid_order_is_tp_innermost_then_dp_then_pp():
    setup = Setup(pp=2, dp=2, tp=2)
    assert hybrid.world_size("3d", setup) == 8
    # rank = (stage * dp + dp_rank) * tp + tp_rank
    assert [hybrid.coordinates(rank, setup, "3d") for rank in (0, 1, 2, 5, 7)] == \
        [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]


def test_pp_ep_needs_experts():
    with pytest.raises(ValueError, match="--experts"):
        hybrid.world_size("pp_ep", Setup(model=DENSE, pp=2, ep=2, micro_batches=2))


@pytest.mark.parametrize("strategy,nprocs,given,sizes", [
    ("tp", 4, {}, {"tp": 4}),                                  # the example
    ("gpipe", 4, {}, {"pp": 4}),                               # dp is 1 unless given
    ("1f1b", 4, {"pp": 2}, {"pp": 2, "dp": 2}),
    ("ep", 4, {}, {"ep": 4}),
    ("dp_tp", 8, {"tp": 2}, {"dp": 4, "tp": 2}),
    ("pp_ep", 8, {"pp": 2, "ep": 2}, {"pp": 2, "dp": 2, "ep": 2}),
    ("pp_ep", 4, {"pp": 2}, {"pp": 2, "ep": 2}),
    ("3d", 8, {"pp": 2, "tp": 2}, {"pp": 2, "dp": 2, "tp": 2}),
    ("3d", 8, {"pp": 2, "dp": 2, "tp": 2}, {"pp": 2, "dp": 2, "tp": 2}),   # all given: kept
    ("tp", None, {}, {}),                                      # no -n: what is left out is 1
    ("ddp", 4, {}, {}),                                        # data parallel: no grid to fill
])
def test_colls_train_fills_the_one_size_left_out_from_n(strategy, nprocs, given, sizes):
    expected = {"dp": 1, "tp": 1, "pp": 1, "ep": 1, **sizes}
    assert fill_grid(strategy, nprocs, given) == expected


@pytest.mark.parametrize("strategy,nprocs,given,message", [
    ("dp_tp", 4, {}, "ambiguous: its grid is --dp --tp; give all but one of --dp, --tp"),
    ("3d", 8, {"pp": 2}, "ambiguous: its grid is --pp --dp --tp; give all but one of --dp, --tp"),
    ("pp_ep", 8, {}, "ambiguous"),
    ("3d", 6, {"pp": 2, "tp": 2}, "-n 6 is not a multiple of 4 (--pp 2 --tp 2): no --dp fills it"),
])
def test_colls_train_says_when_n_does_not_say_which_size(strategy, nprocs, given, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        fill_grid(strategy, nprocs, given)


@pytest.mark.timeout(120)
def test_colls_train_strategy_and_n_alone_run_on_processes():
    """`colls train --strategy tp -n 2` (the issue: it asked for --tp instead of taking tp = 2)."""
    command = [sys.executable, "-m", "colls.cli", "train", "--strategy", "tp", "-n", "2", "--transport",
               "shm", "--steps", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-800:]
    assert "tp on 2 ranks (TP 2)" in done.stdout
    command[5:8] = ["dp_tp", "-n", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2 and "is ambiguous" in done.stderr, done.stderr[-800:]
