"""Pipeline parallelism (`gpipe`, `1f1b`, `interleaved`): schedules, serial equality, bubbles, stash.

Every schedule, replayed with free messages and equal stage costs, has exactly the bubble
(p-1)/(v·m+p-1) and stashes what the formulas say. On real ranks (threads for `local`, processes
for `shm`) every grid shape ends with the serial run's parameters (float64, relative <= 1e-10),
including an uneven one (p = 3, and p = 4 stages over 6 layers: 2, 2, 1, 1). With stages made
equal by a 20 ms forward sleep (40 ms backward) that dominates compute (`stage_seconds`; sleeps do
not fight for the 2 cores), the measured bubble is within BUBBLE_MARGIN = 0.05 of the formula (the
median of 3 steps): messages, wake-ups and Python add idle time of their own, ~0.26-0.27 measured
for a formula of 0.25 at 10 ms under load, so 20 ms halves that excess and leaves the margin room.
"""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

from colls.parallel import pipeline, pipeline_report, schedule
from colls.parallel.common import Setup
from colls.parallel.model import ModelConfig
from colls.parallel.serial import train_serial
from colls.parallel.train import build_report, check_volume, run, serial_difference

FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-5   # as test_parallel: ~100 float32 ulps of headroom
SMALL = ModelConfig(vocab=17, d_model=16, heads=2, blocks=2, seq_len=8)   # 6 layers
BASE = Setup(model=SMALL, steps=3, batch=12)


@cache
def serial(setup: Setup):
    return train_serial(setup)


def check_run(strategy: str, setup: Setup, transport: str):
    """Train, compare with serial, and check the report's measured-vs-formula figures."""
    n = pipeline.world_size(strategy, setup)
    results = run(strategy, setup, n, transport, timeout=60)
    diff = serial_difference(results, serial(setup))
    assert diff["relative"] <= FLOAT64_TOLERANCE, diff
    assert diff["identical_across_ranks"], diff
    report = build_report(strategy, setup, results, serial(setup))
    assert check_volume(report, results) == [], report["details"]
    return report["details"]


# -- schedules ----------------------------------------------------------------------------------

SHAPES = [("gpipe", 2, 4, 1), ("gpipe", 3, 5, 1), ("1f1b", 3, 6, 1), ("1f1b", 4, 3, 1), ("1f1b", 1, 3, 1),
          ("interleaved", 2, 4, 2),
          ("interleaved", 3, 6, 2), ("interleaved", 2, 2, 3), ("interleaved", 4, 8, 2)]


@pytest.mark.parametrize("strategy,p,m,v", SHAPES)
def test_schedule_runs_every_op_once_with_the_formula_bubble_and_stash(strategy, p, m, v):
    ops = [schedule.schedule(strategy, p, m, v, r) for r in range(p)]
    for rank_ops in ops:
        assert sorted(rank_ops) == sorted((k, i, c) for k in "FB" for i in range(m) for c in range(v))
    for backward in (1.0, 2.0):   # any backward/forward ratio, as long as every stage costs the same
        times = schedule.simulate(ops, p, v, lambda r, kind, c, b=backward: b if kind == "B" else 1.0)
        for bubble in schedule.bubble_of(times):
            assert bubble == pytest.approx(schedule.bubble_formula(p, m, v), abs=1e-12)
    for r, rank_ops in enumerate(ops):
        live = peak = 0
        for kind, _, _ in rank_ops:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == schedule.stash_formula(strategy, p, m, v, r)
        assert peak == (m * v if strategy == "gpipe" else min(m, p - r) if strategy == "1f1b" else peak)


def test_1f1b_stashes_at_most_p_and_gpipe_m():
    assert [schedule.stash_formula("1f1b", 4, 8, 1, r) for r in range(4)] == [4, 3, 2, 1]
    assert [schedule.stash_formula("gpipe", 4, 8, 1, r) for r in range(4)] == [8] * 4


def test_a_schedule_that_waits_on_itself_is_reported_as_a_deadlock():
    ops = [[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]]   # rank 0's backward before its forward
    with pytest.raises(RuntimeError, match="deadlock"):
        schedule.simulate(ops, 2, 1, lambda r, kind, c: 1.0)


def test_stages_are_contiguous_and_even():
    assert pipeline.stage_layers(6, 4) == [range(0, 2), range(2, 4), range(4, 5), range(5, 6)]
    with pytest.raises(ValueError, match="at least 8 layers"):
        pipeline.stage_layers(6, 8)


# -- equal to serial -----------------------------------------------------------------------------

GRIDS = [("gpipe", dict(pp=2, micro_batches=4)),
         ("gpipe", dict(pp=3, micro_batches=6)),
         ("1f1b", dict(pp=3, micro_batches=5)),           # p = 3; 12 rows in 5 uneven micro-batches
         ("1f1b", dict(pp=4, micro_batches=4)),           # 6 layers over 4 stages: 2, 2, 1, 1
         ("1f1b", dict(pp=2, dp=2, micro_batches=3)),     # DP 2 × PP 2
         ("interleaved", dict(pp=2, chunks=2, micro_batches=4)),
         ("interleaved", dict(pp=3, chunks=2, micro_batches=3))]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy,grid", GRIDS, ids=lambda g: str(g))
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_pipeline_equals_serial(strategy, grid, transport):
    setup = Setup(model=SMALL, steps=3, batch=12, **grid)
    part = check_run(strategy, setup, transport)
    assert part["peak_stash"] == part["stash_formula"]
    assert part["replicas_identical"]
    if strategy == "1f1b":
        assert max(part["peak_stash"]) <= setup.pp
    if strategy == "gpipe":
        assert part["peak_stash"] == [setup.micro_batches] * setup.pp


@pytest.mark.timeout(60)
def test_sgd_float32_and_mixed_precision_also_match():
    check_run("1f1b", Setup(model=SMALL, steps=2, batch=12, pp=2, micro_batches=2, optimizer="sgd"), "local")
    # float32 and mixed (fp16 parameters, fp32 compute; micro-batch gradients add up in fp32 as
    # Megatron's main_grad, so the only difference is the order of additions)
    setup = Setup(model=SMALL, steps=3, batch=12, pp=3, micro_batches=3, dtype="float32")
    results = run("1f1b", setup, 3, "local", timeout=60)
    assert serial_difference(results, train_serial(setup))["relative"] <= FLOAT32_TOLERANCE
    setup = Setup(model=SMALL, steps=3, batch=12, pp=3, micro_batches=3, mixed=True)
    results, serial_run = run("1f1b", setup, 3, "local", timeout=60), train_serial(setup)
    serial_params = serial_run.params
    # fp16 parameters: the same fp32 sums added in another order may round a parameter to the
    # neighbouring fp16 value, so the bound is one fp16 ulp of each parameter. (On an EPYC whose
    # BLAS sums the serial batch in another order, 2 of 7185 parameters differed by one ulp each,
    # 1.14e-5 of the largest parameter: over the float32 bound, below fp16's resolution.)
    ulp = np.spacing(np.abs(serial_params).astype(np.float16)).astype(np.float64)
    for rank, result in enumerate(results):
        off = np.abs(result.params - serial_params) / ulp
        assert off.max() <= 1.0, f"rank {rank}: {int((off > 1).sum())} parameters beyond one fp16 ulp"
    assert serial_difference(results, serial_run)["identical_across_ranks"]


# -- the measured bubble -------------------------------------------------------------------------

BUBBLES = [("gpipe", dict(pp=3, micro_batches=6), "local"),
           ("1f1b", dict(pp=3, micro_batches=6), "shm"),
           ("interleaved", dict(pp=2, chunks=2, micro_batches=4), "shm")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy,grid,transport", BUBBLES)
def test_measured_bubble_is_the_formula_when_stages_cost_the_same(strategy, grid, transport):
    # stages of 0.1 s: long beside a busy machine's scheduling delays of a few ms per hand-off
    # (at 0.02 s, two CPU hogs on 2 cores put every median bubble 0.06-0.12 off the formula)
    setup = Setup(model=SMALL, steps=3, batch=12, stage_seconds=0.1, **grid)
    part = check_run(strategy, setup, transport)   # problems() holds the median bubble to the margin
    median = sorted(row["bubble_mean"] for row in part["steps"])[1]
    assert abs(median - part["bubble_formula"]) <= pipeline_report.BUBBLE_MARGIN, part["steps"]
    assert part["bubble_simulated_equal_stages"] == pytest.approx(part["bubble_formula"], abs=1e-12)


def test_interleaving_shrinks_the_formula_bubble():
    assert schedule.bubble_formula(4, 8, 1) == pytest.approx(3 / 11)
    assert schedule.bubble_formula(4, 8, 2) == pytest.approx(3 / 19)


# -- errors, the command line and the picture -----------------------------------------------------

def test_setups_that_cannot_run_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="multiple of --pp 2"):
        pipeline.world_size("interleaved", Setup(model=SMALL, pp=2, chunks=2, micro_batches=3))
    with pytest.raises(ValueError, match="--blocks 3 or more"):
        pipeline.world_size("interleaved", Setup(model=SMALL, pp=4, chunks=2, micro_batches=4))
    with pytest.raises(ValueError, match="fewer rows than --micro-batches 8"):
        pipeline.world_size("1f1b", Setup(model=SMALL, batch=12, pp=2, dp=2, micro_batches=8))


@pytest.mark.timeout(30)
def test_a_wrong_rank_count_is_refused_on_every_rank():
    with pytest.raises(Exception, match="grid of 2 ranks"):
        run("gpipe", Setup(model=SMALL, steps=1, pp=2, micro_batches=2), 3, "local", timeout=30)


@pytest.mark.timeout(60)
def test_colls_train_pipeline_command(tmp_path, capsys):
    from colls.cli import main

    out, picture = tmp_path / "report.json", tmp_path / "schedule.png"
    assert main(["train", "--strategy", "1f1b", "--pp", "3", "--micro-batches", "6", "--steps", "2",
                 "--check-serial", "--json", str(out), "--plot", str(picture)]) == 0
    printed = capsys.readouterr().out
    assert "bubble" in printed and "(p-1)/(m+p-1) = 0.250" in printed and "vs serial" in printed
    report = json.loads(out.read_text())
    assert report["serial_difference"]["relative"] <= FLOAT64_TOLERANCE
    assert report["details"]["peak_stash"] == [3, 2, 1]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in printed
    else:
        assert picture.stat().st_size > 0
