"""Training reference loops: the model's gradient, and every strategy equal to serial training.

Each strategy runs on real ranks (threads for `local`, processes for `shm`) and must end with the
serial run's parameters (float64: relative difference <= 1e-10), the same on every rank, with the
measured bytes per rank equal to the formula within padding and the state bytes equal to the ZeRO
formulas within padding.
"""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest
from reference import finite_difference_gradient

import colls
from colls.parallel.accounting import Bytes, gradient_sync_example, state_formula, zero_memory_totals_gb
from colls.parallel.common import Setup
from colls.parallel.ddp import make_buckets, train_ddp
from colls.parallel.model import Model, ModelConfig
from colls.parallel.serial import train_serial
from colls.parallel.train import build_report, check_volume, run, serial_difference

FLOAT64_TOLERANCE = 1e-10
# float32: the parallel and serial runs differ only in the order gradients are summed, a few ulps
# (2^-23 ~ 1.2e-7) per step; Adam passes that on roughly unchanged, so 1e-5 is ~100 ulps of headroom.
FLOAT32_TOLERANCE = 1e-5

SMALL = ModelConfig(vocab=17, d_model=16, heads=2, blocks=2, seq_len=8)
BASE = Setup(model=SMALL, steps=3, batch=12, bucket_bytes=4096, first_bucket_bytes=1024)
STRATEGIES = ("ps", "ddp", "zero1", "zero2", "zero3")


@cache
def serial(setup: Setup):
    return train_serial(setup)


def check_run(strategy: str, setup: Setup, n: int, transport: str, tolerance: float = FLOAT64_TOLERANCE):
    results = run(strategy, setup, n, transport, timeout=60)
    diff = serial_difference(results, serial(setup))
    assert diff["relative"] <= tolerance, diff
    assert diff["identical_across_ranks"], diff
    report = build_report(strategy, setup, results, serial(setup))
    assert check_volume(report, results) == []
    sizes = Bytes.of_setup(setup)
    layers = len(setup.model.layers())
    for result in results:
        formula = state_formula(strategy, result.parameters, n, sizes, result.rank)
        for part, per_value in (("params", sizes.params), ("grads", sizes.grads),
                                ("optimizer", sizes.optimizer)):
            padding = layers * (n - 1) * per_value   # ZeRO pads each layer to a multiple of n
            extra = result.state_bytes[part] - formula[part]
            assert 0 <= extra <= padding, (part, result.state_bytes, formula)
    return results, report


# -- the model ---------------------------------------------------------------------------------------

def test_gradient_matches_finite_differences():
    model = Model(ModelConfig(vocab=7, d_model=8, heads=2, blocks=1, seq_len=5))
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(model.layout.total) * 0.5   # LN gains and biases away from 1 and 0 too
    tokens, targets = rng.integers(0, 7, (3, 5)), rng.integers(0, 7, (3, 5))
    _, grad = model.loss_and_grad(flat, tokens, targets)
    numeric = finite_difference_gradient(model, flat, tokens, targets)
    assert np.abs(numeric - grad).max() <= 1e-7 * max(1.0, np.abs(grad).max())


def test_float32_model_tracks_float64():
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, 17, (4, 8)), rng.integers(0, 17, (4, 8))
    m64, m32 = Model(SMALL, np.float64), Model(SMALL, np.float32)
    flat = m64.init_params(3)
    loss64, grad64 = m64.loss_and_grad(flat, tokens, targets)
    loss32, grad32 = m32.loss_and_grad(flat.astype(np.float32), tokens, targets)
    assert grad32.dtype == np.float32
    assert abs(loss32 - loss64) <= 1e-5 * loss64
    assert np.abs(grad32 - grad64).max() <= 1e-4 * np.abs(grad64).max()


def test_layout_pads_every_layer_and_views_share_the_buffer():
    model = Model(SMALL, align=3)
    assert all(s.padded % 3 == 0 and 0 <= s.padded - s.size < 3 for s in model.layout.segments)
    flat = model.init_params(0)
    unpadded = Model(SMALL)
    assert np.array_equal(model.layout.pack(flat), unpadded.layout.pack(unpadded.init_params(0)))
    model.layout.views(flat, 1)["wq"][0, 0] = 42.0   # a view, not a copy
    assert flat[model.layout.segments[1].start + 2 * SMALL.d_model] == 42.0


def test_training_lowers_the_loss():
    result = train_serial(Setup(model=SMALL, steps=30, batch=16))
    assert result.steps[-1].loss < 0.7 * result.steps[0].loss


# -- every strategy equals serial training ----------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_equals_serial_local(strategy, n):
    check_run(strategy, BASE, n, "local")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_equals_serial_shm(strategy, n):
    check_run(strategy, BASE, n, "shm")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_uneven_batch_and_sgd(strategy):
    """10 rows over 4 ranks (3, 3, 2, 2) and SGD with momentum."""
    check_run(strategy, Setup(model=SMALL, steps=3, batch=10, optimizer="sgd", bucket_bytes=4096,
                              first_bucket_bytes=1024), 4, "local")


@pytest.mark.timeout(60)
def test_rank_without_rows_still_takes_part():
    """3 rows over 4 ranks: one rank computes nothing but joins every collective."""
    for strategy in STRATEGIES:
        check_run(strategy, Setup(model=SMALL, steps=2, batch=3, bucket_bytes=4096,
                                  first_bucket_bytes=1024), 4, "local")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ["ring", "tree", "rabenseifner", "recursive_doubling"])
def test_ddp_any_all_reduce_algorithm(algorithm):
    results = run("ddp", Setup(model=SMALL, steps=3, algorithm=algorithm), 3, "local", timeout=60)
    diff = serial_difference(results, serial(Setup(model=SMALL, steps=3)))
    assert diff["relative"] <= FLOAT64_TOLERANCE and diff["identical_across_ranks"]


@pytest.mark.timeout(60)
def test_ddp_gradient_accumulation_syncs_only_the_last_micro_step():
    setup = Setup(model=SMALL, steps=3, batch=12, micro_steps=3, bucket_bytes=4096, first_bucket_bytes=1024)
    results, report = check_run("ddp", setup, 2, "local")
    buckets = len(results[0].extra["buckets"])
    assert all(row["calls"]["all_reduce"] == buckets for row in report["steps"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_float32(strategy):
    setup = Setup(model=SMALL, steps=3, dtype="float32", bucket_bytes=4096, first_bucket_bytes=1024)
    check_run(strategy, setup, 3, "local", tolerance=FLOAT32_TOLERANCE)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_mixed_precision_holds_the_k12_states(strategy):
    """fp16 working copy, fp32 master: bytes held follow 2Ψ/2Ψ/12Ψ split as in the ZeRO paper. The
    fp16 parameters may differ from serial by rounding the fp16 gradient sums differently: 2 fp16
    ulps (2 * 2^-10) relative to the largest parameter."""
    setup = Setup(model=SMALL, steps=3, mixed=True)
    assert Bytes.of_setup(setup) == Bytes.mixed_adam()
    check_run(strategy, setup, 4, "local", tolerance=2 * 2.0 ** -10)


# -- DDP overlaps communication with backward --------------------------------------------------------

def test_buckets_cover_the_buffer_in_reverse_with_a_small_first_bucket():
    model = Model(SMALL)
    buckets = make_buckets(model.layout, 8, bucket_bytes=4096, first_bucket_bytes=1024)
    assert buckets[0].stop == model.layout.total and buckets[-1].start == 0
    assert all(a.start == b.stop for a, b in zip(buckets, buckets[1:], strict=False))
    assert (buckets[0].stop - buckets[0].start) * 8 <= 1024 < (buckets[1].stop - buckets[1].start) * 8
    assert make_buckets(model.layout, 8, 25 * 2**20, 2**20)[0].start == 0   # default: one bucket here


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_ddp_first_bucket_is_in_flight_before_backward_ends(transport):
    config = ModelConfig(d_model=32, blocks=3, seq_len=16)
    setup = Setup(model=config, batch=16, steps=4, bucket_bytes=8192, first_bucket_bytes=1024)
    layers = len(config.layers())
    results = colls.spawn(train_ddp, 2, transport=transport, args=(setup,), timeout=60)
    for result in results:
        for step in result.extra["overlap"]:
            first = step["buckets"][0]
            # issued right after the head's backward, with every earlier layer still to run
            assert first["issued_after_layer"] == layers - 1
            assert first["issued_at"] < step["backward_end"]
            assert [e["bucket"] for e in step["buckets"]] == list(range(len(step["buckets"])))
    if transport == "local":   # and it really ran concurrently: finished while backward went on
        assert any(e["completed_at_layer"] is not None and e["completed_at_layer"] >= 0
                   for r in results for step in r.extra["overlap"] for e in step["buckets"])


# -- accounting and the command ---------------------------------------------------------------------

def test_zero_calculator_reproduces_the_paper():
    totals = zero_memory_totals_gb(7.5e9, 64)
    assert [round(totals[k], 1) for k in ("baseline", "zero1", "zero2", "zero3")] == [120.0, 31.4, 16.6, 1.9]


def test_gradient_sync_of_a_100b_fp16_model():
    example = gradient_sync_example(100e9, 2, 1024)
    assert example["gradient_gb"] == 200.0
    assert 399 < example["ring_sent_per_rank_gb"] < 400


@pytest.mark.timeout(60)
def test_colls_train_command(tmp_path, capsys):
    from colls.cli import main

    out = tmp_path / "report.json"
    assert main(["train", "--strategy", "zero3", "-n", "2", "--steps", "2", "--check-serial",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "vs serial" in printed and "formula" in printed
    report = json.loads(out.read_text())
    assert report["serial_difference"]["relative"] <= FLOAT64_TOLERANCE
    assert len(report["steps"]) == 2 and report["volume_problems"] == []
