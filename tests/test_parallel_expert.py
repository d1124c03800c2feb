"""Expert parallelism (`ep`): the MoE block's routing, capacity and gradient, and training with the
experts spread over ranks equal to serial training of the same MoE model.

On `local` threads and `shm` processes, at even and uneven shapes (3 ranks, E not a multiple of the
ranks, ranks owning no expert, a dp x ep grid): parameters after several steps equal serial
training (float64, relative <= 1e-10), the replicated parameters are identical on every rank, the
load and drops per expert equal the serial reference's, the all-to-all bytes equal what the routing
implies, a forced uniform router gives an aux loss of exactly alpha, and every token's expert
output comes back to its own position.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import cache

import numpy as np
import pytest
from reference import finite_difference_gradient

import colls
from colls.parallel import expert
from colls.parallel import functional as F
from colls.parallel.common import Setup, local_batch
from colls.parallel.layers import MLP, MoE
from colls.parallel.model import Model, ModelConfig
from colls.parallel.serial import train_serial
from colls.parallel.train import build_report, check_volume, run, serial_difference

FLOAT64_TOLERANCE = 1e-10


def moe_setup(ep: int, experts: int, top_k: int = 1, dp: int = 1, router: str = "learned",
              capacity: float = 1.0, steps: int = 3, batch: int = 12) -> Setup:
    model = ModelConfig(vocab=17, d_model=16, heads=2, blocks=2, seq_len=8, experts=experts, top_k=top_k,
                        capacity_factor=capacity, aux_alpha=0.01, router=router)
    return Setup(model=model, steps=steps, batch=batch, ep=ep, dp=dp)


@cache
def serial(setup: Setup):
    return train_serial(setup)


def check_ep(setup: Setup, transport: str, tolerance: float = FLOAT64_TOLERANCE):
    results = run("ep", setup, setup.ep * setup.dp, transport, timeout=60)
    diff = serial_difference(results, serial(setup))
    assert diff["relative"] <= tolerance, diff
    assert diff["identical_across_ranks"], diff
    report = build_report("ep", setup, results, serial(setup))
    details = report["details"]
    assert details["replicas_identical"]
    assert check_volume(report, results) == []   # load/drops = serial, bytes = routing, replicas alike
    for row in details["steps"]:
        for block, reference in zip(row["blocks"], row["serial"], strict=True):
            assert block["dropped"] == reference["dropped"] and block["load"] == reference["load"]
            assert block["aux_loss"] == pytest.approx(reference["aux_loss"], rel=max(1e-12, tolerance))
    return results, details


# -- the MoE block ------------------------------------------------------------------------------------

@pytest.mark.parametrize("top_k,router,capacity", [(1, "learned", 1.0), (2, "learned", 1.0),
                                                   (2, "uniform", 0.5), (1, "learned", 4.0)])
def test_moe_gradient_matches_finite_differences(top_k, router, capacity):
    config = ModelConfig(vocab=7, d_model=8, heads=2, blocks=1, seq_len=6, mlp_ratio=2, experts=3,
                         top_k=top_k, capacity_factor=capacity, aux_alpha=0.3, router=router)
    model = Model(config)
    rng = np.random.default_rng(0)
    flat = model.init_params(1) + 0.1 * rng.standard_normal(model.layout.total)
    tokens, targets = rng.integers(0, 7, (3, 6)), rng.integers(0, 7, (3, 6))
    _, grad = model.loss_and_grad(flat, tokens, targets)
    numeric = finite_difference_gradient(model, flat, tokens, targets)
    assert np.abs(numeric - grad).max() <= 1e-7 * max(1.0, np.abs(grad).max())
    routing = model.forward(model.flat_source(flat), tokens, targets, 1.0)[1][2].routing
    if capacity < 1:
        assert routing.dropped > 0    # the drop path is exercised too


def test_dense_model_is_unchanged_and_moe_replaces_every_mlp():
    dense, moe = ModelConfig().layers(), ModelConfig(experts=4).layers()
    assert [type(layer) for layer in dense].count(MLP) == 2 and not any(isinstance(x, MoE) for x in dense)
    assert [layer.name for layer in moe if isinstance(layer, MoE)] == ["moe0", "moe1"]


def test_capacity_keeps_first_choices_before_second_choices():
    # d = E = 3, router = 10 I: token t's logits are its input row, choices [0,1], [0,2], [0,1], [1,2]
    layer = MoE(d_model=3, hidden=4, experts=3, top_k=2, capacity_factor=0.5)
    assert F.expert_capacity(0.5, 4, 3, 2) == 2   # ceil(0.5 * 4 / 3) * k
    h = (np.eye(3)[[0, 0, 0, 1]] + 0.1 * np.eye(3)[[1, 2, 1, 2]])[None]
    routing = layer.route({"router": 10 * np.eye(3)}, h)
    assert routing.choices[0].tolist() == [[0, 1], [0, 2], [0, 1], [1, 2]]
    assert routing.routed.tolist() == [3, 3, 2] and routing.kept.tolist() == [2, 2, 2]
    kept = sorted((int(t), int(e)) for t, e in zip(routing.tokens, routing.experts, strict=True))
    # expert 1 takes token 3's first choice before token 0's second; token 2 is dropped twice
    assert kept == [(0, 0), (0, 1), (1, 0), (1, 2), (3, 1), (3, 2)]
    assert routing.dropped == 2 and np.all(np.diff(routing.experts) >= 0)   # sorted for the dispatch
    gates = {(int(t), int(e)): g
             for t, e, g in zip(routing.tokens, routing.experts, routing.gates, strict=True)}
    probs = routing.probs[0, 0]
    assert gates[(0, 0)] == pytest.approx(probs[0] / (probs[0] + probs[1]), rel=1e-15)   # GShard top-2


def test_uniform_router_rotates_tokens_and_drops_past_capacity():
    layer = MoE(d_model=4, hidden=4, experts=4, top_k=1, capacity_factor=0.5, router="uniform")
    routing = layer.route({}, np.zeros((2, 8, 4)))   # capacity ceil(0.5 * 8 / 4) = 1
    assert routing.choices[..., 0].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]] * 2
    assert sorted(routing.tokens.tolist()) == [0, 1, 2, 3, 8, 9, 10, 11]   # the second visit dropped
    assert routing.dropped == 8 and routing.aux == 2 * 0.01   # alpha per group, exactly


def test_expert_major_order():
    counts = np.array([[1, 2], [0, 1], [2, 0]])   # rows from source s for expert e, by source
    # arrival: s0e0 [0], s0e1 [1 2], s1e1 [3], s2e0 [4 5]; by expert: e0 [0 4 5], e1 [1 2 3]
    assert expert.expert_major(counts).tolist() == [0, 4, 5, 1, 2, 3]
    assert expert.expert_major(np.zeros((2, 0), np.int64)).tolist() == []


def test_owned_experts_cover_every_expert_once():
    for experts, size in ((4, 2), (4, 3), (7, 5), (2, 4)):
        owned = [expert.owned_experts(experts, size, r) for r in range(size)]
        assert sum((list(range(s.start, s.stop)) for s in owned), []) == list(range(experts))


# -- dispatch and combine on real ranks -------------------------------------------------------------

def _tokens_come_back(comm, setup: Setup):
    """Each rank runs the expert-parallel block on its rows and checks every output against its own
    token run through its expert directly, and the whole block against the serial block's rows."""
    full = setup.build()
    layers = expert.expert_parallel_layers(full.layers, comm)
    local = Model(setup.model, layers=layers)
    flat = full.init_params(5) + 0.1 * np.random.default_rng(2).standard_normal(full.layout.total)
    mine = expert.shard(full, flat, local, local.zeros())
    tokens, _, _ = local_batch(setup, 0, comm.rank, comm.size)
    h = np.random.default_rng([7, comm.rank]).standard_normal((len(tokens), setup.model.seq_len, 16))
    index = 2   # moe0
    layer, p, p_full = layers[index], local.layout.views(mine, index), full.layout.views(flat, index)
    routing = layer.route(p, h)
    rows = h.reshape(-1, 16)[routing.tokens]
    out, _ = layer.experts_forward(p, rows, routing)
    for i, (token, e) in enumerate(zip(routing.tokens, routing.experts, strict=True)):
        direct, _ = F.experts_forward(p_full["w1"][e:e + 1], p_full["b1"][e:e + 1], p_full["w2"][e:e + 1],
                                      p_full["b2"][e:e + 1], h.reshape(-1, 16)[token:token + 1], [1])
        assert np.allclose(out[i], direct[0], rtol=1e-13, atol=1e-13), (comm.rank, i, token, e)
    # the block's output and input gradient equal the serial block's on this rank's rows
    x = h
    y, cache_local = layer.forward(p, x, 0.5)
    dy = np.random.default_rng([8, comm.rank]).standard_normal(y.shape)
    dx = layer.backward(p, {k: np.zeros_like(v) for k, v in p.items()}, cache_local, dy)
    return comm.rank, y, dx


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("ranks,experts,top_k", [(3, 4, 2), (2, 3, 1), (4, 2, 2)])
def test_tokens_come_back_in_their_original_order(transport, ranks, experts, top_k):
    setup = moe_setup(ranks, experts, top_k)
    results = colls.spawn(_tokens_come_back, ranks, transport=transport, args=(setup,), timeout=60)
    full = setup.build()
    flat = full.init_params(5) + 0.1 * np.random.default_rng(2).standard_normal(full.layout.total)
    layer, p = full.layers[2], full.layout.views(flat, 2)
    x = np.concatenate([np.random.default_rng([7, r]).standard_normal(y.shape) for r, y, _ in results])
    dy = np.concatenate([np.random.default_rng([8, r]).standard_normal(y.shape) for r, y, _ in results])
    y, cache_serial = layer.forward(p, x, 0.5)
    dx = layer.backward(p, {k: np.zeros_like(v) for k, v in p.items()}, cache_serial, dy)
    assert np.allclose(np.concatenate([r[1] for r in results]), y, rtol=1e-13, atol=1e-13)
    assert np.allclose(np.concatenate([r[2] for r in results]), dx, rtol=1e-13, atol=1e-13)


def _shard_and_gather_a_stage(comm, setup: Setup):
    """A pipeline stage's view: layers 1..3 of the model (attention0, moe0, attention1)."""
    full = setup.build()
    stage = [1, 2, 3]
    local = Model(setup.model, layers=expert.expert_parallel_layers([full.layers[i] for i in stage], comm))
    flat = full.init_params(4)
    mine = expert.shard(full, flat, local, local.zeros(), layer_map=stage)
    shared = np.concatenate([mine[a:b] for a, b in expert.replicated_ranges(local)])
    back = expert.gather(comm, full, local, mine, replicated=comm.rank == 0, experts=True, layer_map=stage)
    return local.layout.total, shared, back


@pytest.mark.timeout(60)
def test_shard_and_gather_a_pipeline_stage():
    setup = moe_setup(3, 4, 2)
    results = colls.spawn(_shard_and_gather_a_stage, 3, transport="local", args=(setup,), timeout=60)
    full = setup.build()
    flat = full.init_params(4)
    expected = np.zeros_like(flat)
    for i in (1, 2, 3):
        full.layout.segment(expected, i)[...] = full.layout.segment(flat, i)
    moe = full.layers[2]
    per_expert = sum(int(np.prod(shape)) for _, shape, _ in moe.expert_specs(1))
    for rank, (total, shared, back) in enumerate(results):
        assert np.array_equal(back, expected)   # every element from its one owner, exactly
        assert np.array_equal(shared, results[0][1])
        owned = expert.owned_experts(4, 3, rank)
        stage = sum(full.layout.segments[i].size for i in (1, 2, 3))
        assert total == stage - (4 - (owned.stop - owned.start)) * per_expert


# -- training equals serial --------------------------------------------------------------------------

SHAPES = {  # name: (ep, experts, top_k, dp)
    "ep2-E4-top1": (2, 4, 1, 1),
    "ep3-E4-top2": (3, 4, 2, 1),          # uneven: E not a multiple of the ranks
    "ep4-E3-top2": (4, 3, 2, 1),          # a rank owning no expert
    "dp2xep2-E3-top1": (2, 3, 1, 2),      # experts replicated over two dp groups
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", SHAPES)
def test_ep_equals_serial_local(shape):
    ep, experts, top_k, dp = SHAPES[shape]
    _, details = check_ep(moe_setup(ep, experts, top_k, dp), "local")
    assert any(b["dropped"] > 0 for row in details["steps"] for b in row["blocks"])   # C = 1 drops some


@pytest.mark.timeout(90)
@pytest.mark.parametrize("shape", ["ep3-E4-top2", "dp2xep2-E3-top1"])
def test_ep_equals_serial_shm(shape):
    ep, experts, top_k, dp = SHAPES[shape]
    check_ep(moe_setup(ep, experts, top_k, dp), "shm")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("precision,tolerance", [("float32", 1e-5), ("mixed", 2 * 2.0 ** -10)])
def test_lower_precision(precision, tolerance):
    """As test_parallel.py's float32 and mixed-precision tolerances (rounding of the gradient sums)."""
    setup = replace(moe_setup(3, 4, 2), **({"mixed": True} if precision == "mixed" else {"dtype": "float32"}))
    check_ep(setup, "local", tolerance)


@pytest.mark.timeout(60)
def test_a_rank_without_rows_still_takes_part():
    check_ep(moe_setup(4, 4, 2, batch=3), "local")   # rank 3 routes nothing but owns expert 3


@pytest.mark.timeout(60)
def test_drop_count_follows_the_capacity_factor():
    drops = {}
    for capacity in (0.5, 1.0, 4.0):
        _, details = check_ep(moe_setup(2, 4, 2, capacity=capacity, steps=2), "local")
        drops[capacity] = sum(b["dropped"] for row in details["steps"] for b in row["blocks"])
    assert drops[0.5] > drops[1.0] > drops[4.0] == 0   # C = E: room for every token


@pytest.mark.timeout(60)
@pytest.mark.parametrize("top_k", [1, 2])
def test_uniform_router_aux_loss_is_alpha(top_k):
    _, details = check_ep(moe_setup(3, 4, top_k, router="uniform", capacity=1.25), "local")
    for row in details["steps"]:
        for block in row["blocks"] + row["serial"]:
            assert block["aux_loss"] == 0.01   # alpha * E * sum_i (1/E)(1/E) * ... = alpha, exactly
            assert block["load"] == [block["assigned"] // 4] * 4 and block["dropped"] == 0
        # every expert gets exactly 1/E of the assignments: the bytes are the balanced formula's
        assert row["dispatch_bytes_sent"] == row["dispatch_bytes_balanced"]


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="--experts"):
        expert.world_size("ep", Setup(ep=2))
    with pytest.raises(ValueError, match="needs 4 ranks"):
        expert.check_setup(moe_setup(2, 4, dp=2), 3)
    with pytest.raises(ValueError, match="top_k=2"):
        ModelConfig(experts=1, top_k=2).layers()


# -- the command line ---------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_colls_train_ep_command(tmp_path, capsys, monkeypatch):
    from colls.cli import main

    pytest.importorskip("matplotlib")   # in the test extra; the second half needs none
    picture = tmp_path / "load.png"
    argv = ["train", "--strategy", "ep", "--ep", "3", "--experts", "4", "--top-k", "2", "--steps", "2",
            "--capacity-factor", "1.0", "--check-serial", "--plot", str(picture)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "moe1: load" in out and "dropped" in out
    assert "replicated parameters identical on every rank: True" in out
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if matplotlib were not installed
    assert main(argv[:-1] + [str(tmp_path / "none.png")]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "none.png").exists()
