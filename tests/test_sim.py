"""The `sim` transport: same code path as a real run, textbook costs, link contention, speed."""

from __future__ import annotations

import math
import os
import threading
import time

import numpy as np
import pytest

from algorithms import CATALOGUE, SUM, lookup
from algorithms.channel import Channel
from algorithms.cost import Machine, predict
from algorithms.hierarchical import Layout
from colls.plan.simulate import (
    arguments,
    hierarchical_all_reduce,
    run_algorithm,
    run_world,
    simulate,
    simulate_hierarchical,
)
from colls.plan.topology import Cluster
from transports.base import COLLECTIVE_TAG_BASE, Transport
from transports.local import LocalWorld
from transports.sim import IdealNetwork, NotSymmetric, SimulationFailed, SimWorld, Symmetry, symbolic

ALPHA, BETA, GAMMA = 10e-6, 1e-9, 0.25e-9   # 10 us, 1 GB/s, 4 GB/s reductions


class Recording(Transport):
    """Wraps a real or simulated transport and logs every posted send and receive: (verb, peer, bytes)."""

    def __init__(self, inner: Transport, log: list) -> None:
        self.inner, self.log = inner, log
        self.name, self.rank, self.size = inner.name, inner.rank, inner.size

    def isend(self, buf, peer, tag):
        self.log.append(("send", peer, buf.nbytes))
        return self.inner.isend(buf, peer, tag)

    def irecv(self, buf, peer, tag):
        self.log.append(("recv", peer, buf.nbytes))
        return self.inner.irecv(buf, peer, tag)

    def irecv_reduce(self, buf, peer, tag, reducer):
        self.log.append(("recv_reduce", peer, buf.nbytes))
        return self.inner.irecv_reduce(buf, peer, tag, reducer)

    def wait_all(self, requests, deadline):
        self.inner.wait_all(requests, deadline)

    def subgroup(self, ranks, exchange):
        inner = self.inner.subgroup(ranks, exchange)
        return None if inner is None else Recording(inner, self.log)


def real_buffer(count: int, dtype) -> np.ndarray:
    return (np.arange(count) % 7 + 1).astype(dtype)


def run_ranks(world: LocalWorld, rank_main) -> None:
    """Run `rank_main(rank)` on one thread per rank of `world`; any rank's error fails the test."""
    errors = []

    def guarded(rank: int) -> None:
        try:
            rank_main(rank)
        except BaseException as error:
            errors.append(error)
            world.mark_lost(rank, repr(error))

    threads = [threading.Thread(target=guarded, args=(r,)) for r in range(world.size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def local_trace(collective: str, algorithm: str, size: int, nbytes: int) -> list[list]:
    """Each rank's (verb, peer, bytes) sequence in a real run on the thread transport."""
    world, logs = LocalWorld(size), [[] for _ in range(size)]

    def rank_main(rank: int) -> None:
        channel = Channel(Recording(world.transport(rank), logs[rank]), COLLECTIVE_TAG_BASE,
                          time.monotonic() + 60, collective)
        lookup(collective, algorithm).run(channel, *arguments(collective, rank, size, nbytes,
                                                              make=real_buffer))

    run_ranks(world, rank_main)
    return logs


def sim_trace(collective: str, algorithm: str, size: int, nbytes: int) -> list[list]:
    """The same sequences under `sim`, with symbolic buffers."""
    logs = [[] for _ in range(size)]
    world = SimWorld(size, IdealNetwork(size, ALPHA, BETA), GAMMA)
    world.run(lambda t: run_algorithm(Recording(t, logs[t.rank]), collective, algorithm, nbytes))
    return logs


EVERY_ALGORITHM = [(c, a) for c in sorted(CATALOGUE) for a in CATALOGUE[c]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective,algorithm", EVERY_ALGORITHM)
def test_same_sends_and_receives_as_a_real_run(collective, algorithm):
    for size in (1, 2, 3, 4, 5, 8):
        for count in (0, 24, 120 * size):
            nbytes = count * 4 * (1 if collective in ("all_reduce", "broadcast", "reduce") else size)
            assert sim_trace(collective, algorithm, size, nbytes) == \
                local_trace(collective, algorithm, size, nbytes), (size, count)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "tree"), ("broadcast", "pipeline"),
                                                  ("all_reduce", "ring_segmented")])
def test_same_code_path_for_pipelined_pieces(collective, algorithm):
    nbytes = 1000 << 10   # four 256 KiB pieces, the last shorter; at 3 ranks two segments (768 KiB, the rest)
    assert sim_trace(collective, algorithm, 3, nbytes) == local_trace(collective, algorithm, 3, nbytes)


def ideal(collective: str, algorithm: str, p: int, nbytes: int) -> float:
    return simulate(collective, algorithm, nbytes, IdealNetwork(p, ALPHA, BETA), p, GAMMA).seconds


def lg(p: int) -> int:
    return math.ceil(math.log2(p))


# Thakur, Rabenseifner & Gropp (2005), on a network where every rank has its own full-duplex link
TEXTBOOK = {
    ("all_reduce", "ring"):
        lambda p, n: 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA + (p - 1) / p * n * GAMMA,
    ("all_reduce", "recursive_doubling"): lambda p, n: lg(p) * (ALPHA + n * BETA + n * GAMMA),
    ("all_reduce", "rabenseifner"):
        lambda p, n: 2 * lg(p) * ALPHA + 2 * (p - 1) / p * n * BETA + (p - 1) / p * n * GAMMA,
    ("broadcast", "binomial"): lambda p, n: lg(p) * (ALPHA + n * BETA),
    # n: the bytes each rank sends to the others, (p-1)/p of its buffer
    ("all_to_all", "pairwise"): lambda p, n: (p - 1) * ALPHA + (p - 1) / p * n * BETA,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("collective,algorithm", sorted(TEXTBOOK))
@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("nbytes", [1024 * 16, 16 << 20])
def test_textbook_costs_on_an_ideal_network(collective, algorithm, p, nbytes):
    predicted = TEXTBOOK[(collective, algorithm)](p, nbytes)
    assert ideal(collective, algorithm, p, nbytes) == pytest.approx(predicted, rel=0.01)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("p", [3, 5, 6])
def test_textbook_costs_at_other_sizes(p):
    n = 48 << 10
    ring = TEXTBOOK[("all_reduce", "ring")](p, n)
    assert ideal("all_reduce", "ring", p, n) == pytest.approx(ring, rel=0.01)
    assert ideal("broadcast", "binomial", p, n) == pytest.approx(lg(p) * (ALPHA + n * BETA), rel=0.01)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("nbytes", [100 << 10, (3 << 19) + 4096, 16 << 20])
def test_segmented_ring_costs_a_ring_per_segment(p, nbytes):
    # segments of p 256 KiB blocks, the last one shorter: each costs what a ring of its size costs
    segment = p * (256 << 10)
    whole, rest = divmod(nbytes, segment)
    ring = TEXTBOOK[("all_reduce", "ring")]
    predicted = whole * ring(p, segment) + (ring(p, rest) if rest else 0.0)
    assert ideal("all_reduce", "ring_segmented", p, nbytes) == pytest.approx(predicted, rel=0.01)
    machine = Machine(ALPHA, BETA, GAMMA)
    assert predict("all_reduce", "ring_segmented", p, nbytes, machine) == pytest.approx(predicted, rel=1e-9)


def test_the_model_takes_pairwise_all_to_all_in_small_groups_and_bruck_for_small_blocks_in_big_ones():
    """bruck's packing costs numpy calls: at 4 ranks on this machine a 4 KiB call took longer by
    bruck than by pairwise, and MPICH takes it for small blocks from 8 ranks."""
    from colls.selection import DEFAULT_MACHINES

    machine = DEFAULT_MACHINES["shm"]

    def cheapest(ranks: int, nbytes: int) -> str:
        costs = {name: predict("all_to_all", name, ranks, nbytes, machine)
                 for name in ("pairwise", "direct", "bruck")}
        return min(costs, key=costs.get)

    sizes = (8, 1 << 10, 16 << 10, 1 << 20)
    assert {cheapest(ranks, nbytes) for ranks in range(2, 7) for nbytes in sizes} == {"pairwise"}
    assert cheapest(8, 1 << 10) == cheapest(64, 64 << 10) == "bruck"
    assert cheapest(8, 1 << 20) == "pairwise"


def cross_leaf_ring(p: int, oversubscription: float, interleaved: bool) -> float:
    """A ring all-reduce on p one-GPU nodes under two leaves; interleaved: every hop crosses leaves."""
    cluster = Cluster(nodes=p, ranks_per_node=1, nics_per_node=1, nic_bandwidth=1 / BETA, nic_latency=ALPHA,
                      switch_latency=0.0, nodes_per_leaf=p // 2, oversubscription=oversubscription,
                      reduce_bandwidth=1 / GAMMA)
    slots = [i // 2 + (i % 2) * (p // 2) for i in range(p)] if interleaved else None
    return simulate("all_reduce", "ring", 64 << 20, cluster.network(slots), p, cluster.gamma).seconds


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ratio", [2, 4])
def test_oversubscribed_leaf_spine_slows_a_cross_leaf_ring_by_the_ratio(ratio):
    p, n = 16, 64 << 20
    # every leaf uplink carries p/2 flows and has p/2 NICs' worth of bandwidth / ratio: each flow gets 1/ratio
    predicted = 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA * ratio + (p - 1) / p * n * GAMMA
    assert cross_leaf_ring(p, ratio, interleaved=True) == pytest.approx(predicted, rel=0.01)
    extra = cross_leaf_ring(p, ratio, True) - cross_leaf_ring(p, 1, True)
    bandwidth_term = extra / (2 * (p - 1) / p * n * BETA)
    assert bandwidth_term == pytest.approx(ratio - 1, rel=0.01)
    # placed in rank order only two flows cross the spine: the oversubscription costs nothing
    in_order = cross_leaf_ring(p, ratio, interleaved=False)
    assert in_order == pytest.approx(cross_leaf_ring(p, 1, interleaved=False), rel=1e-6)


@pytest.mark.timeout(30)
def test_receivers_share_their_link_fairly():
    # parameter server: p-1 workers push into rank 0's one link at once, then it answers one at a time
    p, n = 5, 8 << 20
    seconds = ideal("all_reduce", "ps", p, n)
    # the pushes take (p-1)·n·β together (shared link), the reductions (p-1)·n·γ, the answers (p-1)(α+nβ)
    assert seconds >= (p - 1) * n * BETA + (p - 1) * (ALPHA + n * BETA)
    assert seconds == pytest.approx(2 * (p - 1) * (ALPHA + n * BETA) + (p - 1) * n * GAMMA, rel=0.05)


@pytest.mark.timeout(30)
def test_a_straggler_rank_and_a_slow_link_slow_the_ring():
    cluster = Cluster(nodes=4)
    fast = simulate("all_reduce", "ring", 64 << 20, cluster.network(), cluster.size, cluster.gamma).seconds
    slow_rank = simulate("all_reduce", "ring", 64 << 20, cluster.network(), cluster.size, cluster.gamma,
                         slowdown={5: 100.0}).seconds
    slow = Cluster(nodes=4, slow_links={"node1.nic0.in": 4.0})
    slow_link = simulate("all_reduce", "ring", 64 << 20, slow.network(), slow.size, slow.gamma).seconds
    assert slow_rank > 1.2 * fast and slow_link > 1.5 * fast


@pytest.mark.timeout(30)
def test_symbolic_buffers_cost_no_memory():
    huge = symbolic(1 << 40, np.float32)   # 4 TiB
    assert huge.nbytes == 4 << 40 and huge[10:20].nbytes == 40
    assert np.empty_like(huge[: 1 << 30]).nbytes == 4 << 30
    result = simulate("all_reduce", "recursive_doubling", 1 << 40, IdealNetwork(4, ALPHA, BETA), 4, GAMMA)
    assert result.seconds == pytest.approx(2 * (ALPHA + (1 << 40) * (BETA + GAMMA)), rel=1e-6)


@pytest.mark.timeout(30)
def test_real_buffers_are_delivered_and_reduced():
    world = SimWorld(4, IdealNetwork(4, ALPHA, BETA), GAMMA)

    def body(transport):
        buf = np.full(6, transport.rank + 1.0)
        lookup("all_reduce", "rabenseifner").run(Channel(transport, 1, math.inf, "t"), buf, SUM)
        return buf

    assert all((out == 10.0).all() for out in world.run(body))


@pytest.mark.timeout(30)
def test_a_gather_of_blocks_by_index_is_charged_as_the_copy_it_is():
    """bruck packs its blocks with `np.take`: the simulated rank pays the bytes it gathers."""
    world = SimWorld(1, IdealNetwork(1, ALPHA, BETA), copy_seconds_per_byte=1e-9)

    def body(transport):
        blocks, packed = symbolic(4096).reshape(4, 1024), symbolic(2048).reshape(2, 1024)
        np.take(blocks, np.array([1, 3]), axis=0, out=packed)             # 8 KiB of float32
        assert np.take(blocks, np.array([0, 2, 3]), axis=0).shape == (3, 1024)   # 12 KiB more
        return transport.clock

    assert world.run(body)[0] == pytest.approx(20 * 1024 * 1e-9)


@pytest.mark.timeout(30)
def test_a_deadlock_is_reported_not_hung():
    world = SimWorld(2, IdealNetwork(2, ALPHA, BETA))

    def body(transport):
        channel = Channel(transport, 1, math.inf, "t")
        channel.wait(channel.recv(np.zeros(1), 1 - transport.rank))   # both receive, nobody sends

    with pytest.raises(SimulationFailed, match="deadlock"):
        world.run(body)


@pytest.mark.timeout(60)
def test_hierarchical_all_reduce_runs_over_sim_subgroups_and_beats_a_flat_ring_across_nodes():
    cluster = Cluster(nodes=4, nodes_per_leaf=2, oversubscription=2)
    nbytes = 256 << 20
    flat = simulate("all_reduce", "ring", nbytes, cluster.network(), cluster.size, cluster.gamma)
    hier = simulate_hierarchical(nbytes, cluster.network(), cluster.size, 8, "ring", cluster.gamma)
    assert hier.seconds < flat.seconds
    # each NIC carries 2(k-1)/k of 1/8 of the buffer across k = 4 nodes: at 50 GB/s that bounds it below
    assert hier.seconds > 2 * 3 / 4 * nbytes / 8 / cluster.nic_bandwidth


@pytest.mark.timeout(120)
def test_simulation_speed_small():
    start = time.perf_counter()
    simulate("all_reduce", "ring", 1 << 30, IdealNetwork(128, ALPHA, BETA), 128, GAMMA)
    simulate("all_reduce", "tree", 1024, IdealNetwork(128, ALPHA, BETA), 128, GAMMA)
    assert time.perf_counter() - start < 30


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(os.environ.get("COLLS_SIM_SPEED") != "1", reason="speed check: COLLS_SIM_SPEED=1")
@pytest.mark.parametrize("algorithm,nbytes", [("ring", 1 << 30), ("tree", 1024)])
def test_simulation_speed_1024_ranks(algorithm, nbytes):
    result = simulate("all_reduce", algorithm, nbytes, IdealNetwork(1024, ALPHA, BETA), 1024, GAMMA)
    assert result.wall_seconds <= 60


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(os.environ.get("COLLS_SIM_SPEED") != "1", reason="speed check: COLLS_SIM_SPEED=1")
def test_simulation_speed_8192_ranks_hierarchical():
    """The issue's bar: 8192 ranks, 8 per node, in 10 minutes. Across the 1024 nodes Rabenseifner
    (2 log2 1024 messages per rank); a ring there sends 2 x 1023 per rank, ~17 M in all."""
    cluster = Cluster(nodes=1024, nodes_per_leaf=16)
    result = simulate_hierarchical(1 << 30, cluster.network(), cluster.size, 8, "rabenseifner", cluster.gamma)
    assert result.wall_seconds <= 600 and result.seconds > 0


# -- symmetric ranks simulated once (transports/sim/symmetry.py) ---------------------------------

def full_and_fast(collective: str, algorithm: str, nbytes: int, network, size: int):
    """The same call simulated on every rank, and through `simulate` (one rank per orbit)."""
    def body(transport):
        return run_algorithm(transport, collective, algorithm, nbytes)

    full = run_world(size, network(), body, GAMMA, what=(collective, algorithm, nbytes))
    return full, simulate(collective, algorithm, nbytes, network(), size, GAMMA)


def assert_same(full, fast) -> None:
    assert fast.seconds == pytest.approx(full.seconds, rel=1e-12, abs=0)
    assert (fast.messages, fast.bytes_sent) == (full.messages, full.bytes_sent)


@pytest.mark.parametrize("collective,algorithm,period", [
    ("all_reduce", "ring", 16), ("all_reduce", "ring_segmented", 16), ("all_gather", "ring", 16),
    ("reduce_scatter", "ring", 16), ("all_reduce", "rabenseifner", 16),
    ("all_reduce", "recursive_doubling", 16)])
@pytest.mark.parametrize("oversubscription", [1, 2])
def test_symmetric_ranks_simulated_once_give_the_full_answer(collective, algorithm, period, oversubscription):
    """4 nodes of 8 under leaves of 2 nodes: a shift or xor by 16 ranks maps the cluster to itself."""
    cluster = Cluster(nodes=4, nodes_per_leaf=2, oversubscription=oversubscription)
    full, fast = full_and_fast(collective, algorithm, 32 << 20, cluster.network, cluster.size)
    assert (full.ranks_simulated, fast.ranks_simulated) == (32, period)
    assert_same(full, fast)


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_symmetric_ranks_on_an_ideal_network_are_one_rank(algorithm):
    full, fast = full_and_fast("all_reduce", algorithm, 1 << 20, lambda: IdealNetwork(16, ALPHA, BETA), 16)
    assert fast.ranks_simulated == 1
    assert_same(full, fast)


@pytest.mark.parametrize("inter", ["ring", "rabenseifner"])
def test_hierarchical_all_reduce_simulated_once_per_orbit_gives_the_full_answer(inter):
    cluster = Cluster(nodes=8, nodes_per_leaf=2, oversubscription=2)
    layout = Layout(tuple(rank // 8 for rank in range(cluster.size)))

    def body(transport):
        return hierarchical_all_reduce(transport, 64 << 20, 8, inter, layout=layout)

    full = run_world(cluster.size, cluster.network(), body, cluster.gamma)
    fast = simulate_hierarchical(64 << 20, cluster.network(), cluster.size, 8, inter, cluster.gamma)
    assert (full.ranks_simulated, fast.ranks_simulated) == (64, 16)
    assert_same(full, fast)


def test_asymmetric_cases_simulate_every_rank():
    """A slow link, a straggler, a buffer that does not split evenly, a schedule with a root."""
    cluster = Cluster(nodes=4, nodes_per_leaf=2)
    slow = Cluster(nodes=4, nodes_per_leaf=2, slow_links={"node1.nic7.out": 4.0})
    nbytes = 32 << 20
    even = simulate("all_reduce", "ring", nbytes, cluster.network(), 32, cluster.gamma)
    cases = [simulate("all_reduce", "ring", nbytes, slow.network(), 32, slow.gamma),
             simulate("all_reduce", "ring", nbytes, cluster.network(), 32, cluster.gamma,
                      slowdown={5: 100.0}),
             simulate("all_reduce", "ring", nbytes + 4, cluster.network(), 32, cluster.gamma),
             simulate("all_reduce", "tree", nbytes, cluster.network(), 32, cluster.gamma)]
    assert [case.ranks_simulated for case in cases] == [32] * 4
    assert even.ranks_simulated == 16
    assert cases[0].seconds > even.seconds and cases[1].seconds > even.seconds


@pytest.mark.parametrize("algorithm", ["tree", "ps"])
def test_a_schedule_that_is_not_symmetric_falls_back_to_every_rank(algorithm):
    """Told (wrongly) that a rooted schedule is symmetric, the quotient deadlocks or mismatches a
    size, and every rank is simulated: the same answer as the full simulation."""
    cluster = Cluster(nodes=4, nodes_per_leaf=2)

    def body(transport):
        return run_algorithm(transport, "all_reduce", algorithm, 32 << 20)

    full = run_world(32, cluster.network(), body, cluster.gamma)
    told = run_world(32, cluster.network(), body, cluster.gamma, symmetry="shift")
    assert told.ranks_simulated == 32
    assert told.seconds == full.seconds


class PostingNetwork(IdealNetwork):
    post_seconds = 1e-6   # software per message: more than links and routes, which no symmetry takes


def test_a_network_with_more_than_links_is_simulated_on_every_rank():
    with pytest.raises(NotSymmetric):
        SimWorld(8, PostingNetwork(8, ALPHA, BETA), symmetry=Symmetry(8, 1, "shift"))
    result = simulate("all_reduce", "ring", 1 << 20, PostingNetwork(8, ALPHA, BETA), 8, GAMMA)
    assert result.ranks_simulated == 8


def test_symmetry_checks_the_network():
    cluster = Cluster(nodes=4, nodes_per_leaf=2)
    quotient = Symmetry(32, 16, "shift")
    assert quotient.route(cluster.network(), 15, 16).links[1].name == "leaf0.up~2"
    with pytest.raises(NotSymmetric):
        Symmetry(32, 8, "shift").route(cluster.network(), 7, 8)   # node 1 -> 2 crosses leaves, 0 -> 1 not
    with pytest.raises(NotSymmetric):
        Symmetry(32, 16, "shift").route(Cluster(nodes=4, nodes_per_leaf=2, slow_links={"gpu3.out": 2.0})
                                        .network(), 3, 4)
    with pytest.raises(ValueError, match="powers of two"):
        Symmetry(24, 8, "xor")
