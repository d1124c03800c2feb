"""Tensor parallelism (`tp`) and DP × TP (`dp_tp`): Megatron's split equals serial training.

Each grid runs on real ranks (threads for `local`, processes for `shm`) and must end with the serial
run's parameters (float64: relative difference <= 1e-10), the replicated parts (embedding, LayerNorms,
bo, b2, head) bitwise identical on every rank, and per step exactly 2 forward + 2 backward TP
all-reduces per transformer layer whose bytes equal the ring formula, counted by the TP and DP
sub-communicators' stats().
"""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

import colls
from colls.parallel.common import Setup
from colls.parallel.model import Model, ModelConfig
from colls.parallel.serial import train_serial
from colls.parallel.tensor import TensorParallelStage, ring_sent_bytes
from colls.parallel.train import build_report, check_volume, run

FLOAT64_TOLERANCE = 1e-10

SMALL = ModelConfig(vocab=17, d_model=16, heads=2, blocks=2, seq_len=8)
# heads 5 and d_ff 80 over tp = 3: heads 2/2/1 and hidden units 27/27/26 (uneven both ways)
UNEVEN = ModelConfig(vocab=17, d_model=20, heads=5, blocks=2, seq_len=6)
GRIDS = [  # (model, dp, tp, batch)
    pytest.param(SMALL, 1, 2, 12, id="tp2"),
    pytest.param(UNEVEN, 1, 3, 12, id="tp3-uneven"),
    pytest.param(SMALL, 2, 2, 12, id="dp2xtp2"),
    pytest.param(UNEVEN, 2, 3, 7, id="dp2xtp3-uneven-rows"),
]
# dp >= 3 with uneven shards: the replicated gradients must be cut in the same ring blocks on every
# TP rank's DP group (sync_gradients), or their sums would be added in different orders
WIDE = pytest.param(UNEVEN, 3, 3, 12, id="dp3xtp3-uneven")


@cache
def serial(setup: Setup):
    return train_serial(setup)


def check_grid(config: ModelConfig, dp: int, tp: int, batch: int, transport: str):
    setup = Setup(model=config, steps=3, batch=batch, dp=dp, tp=tp)
    strategy = "tp" if dp == 1 else "dp_tp"
    results = run(strategy, setup, dp * tp, transport, timeout=90)
    report = build_report(strategy, setup, results, serial(setup))
    diff = report["serial_difference"]
    assert diff["relative"] <= FLOAT64_TOLERANCE, diff
    assert diff["identical_across_ranks"], diff
    details = report["details"]
    assert details["replicated_identical"]
    assert check_volume(report, results) == []
    # the formula written out independently: per TP group and phase, 2 all-reduces per layer of
    # rows·T·d float64 values, and a ring's ranks together send 2(t-1) of every value
    for step in details["steps"]:
        for dp_index in range(dp):
            group = step["ranks"][dp_index * tp:(dp_index + 1) * tp]
            rows = group[0]["rows"]
            values = rows * config.seq_len * config.d_model
            for phase in ("forward", "backward"):
                assert all(r[phase]["measured"]["calls"] == 2 * config.blocks for r in group)
                total = sum(r[phase]["measured"]["bytes_sent"] for r in group)
                assert total == 2 * config.blocks * 2 * (tp - 1) * values * 8
    return results, details


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("config", "dp", "tp", "batch"), [*GRIDS, WIDE])
def test_grid_equals_serial_local(config, dp, tp, batch):
    check_grid(config, dp, tp, batch, "local")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("config", "dp", "tp", "batch"), GRIDS)
def test_grid_equals_serial_shm(config, dp, tp, batch):
    check_grid(config, dp, tp, batch, "shm")


def test_uneven_split_sizes():
    _, details = check_grid(UNEVEN, 1, 3, 12, "local")
    assert [h[0][1] - h[0][0] for h in details["heads_per_rank"]] == [2, 2, 1]
    assert [h[0][1] - h[0][0] for h in details["hidden_per_rank"]] == [27, 27, 26]


def test_ring_sent_bytes_formula():
    assert ring_sent_bytes(1536, 2, 0, 8) == 1536 * 8   # 2(n-1)/n of the buffer
    assert ring_sent_bytes(12, 3, 1, 4) == 2 * 2 / 3 * 12 * 4
    assert sum(ring_sent_bytes(10, 3, r, 1) for r in range(3)) == 2 * 2 * 10   # uneven blocks
    assert ring_sent_bytes(10, 1, 0, 8) == 0


def _shard_and_gather(comm, config):
    stage = TensorParallelStage(config, comm, start=1, stop=4)   # attention0, mlp0, attention1
    full = Model(config).init_params(seed=3)
    local = stage.shard(full)
    span = full[stage.full_offset: stage.full_offset + stage.full_layout.total]
    return np.array_equal(stage.gather(local), span), local.size, stage.replicated_index.size


@pytest.mark.timeout(30)
def test_stage_shard_gather_round_trip():
    out = colls.spawn(_shard_and_gather, 3, transport="local", args=(UNEVEN,))
    assert all(same for same, _, _ in out)
    sizes = [size for _, size, _ in out]
    assert sizes[0] == sizes[1] > sizes[2]   # rank 2 has one head and 26 hidden units
    assert len({replicated for _, _, replicated in out}) == 1


def _too_few_heads(comm):
    with pytest.raises(ValueError, match="at least one"):
        TensorParallelStage(SMALL, comm)
    return True


@pytest.mark.timeout(30)
def test_more_ranks_than_heads_is_refused():
    assert all(colls.spawn(_too_few_heads, 3, transport="local"))


@pytest.mark.timeout(60)
def test_cli_dp_tp(tmp_path, capsys):
    from colls.cli import main

    out = tmp_path / "report.json"
    assert main(["train", "--strategy", "dp_tp", "--dp", "2", "--tp", "2", "--steps", "2", "--check-serial",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 fwd + 2 bwd all-reduces/layer (formula 2 + 2)" in text
    report = json.loads(out.read_text())
    assert report["ranks"] == 4 and report["volume_problems"] == []
    assert report["serial_difference"]["relative"] <= FLOAT64_TOLERANCE


@pytest.mark.parametrize("flags,message", [
    (["--strategy", "ddp", "--micro-steps", "0"], "--micro-steps: must be at least 1"),
    (["--strategy", "ddp", "--batch", "0"], "--batch: must be at least 1"),
    (["--strategy", "gpipe", "--micro-batches", "0"], "--micro-batches: must be at least 1"),
    (["--strategy", "ddp", "--bucket-mb", "nan"], "--bucket-mb: must be above 0"),
    (["--strategy", "tp", "--tp", "3", "--heads", "2"], "2 heads cannot be split over tp = 3"),
    (["--strategy", "3d", "--tp", "3", "--heads", "2"], "2 heads cannot be split over tp = 3"),
])
def test_train_refuses_flags_that_cannot_train_before_any_rank_starts(flags, message, capsys):
    """Found by review: `--micro-steps 0` trained nothing and exited 0 (its parameters
    then differed from serial training's), and other sizes of 0 or more tp ranks than heads ended
    in tracebacks from the ranks."""
    from colls.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", *flags])
    assert stop.value.code == 2 and message in capsys.readouterr().err
