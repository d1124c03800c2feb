"""`colls plan calibrate`: the shared-memory model's pieces (protocols, CPUs, time sharing) and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from colls.plan.calibrate import (
    batches_apart,
    compare,
    in_mode,
    load_profiles,
    measured_medians,
    placements_seen,
    reproducibility,
    seen_placement,
)
from colls.plan.profile import Profile
from colls.plan.shared_memory import SharedMemory, predict
from colls.plan.simulate import run_world
from transports.sim import IdealNetwork, TimeSharing

KIB, MIB = 1 << 10, 1 << 20


def profile(ranks: int = 2, cores: int = 2, spin: float = 0.0, wake: float = 0.0) -> Profile:
    """A made-up machine: FIFO messages 5 us + 1 ns/B, cross-memory attach 10 us + 0.1 ns/B."""
    fifo = [(n, 5e-6 + n * 1e-9) for n in (8, 16 * KIB, 32 * KIB)]
    cma = [(n, 10e-6 + n * 1e-10) for n in (64 * KIB, MIB, 64 * MIB)]
    work = ((KIB, 1e-10), (64 * MIB, 4e-10))
    return Profile(ranks, cores, tuple(fifo + cma), 2e-6, {"broadcast": 6e-6, "all_reduce": 7e-6},
                   work, work, spin, wake)


def test_message_cost_follows_the_protocol_of_its_size():
    machine = profile()
    for nbytes, seconds in machine.message:
        alpha, beta = machine.message_cost(nbytes)
        assert alpha + nbytes * beta == pytest.approx(seconds, rel=1e-9)
    assert machine.message_cost(20 * KIB) == pytest.approx((5e-6, 1e-9))       # FIFO, between points
    assert machine.message_cost(256 * KIB) == pytest.approx((10e-6, 1e-10))    # cross-memory attach
    assert machine.message_cost(256 * MIB) == pytest.approx((10e-6, 1e-10))    # beyond: the last slope
    # a measured time that falls with size (noise) is no negative β: the time is kept, α dropped
    odd = Profile(2, 2, ((64 * KIB, 50e-6), (MIB, 40e-6)), 0.0, {}, ((1, 0.0),), ((1, 0.0),))
    alpha, beta = odd.message_cost(MIB)
    assert beta == 0.0 and alpha == pytest.approx(50e-6)


def test_work_costs_interpolate_on_log_size_and_stay_flat_outside():
    machine = profile()
    assert machine.reduce_seconds_per_byte(KIB) == pytest.approx(1e-10)
    assert machine.reduce_seconds_per_byte(8 * KIB) == pytest.approx(1e-10 + 3e-10 * 3 / 16)
    assert machine.copy_seconds_per_byte(1 << 30) == pytest.approx(4e-10)


def test_fifo_messages_busy_both_cpus_cross_memory_attach_is_the_receivers_work():
    network = SharedMemory(4, profile(), footprint=64 * MIB)
    large = network.route_for(1, 2, 4 * MIB)
    small = SharedMemory(4, profile(), cores=4, footprint=4 * KIB).route_for(1, 2, 4 * KIB)   # a core each
    # the sender copies in, then the receiver copies out: half the per-byte cost each
    assert [link.name for link in small.links] == ["rank1.cpu", "cores"]
    assert [link.name for link in small.then.links] == ["rank2.cpu", "cores"]
    assert small.byte_weight == small.then.byte_weight == pytest.approx(1e-9 / 1e-10 / 2)
    assert small.alpha == pytest.approx(5e-6) and small.eager and not small.pull
    # the receiver copies on its own clock once it posted its receive; no link carries the bytes
    assert large.links == () and large.rendezvous and large.pull == pytest.approx(1e-10)
    assert large.alpha == pytest.approx(10e-6)
    # a piece of a call whose buffers are out of cache copies at the call size's rate
    slow = Profile(2, 2, ((8, 5e-6), (16 * KIB, 6e-6), (64 * KIB, 10e-6), (MIB, 110e-6), (64 * MIB, 40e-3)),
                   0.0, {}, ((1, 0.0),), ((1, 0.0),))
    assert SharedMemory(2, slow, footprint=64 * MIB).route_for(0, 1, MIB).pull > \
        SharedMemory(2, slow, footprint=MIB).route_for(0, 1, MIB).pull


def test_with_more_ranks_than_cores_a_fifo_receiver_copies_out_on_its_core_at_the_calls_rate():
    machine = profile(4, 2)
    crowded = SharedMemory(4, machine, footprint=16 * KIB).route_for(1, 2, 16 * KIB)
    # the copy out is the receiver's own work (it holds its core), not a flow beside the ranks
    assert crowded.then is None and crowded.eager
    assert crowded.receive_busy == pytest.approx(16 * KIB * 1e-9 / 2)
    assert SharedMemory(4, machine, cores=4, footprint=16 * KIB).route_for(1, 2, 16 * KIB).receive_busy == 0
    # a piece of a call of 64 MiB copies at the rate of copies of 64 MiB (4e-10 s/B against 1e-10)
    piece = SharedMemory(4, machine, footprint=64 * MIB).route_for(1, 2, 16 * KIB)
    slowdown = machine.copy_slowdown(16 * KIB, 64 * MIB)
    assert slowdown == pytest.approx(4e-10 / (1e-10 + 3e-10 * 4 / 16))
    assert piece.byte_weight == pytest.approx(crowded.byte_weight * slowdown)
    assert piece.receive_busy == pytest.approx(crowded.receive_busy * slowdown)


def test_a_fifo_senders_next_message_goes_in_while_the_last_comes_out():
    # two 16 KiB FIFO messages from rank 0 to rank 1 (α 5 us, 1 ns/B, half of it each side): the
    # second's copy in starts when the first's ends (one port), beside the first's copy out
    from transports.sim import SimWorld

    size = 16 * KIB

    def body(transport):
        bufs = [np.zeros(size, np.uint8) for _ in range(2)]
        if transport.rank == 0:
            transport.wait_all([transport.isend(buf, 1, tag) for tag, buf in enumerate(bufs)], float("inf"))
        else:
            transport.wait_all([transport.irecv(buf, 0, tag) for tag, buf in enumerate(bufs)], float("inf"))
        return transport.clock

    half = size * 1e-9 / 2
    received = SimWorld(2, SharedMemory(2, profile())).run(body)[1]
    assert received == pytest.approx(2 * 5e-6 + 3 * half, rel=1e-6)   # one flow each: 2α + 4 halves


def test_a_pulled_message_waits_for_its_receiver_to_run():
    # 4 ranks on 2 cores, rank 0 sends 1 MiB to rank 3, which only gets a core after ranks 1 and 2
    # have computed 1 ms: the send (cross-memory attach) ends after that, not α + Sβ after posting
    import numpy as np

    from transports.sim import SimWorld

    def body(transport):
        buf = np.zeros(16, np.uint8)
        if transport.rank == 0:
            transport.wait_all([transport.isend(np.zeros(MIB, np.uint8), 3, 0)], float("inf"))
            return transport.clock
        if transport.rank == 3:
            transport.wait_all([transport.irecv(np.zeros(MIB, np.uint8), 0, 0)], float("inf"))
        else:
            transport.elapse(1e-3)
        return buf.size

    machine = profile(4, 2)
    assert SimWorld(4, SharedMemory(4, machine, footprint=MIB)).run(body)[0] > 1e-3
    assert SimWorld(4, SharedMemory(4, machine, cores=4, footprint=MIB)).run(body)[0] == \
        pytest.approx(10e-6 + MIB * 1e-10)


def test_broadcast_of_two_ranks_is_its_software_start_and_one_message():
    # the root works in place (no copy of x), so: call + start + α + Sβ of cross-memory attach
    expected = 6e-6 + 2e-6 + 10e-6 + MIB * 1e-10
    assert predict("broadcast", "binomial", 2, MIB, profile()) == pytest.approx(expected, rel=1e-6)
    # an all-reduce also copies x into out first: more than its messages and reduction alone
    assert predict("all_reduce", "recursive_doubling", 2, MIB, profile()) > 7e-6 + 2e-6 + MIB * 1e-10


def test_exchanges_of_four_ranks_on_two_cores_share_them():
    # pairwise all-to-all: every rank copies a block in at once; 4 copies on 2 cores take twice as long
    crowded = predict("all_to_all", "pairwise", 4, 64 * MIB, profile(4, 2))
    roomy = predict("all_to_all", "pairwise", 4, 64 * MIB, profile(4, 4))
    assert crowded > 1.5 * roomy


def _compute_then_barrier(network) -> float:
    from colls.plan.simulate import run_algorithm

    def body(transport):
        transport.elapse(1e-3)
        return run_algorithm(transport, "barrier", "dissemination", 0)

    return run_world(4, network, body).seconds


class _Shared(IdealNetwork):
    def __init__(self, size: int, sharing: TimeSharing) -> None:
        super().__init__(size, 0.0, 0.0)
        self.time_sharing = sharing


def test_time_sharing_serialises_work():
    # 4 ranks compute 1 ms, then meet at a barrier: on 4 cores 1 ms; on 2 cores ranks 2 and 3 run
    # when 0 and 1 wait, and 0 and 1 finish after them: 2 ms and the wake-ups of 4 hand-overs
    assert _compute_then_barrier(_Shared(4, TimeSharing(4, 0.0, 5e-5))) == pytest.approx(1e-3)
    assert _compute_then_barrier(_Shared(4, TimeSharing(2, 0.0, 5e-5))) == pytest.approx(2e-3 + 4 * 5e-5)
    assert _compute_then_barrier(IdealNetwork(4, 0.0, 0.0)) == pytest.approx(1e-3)   # no sharing


def test_a_rank_times_its_call_from_when_it_first_runs():
    # 4 ranks on 2 cores computing 1 ms each and never waiting for one another: ranks 2 and 3 start
    # late, but each rank's own time (what a benchmark's timer sees) is still 1 ms
    def body(transport):
        transport.elapse(1e-3)
        return 0

    assert run_world(4, _Shared(4, TimeSharing(2, 0.0, 5e-5)), body).seconds == pytest.approx(1e-3)


def test_ranks_leave_a_barrier_down_its_tree_and_time_their_call_from_there():
    # 4 ranks pinned two to a core (0, 1, 0, 1) leave a barrier that releases 0 -> 1, 2 and 2 -> 3,
    # 5 us a hand-on, then compute 1 ms: rank 1 leaves at 5 us on its core (rank 3, not released,
    # holds nothing there); rank 2 only once rank 0, which never waits, has returned and handed the
    # core over (50 us); rank 3 a hand-on and a wake-up later. Each times 1 ms from leaving.
    import transports.sim as sim

    def body(transport):
        rank = transport.rank
        transport.leave_barrier(rank & (rank - 1) if rank else None, {0: [1, 2], 2: [3]}.get(rank, []), 5e-6)
        transport.elapse(1e-3)
        return 0

    network = _Shared(4, TimeSharing(2, 0.0, 5e-5, placement=(0, 1, 0, 1)))
    world = sim.SimWorld(4, network)
    world.run(body)
    starts = [rank.started_at for rank in world.ranks]
    assert starts == pytest.approx([0.0, 5e-6, 1.05e-3, 1.105e-3])
    assert world.finish_times == pytest.approx([1e-3] * 4)


def test_a_rank_whose_wait_ends_within_its_spin_keeps_its_core():
    from types import SimpleNamespace

    from transports.sim.ranks import _Cores

    cores = _Cores(TimeSharing(1, spin=1e-3, wake=5e-5))
    a, b = (SimpleNamespace(core=None, wake=0.0, in_sendrecv=False, in_barrier=False) for _ in range(2))
    assert cores.claim(a, 0.0) and a.wake == 0.0           # an idle core: no wake-up
    cores.release(a, 1e-4)                                  # a waits from 0.1 ms, spinning until 1.1 ms
    assert not cores.claim(b, 5e-4) and cores.next_free() == pytest.approx(1.1e-3)
    assert cores.claim(a, 5e-4) and a.wake == 0.0           # its wait ended while it spun: still its core
    cores.release(a, 6e-4)
    assert cores.claim(b, 1.6e-3) and b.wake == 5e-5        # a yielded at 1.6 ms: b takes it, and wakes
    assert a.core is None
    cores.release(b, 1.7e-3)                                # b returned at 1.7 ms and spins at its barrier
    assert not cores.claim(a, 2e-3) and cores.claim(a, 2.7e-3) and a.wake == 5e-5


def test_a_rank_that_returned_keeps_its_core_as_long_as_mpis_barrier_polls():
    from types import SimpleNamespace

    from transports.sim.ranks import _Cores

    # colls bench's ranks wait in MPI's barrier once their call is done: it yields after its own
    # measured hold, not after colls' spin
    cores = _Cores(TimeSharing(1, spin=1e-3, wake=5e-5, returned_spin=4e-6))
    a, b = (SimpleNamespace(core=None, wake=0.0, in_sendrecv=False, in_barrier=False) for _ in range(2))
    assert cores.claim(a, 0.0)
    cores.release(a, 1e-4, returned=True)
    assert cores.next_free() == pytest.approx(1.04e-4) and cores.claim(b, 1.05e-4)
    cores.release(b, 2e-4)                                  # b waits in the call: colls' spin
    assert cores.next_free() == pytest.approx(1.2e-3)
    machine = replace(profile(4, 2), barrier_hold=4e-6)
    assert SharedMemory(4, machine).time_sharing.returned_spin == 4e-6
    # taking a yielded core back costs at least the one-slot hand-over measured (a general
    # wake-up measured as 0, as older profiles did, is not one)
    assert SharedMemory(4, replace(machine, wake=0.0, one_slot_wake=3e-6)).time_sharing.wake == 3e-6
    assert SharedMemory(4, replace(machine, wake=5e-6, one_slot_wake=3e-6)).time_sharing.wake == 5e-6
    assert SharedMemory(4, profile(4, 2)).time_sharing.returned_spin is None   # unmeasured: `spin`


def test_a_fused_exchange_is_work_that_holds_the_core():
    import numpy as np

    from transports.sim import SimWorld, symbolic

    # a 16 KiB exchange takes 5 us; a FIFO send of 16 KiB kept its sender 2 us: each rank copies
    # in 2 us, the bytes take 1 us, each copies out 2 us
    machine = replace(profile(2, 1), start=0.0, exchange=((8, 3e-6), (16 * KIB, 5e-6)),
                      send=((8, 1e-6), (16 * KIB, 2e-6)))
    route = SharedMemory(2, machine).exchange_route(0, 1, 16 * KIB)
    assert (route.send_busy, route.alpha, route.receive_busy) == pytest.approx((2e-6, 1e-6, 2e-6))
    # the cross-memory sizes: both read the other's buffer, all but the smallest message's time
    # the reader's (not all but the α of the line through the big messages' times, 10 us here)
    cma = SharedMemory(2, replace(machine, exchange=machine.exchange + ((MIB, 60e-6),),
                                  exchange_rendezvous=2 * MIB)).exchange_route(0, 1, MIB)
    assert (cma.send_busy, cma.receive_busy) == (0.0, pytest.approx(60e-6 - (5e-6 + 8 * 1e-9)))

    def body(transport):
        peer = 1 - transport.rank
        transport.sendrecv(symbolic(16 * KIB, np.uint8), peer, symbolic(16 * KIB, np.uint8), peer, 0,
                           float("inf"))
        return 0

    def seconds(cores: int, network_machine) -> float:
        world = SimWorld(2, SharedMemory(2, network_machine, cores))
        world.run(body)
        return max(world.finish_times)

    assert seconds(2, machine) == pytest.approx(5e-6)   # a core each: the measured exchange
    # one core, no spin or wake: rank 0 copies in [0, 2], waits; rank 1 copies in [2, 4], copies
    # rank 0's out [4, 6] and returns; rank 0 copies rank 1's out [6, 8]. Priced as waiting, the
    # ranks shared the core for nothing: 5 us
    assert seconds(1, machine) == pytest.approx(8e-6)
    assert seconds(1, replace(machine, send=())) == pytest.approx(5e-6)


def test_profiles_combine_by_median_or_fastest(tmp_path):
    def write(name: str, ranks: int, eight_bytes: float) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"ranks": ranks, "cores": 2, "start_s": 1e-6,
                                    "call_s": {"broadcast": 5e-6},
                                    "message_s": {"8": eight_bytes, "65536": 1e-5},
                                    "reduce_s_per_byte": {"1024": 1e-10},
                                    "copy_s_per_byte": {"1024": 1e-10}}))
        return str(path)

    files = [write("a.json", 2, 5e-6), write("b.json", 2, 7e-6), write("c.json", 2, 30e-6),
             write("d.json", 4, 1e-6)]
    assert sorted(load_profiles(files)) == [2, 4]
    assert load_profiles(files)[2].message[0] == (8, pytest.approx(7e-6))
    assert load_profiles(files, "fastest")[2].message[0] == (8, pytest.approx(5e-6))


def _bench_files(tmp_path) -> list[str]:
    record = {"implementation": "colls", "collective": "broadcast", "algorithm": "binomial", "ranks": 2,
              "bytes": MIB}
    runs = []
    for i, seconds in enumerate((1e-4, 2e-4, 9e-4)):   # median 2e-4, fastest 1e-4
        path = tmp_path / f"bench{i}.json"
        path.write_text(json.dumps({"records": [dict(record, time_median_s=seconds)]}))
        runs.append(str(path))
    return runs


def test_bench_runs_combine_by_median_or_fastest(tmp_path):
    runs = _bench_files(tmp_path)
    key = ("broadcast", "binomial", 2, MIB, None)   # None: ranks not pinned
    assert measured_medians(runs)[key] == pytest.approx(2e-4)
    assert measured_medians(runs, "fastest")[key] == pytest.approx(1e-4)


def test_pinned_runs_are_points_of_their_own_and_the_bench_is_judged_against_itself(tmp_path):
    record = {"implementation": "colls", "collective": "broadcast", "algorithm": "pipeline", "ranks": 4,
              "bytes": MIB}
    runs = []
    for i, (seconds, placement) in enumerate(((1e-4, None), (2e-4, None), (1e-4, None), (2e-4, None),
                                              (5e-4, [0, 1, 0, 1]), (6e-4, [0, 1, 0, 1]))):
        path = tmp_path / f"bench{i}.json"
        path.write_text(json.dumps({"records": [dict(record, time_median_s=seconds, placement=placement)]}))
        runs.append(str(path))
    medians = measured_medians(runs)
    assert medians == {("broadcast", "pipeline", 4, MIB, None): pytest.approx(1.5e-4),
                       ("broadcast", "pipeline", 4, MIB, (0, 1, 0, 1)): pytest.approx(5.5e-4)}
    # alternate runs: 1e-4, 1e-4 against 2e-4, 2e-4 (100% apart); 5e-4 against 6e-4 (20%)
    mean, worst, count = reproducibility(runs)[4]
    assert count == 2 and worst == pytest.approx(1.0)
    assert mean == pytest.approx(math.sqrt(2.0 * 1.2) - 1)
    assert reproducibility(runs[:1]) == {}   # one run: nothing to compare


def test_a_pinned_point_is_predicted_at_its_placement():
    from colls.plan.shared_memory import placements
    from colls.plan.simulate import run_algorithm

    machine = profile(4, 2, spin=2e-5, wake=2e-5)

    def body(transport):
        transport.elapse(6e-6 + 2e-6)
        return run_algorithm(transport, "broadcast", "pipeline", MIB)

    times = {}
    for placement in placements(4, 2):
        network = SharedMemory(4, machine, footprint=2 * MIB)
        network.time_sharing = replace(network.time_sharing, placement=placement)
        times[placement] = run_world(4, network, body, machine.reduce_seconds_per_byte(2 * MIB),
                                     machine.copy_seconds_per_byte(2 * MIB)).seconds
        assert predict("broadcast", "pipeline", 4, MIB, machine, placement=placement) == pytest.approx(
            times[placement])
    assert len(set(round(t, 9) for t in times.values())) > 1   # the placement matters at all
    # on as many cores as ranks a recorded placement shares nothing
    spread = predict("broadcast", "pipeline", 4, MIB, machine, cores=4, placement=(0, 1, 2, 3))
    assert spread == pytest.approx(predict("broadcast", "pipeline", 4, MIB, machine, cores=4))


def test_where_the_bench_saw_unpinned_ranks_is_read_and_gives_a_row_per_placement_on_request(tmp_path):
    # each rank's CPU as the point began and ended: the cores numbered as the ranks first name them
    assert seen_placement({"cpus": [[1, 1], [0, 0], [1, 1], [0, 0]]}) == (0, 1, 0, 1)
    assert seen_placement({"cpus": [[0, 0], [1, 1], [1, 1], [0, 0]]}) == (0, 1, 1, 0)
    assert seen_placement({"cpus": [[0, 0], [1, 0], [1, 1], [0, 0]]}) is None   # rank 1 moved
    assert seen_placement({}) is None
    machine = profile(4, 2, spin=2e-5, wake=2e-5)
    record = {"implementation": "colls", "collective": "broadcast", "algorithm": "pipeline", "ranks": 4,
              "bytes": MIB}
    runs = []
    for i, (seconds, cpus) in enumerate(((3e-4, [[1, 1], [1, 1], [0, 0], [0, 0]]),
                                         (5e-4, [[1, 1], [0, 0], [0, 0], [1, 1]]),
                                         (4e-4, [[0, 0], [1, 1], [1, 1], [0, 0]]),
                                         (9e-4, [[0, 0], [1, 0], [1, 1], [0, 0]]))):
        path = tmp_path / f"bench{i}.json"
        path.write_text(json.dumps({"records": [dict(record, time_median_s=seconds, cpus=cpus)]}))
        runs.append(str(path))
    assert placements_seen(runs) == {4: {"0011": 1, "0110": 2, "-": 1}}
    # by default one row, predicted as the mean over every placement
    (point,) = compare(runs, {4: machine})
    assert point.measured == pytest.approx(4.5e-4) and point.placement is None
    assert point.predicted == pytest.approx(predict("broadcast", "pipeline", 4, MIB, machine))
    # on request a row per placement seen, predicted there (the moved rank's run at the mean)
    rows = {p.placement: p for p in compare(runs, {4: machine}, by_placement=True)}
    assert set(rows) == {(0, 0, 1, 1), (0, 1, 1, 0), None}
    assert rows[(0, 1, 1, 0)].measured == pytest.approx(4.5e-4) and rows[None].measured == pytest.approx(9e-4)
    for placement in ((0, 0, 1, 1), (0, 1, 1, 0)):
        assert rows[placement].predicted == pytest.approx(
            predict("broadcast", "pipeline", 4, MIB, machine, placement=placement))
    assert rows[(0, 0, 1, 1)].predicted != pytest.approx(rows[(0, 1, 1, 0)].predicted)   # it matters here
    assert rows[None].predicted == pytest.approx(point.predicted)


def test_batches_apart_is_the_best_a_model_that_prices_every_batch_alike_can_do(tmp_path):
    record = {"implementation": "colls", "collective": "broadcast", "algorithm": "binomial", "ranks": 4}

    def batch(name: str, times: dict[int, list[float]]) -> list[str]:
        paths = []
        for i in range(max(len(runs) for runs in times.values())):
            path = tmp_path / f"{name}{i}.json"
            path.write_text(json.dumps({"records": [dict(record, bytes=nbytes, time_median_s=runs[i])
                                                    for nbytes, runs in times.items() if i < len(runs)]}))
            paths.append(str(path))
        return paths

    first = batch("a", {KIB: [1e-5, 2e-5, 3e-5], MIB: [4e-4]})
    second = batch("b", {KIB: [8e-5], MIB: [4e-4], 4 * MIB: [1e-3]})   # 4 MiB only here: left out
    mean, worst, count = batches_apart([first, second])[4]
    assert count == 2
    # 1 KiB: medians 20 and 80 us, the middle 40 us is 2x from each; 1 MiB: alike, 0 off
    assert worst == pytest.approx(1.0)
    assert mean == pytest.approx(math.exp((2 * math.log(2) + 0 + 0) / 4) - 1)
    assert batches_apart([first, first])[4][:2] == (pytest.approx(0.0), pytest.approx(0.0))


def test_pinned_ranks_on_one_core_copy_at_the_local_rate_and_leave_the_barrier_in_turn(tmp_path):
    machine = replace(profile(4, 2, spin=2e-5, wake=2e-5), send=((8, 3e-6), (32 * KIB, 40e-6)))
    local = machine.copy_seconds_per_byte(64 * KIB)
    pinned = SharedMemory(4, machine, footprint=64 * KIB, pinned=True)
    pinned.time_sharing = replace(pinned.time_sharing, placement=(0, 1, 0, 1))
    loose = SharedMemory(4, machine, footprint=64 * KIB)
    loose.time_sharing = pinned.time_sharing
    # a FIFO message to a rank on the sender's core: each copy at the local rate, the sender's
    # included (its send, measured between two cores, is not what it pays)
    together = pinned.route_for(0, 2, 16 * KIB)
    assert together.receive_busy == pytest.approx(16 * KIB * local)
    assert together.send_busy + pinned._send_busy(16 * KIB) == pytest.approx(16 * KIB * local)
    # an exchange between them: the smallest exchange's hold, and each rank's two copies at that rate
    exchanging = replace(machine, exchange=((8, 4e-6), (32 * KIB, 60e-6)))
    pair = SharedMemory(4, exchanging, footprint=64 * KIB, pinned=True)
    pair.time_sharing = pinned.time_sharing
    least, step = pair.exchange_route(0, 2, 8, apart=True), pair.exchange_route(0, 2, 16 * KIB)
    assert step.send_busy == pytest.approx(least.send_busy + 16 * KIB * local)
    assert step.receive_busy == pytest.approx(least.receive_busy + 16 * KIB * local)
    assert step.alpha == pytest.approx(least.alpha)
    # to the other core, or unpinned, as measured
    def priced(route):
        return route.alpha, route.byte_weight, route.send_busy, route.receive_busy

    assert priced(pinned.route_for(0, 1, 16 * KIB)) == priced(loose.route_for(0, 1, 16 * KIB))
    assert loose.route_for(0, 2, 16 * KIB).receive_busy != pytest.approx(16 * KIB * local)
    # pinned points are predicted so; a placement only seen (unpinned) is not
    at = (0, 1, 0, 1)
    assert (predict("broadcast", "binomial", 4, 16 * KIB, machine, placement=at, pinned=True)
            != pytest.approx(predict("broadcast", "binomial", 4, 16 * KIB, machine, placement=at)))
    assert (predict("broadcast", "binomial", 4, 16 * KIB, machine, pinned=True)
            == pytest.approx(predict("broadcast", "binomial", 4, 16 * KIB, machine)))   # no placement
    record = {"implementation": "colls", "collective": "broadcast", "algorithm": "binomial", "ranks": 4,
              "bytes": 16 * KIB, "time_median_s": 1e-4}
    pinned_file, seen_file = tmp_path / "pinned.json", tmp_path / "seen.json"
    pinned_file.write_text(json.dumps({"records": [dict(record, placement=list(at))]}))
    seen_file.write_text(json.dumps({"records": [dict(record, cpus=[[0, 0], [1, 1], [0, 0], [1, 1]])]}))
    (point,) = compare([str(pinned_file)], {4: machine})
    assert point.predicted == pytest.approx(predict("broadcast", "binomial", 4, 16 * KIB, machine,
                                                    placement=at, pinned=True))
    (point,) = compare([str(seen_file)], {4: machine}, by_placement=True)
    assert point.predicted == pytest.approx(predict("broadcast", "binomial", 4, 16 * KIB, machine,
                                                    placement=at))


def test_a_round_trip_window_keeps_only_what_was_measured_in_that_mode(tmp_path):
    assert in_mode({}, None) and in_mode({"round_trip_ns": [700.0, 300.0]}, None)
    assert in_mode({"round_trip_ns": [260.0, 310.0]}, (0, 450))
    assert not in_mode({"round_trip_ns": [260.0, 650.0]}, (0, 450))   # the mode changed midway
    assert not in_mode({}, (0, 450)) and not in_mode({"round_trip_ns": [None, None]}, (0, 450))
    # by the 256 KiB exchange, or by both
    slow = {"round_trip_ns": [660.0, 690.0], "exchange_us": [139.0, 143.0]}
    assert in_mode(slow, {"exchange_us": (80, 1000)}) and not in_mode(slow, {"exchange_us": (0, 80)})
    assert in_mode(slow, {"round_trip_ns": (450, 2000), "exchange_us": (80, 1000)})
    assert not in_mode(slow, {"round_trip_ns": (0, 450), "exchange_us": (80, 1000)})
    assert not in_mode({"round_trip_ns": [300.0, 310.0]}, {"exchange_us": (0, 80)})   # not measured
    record = {"implementation": "colls", "collective": "broadcast", "algorithm": "binomial", "ranks": 2,
              "bytes": MIB}
    runs = []
    for i, (seconds, trips) in enumerate(((1e-4, [300, 310]), (5e-4, [650, 640]), (2e-4, [280, 290]),
                                          (9e-4, None))):
        path = tmp_path / f"bench{i}.json"
        path.write_text(json.dumps({"records": [dict(record, time_median_s=seconds, round_trip_ns=trips)]}))
        runs.append(str(path))
    key = ("broadcast", "binomial", 2, MIB, None)
    assert measured_medians(runs, "median", (0, 450))[key] == pytest.approx(1.5e-4)
    assert measured_medians(runs, "median", (450, 2000))[key] == pytest.approx(5e-4)
    assert measured_medians(runs, "median")[key] == pytest.approx(3.5e-4)   # no window: all four

    def write(name: str, eight_bytes: float, trips: list | None) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"ranks": 2, "cores": 2, "start_s": 1e-6, "call_s": {"broadcast": 5e-6},
                                    "message_s": {"8": eight_bytes, "65536": 1e-5},
                                    "reduce_s_per_byte": {"1024": 1e-10}, "copy_s_per_byte": {"1024": 1e-10},
                                    "round_trip_ns": trips}))
        return str(path)

    files = [write("a.json", 5e-6, [300, 320]), write("b.json", 9e-6, [640, 660]),
             write("c.json", 7e-6, None)]
    assert load_profiles(files, "median", (0, 450))[2].message[0] == (8, pytest.approx(5e-6))
    assert load_profiles(files, "median", (450, 2000))[2].message[0] == (8, pytest.approx(9e-6))
    assert load_profiles(files, "median", (1000, 2000)) == {}


@pytest.mark.timeout(60)
def test_cli_calibrate_reads_bench_and_profile_files(tmp_path):
    machine = profile()
    entry = {"ranks": 2, "cores": 2, "message_s": {str(n): t for n, t in machine.message}, "start_s": 2e-6,
             "spin_s": 1e-5, "wake_s": 4e-5, "call_s": machine.call,
             "reduce_s_per_byte": {str(n): t for n, t in machine.reduce},
             "copy_s_per_byte": {str(n): t for n, t in machine.copy}}
    path = tmp_path / "profile2.json"
    path.write_text(json.dumps(entry))
    result = subprocess.run([sys.executable, "-m", "colls.cli", "plan", "calibrate", "--profile", str(path),
                             "--runs", "fastest", "--bench", *_bench_files(tmp_path)],
                            capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    assert "| broadcast | 2 | 1 MiB | binomial | 100.0 us | 122.9 us | +22.9% |" in result.stdout
    assert "2 ranks: geometric-mean error 22.9%, largest 22.9%" in result.stdout
    # runs 1 and 3 (fastest 100 us) against run 2 (200 us)
    assert ("2 ranks: the bench against itself (alternate runs, each half's fastest; 1 point): 100.0%, "
            "largest 100.0%") in result.stdout
    # a mode window: these files carry no round trips, so nothing is left to compare
    windowed = subprocess.run([sys.executable, "-m", "colls.cli", "plan", "calibrate", "--profile", str(path),
                               "--bench", *_bench_files(tmp_path), "--round-trip", "0-450"],
                              capture_output=True, text=True, timeout=50)
    assert windowed.returncode == 0, windowed.stderr
    assert "round trip of 0-450 ns: profiles at no rank count, 0 bench points" in windowed.stdout
    bad = subprocess.run([sys.executable, "-m", "colls.cli", "plan", "calibrate", "--profile", str(path),
                          "--bench", *_bench_files(tmp_path), "--round-trip", "fast"],
                         capture_output=True, text=True, timeout=50)
    assert bad.returncode != 0 and "--round-trip takes LO-HI in ns, got 'fast'" in bad.stderr
    both = subprocess.run([sys.executable, "-m", "colls.cli", "plan", "calibrate", "--profile", str(path),
                           "--bench", *_bench_files(tmp_path), "--round-trip", "0-450", "--exchange", "0-80"],
                          capture_output=True, text=True, timeout=50)
    assert both.returncode == 0, both.stderr
    assert ("round trip of 0-450 ns and a 256 KiB exchange of 0-80 us: profiles at no rank count"
            in both.stdout)
    # --bench again: another batch, also compared with the first (a batch of one 400 us run)
    other = tmp_path / "other"
    other.mkdir()
    later = subprocess.run([sys.executable, "-m", "colls.cli", "plan", "calibrate", "--profile", str(path),
                            "--bench", *_bench_files(tmp_path), "--bench", *_bench_files(other)[:1]],
                           capture_output=True, text=True, timeout=50)
    assert later.returncode == 0, later.stderr
    assert "2 ranks: the 2 batches against each other (1 point in all of them)" in later.stdout
    # medians 200 us and 100 us: the middle, 141.4 us, is 41.4% off each
    assert "at best 41.4% off, 41.4% the largest" in later.stdout


def test_scratch_buffers_pay_their_first_touch():
    from dataclasses import replace

    # recursive doubling on 2 ranks allocates one scratch buffer of the whole message
    faulting = replace(profile(), alloc=((1, 1e-9),))
    extra = predict("all_reduce", "recursive_doubling", 2, MIB, faulting) - \
        predict("all_reduce", "recursive_doubling", 2, MIB, profile())
    assert extra == pytest.approx(MIB * 1e-9, rel=1e-6)


def test_an_eager_send_is_done_when_posted():
    import numpy as np

    from transports.sim import Route

    class Eager:
        def __init__(self, eager: bool) -> None:
            self.eager = eager

        def route(self, src: int, dst: int) -> Route:
            return Route(1e-3, (), eager=self.eager)

    def body(transport):
        buf = np.zeros(2, np.uint8)
        if transport.rank == 0:
            transport.wait_all([transport.isend(buf, 1, 0)], float("inf"))
        else:
            transport.wait_all([transport.irecv(buf, 0, 0)], float("inf"))
        return transport.clock

    def sender_seconds(eager: bool) -> float:
        from transports.sim import SimWorld

        return SimWorld(2, Eager(eager)).run(body)[0]

    assert sender_seconds(True) == 0.0 and sender_seconds(False) == pytest.approx(1e-3)
    assert SharedMemory(2, profile()).route_for(0, 1, 4 * KIB).eager
    assert not SharedMemory(2, profile()).route_for(0, 1, 4 * MIB).eager


def test_a_fifo_send_keeps_its_sender_for_what_the_profile_measured_of_it():
    from dataclasses import replace

    import numpy as np

    from transports.sim import SimWorld

    # one send through the FIFO keeps its sender 4 us at 8 B, 20 us at 16 KiB (post and copy in)
    sending = replace(profile(4, 4), post=1e-6, send=((8, 4e-6), (16 * KIB, 20e-6)))
    assert sending.send_seconds(8 * KIB) == pytest.approx(4e-6 + (8 * KIB - 8) * 16e-6 / (16 * KIB - 8))
    assert sending.send_seconds(64 * KIB) is None   # cross-memory attach: the receiver copies

    def three_sends(nbytes):
        def body(transport):   # rank 0 sends to 1, 2 and 3, as a direct broadcast's root does
            buf = np.zeros(nbytes, np.uint8)
            if transport.rank == 0:
                transport.wait_all([transport.isend(buf, peer, 0) for peer in (1, 2, 3)], float("inf"))
            else:
                transport.wait_all([transport.irecv(buf, 0, 0)], float("inf"))
            return transport.clock
        return body

    # the root's own time is its three sends, one after another; the messages' arrivals are
    # unchanged (the route's: α from the post on)
    root = SimWorld(4, SharedMemory(4, sending)).run(three_sends(8))
    assert root[0] == pytest.approx(3 * 4e-6)
    plain = SimWorld(4, SharedMemory(4, replace(sending, send=()))).run(three_sends(8))
    assert plain[0] == pytest.approx(3 * 1e-6)
    assert root[1] == pytest.approx(plain[1])
    # a message by cross-memory attach is the receiver's to copy: its sender pays only the post
    big = SimWorld(4, SharedMemory(4, sending)).run(three_sends(MIB))
    assert big == SimWorld(4, SharedMemory(4, replace(sending, send=()))).run(three_sends(MIB))
    # so a direct broadcast's root, priced at its sends, is dearer than at its posts alone
    assert predict("broadcast", "direct", 4, 4 * KIB, sending) > predict("broadcast", "direct", 4, 4 * KIB,
                                                                          replace(sending, send=()))


def test_a_sendrecv_below_the_rendezvous_size_costs_the_measured_exchange_not_two_messages():
    from dataclasses import replace

    import numpy as np

    from transports.shm import fifo_geometry
    from transports.sim import SimWorld, symbolic

    CHUNK = fifo_geometry(2)[0]

    # both ranks exchanging 8 B take 3 us, 16 KiB 5 us (the one-slot step); one message takes
    # 5 us + 1 ns/B, and posting costs 1 us: apart, the exchange would be far dearer
    measured = ((8, 3e-6), (16 * KIB, 5e-6), (MIB, 10e-6 + 2 * MIB * 1e-10))
    fused = replace(profile(), exchange=measured, post=1e-6)
    assert fused.exchange_seconds(8) == pytest.approx(3e-6)
    assert fused.exchange_seconds(8 * KIB) == pytest.approx(3e-6 + (8 * KIB - 8) * 2e-6 / (16 * KIB - 8))
    assert fused.exchange_seconds(4) == pytest.approx(3e-6)               # below the smallest: its time
    assert fused.exchange_seconds(32 * KIB) == pytest.approx(5e-6 + 16 * KIB * 2e-6 / (16 * KIB - 8))
    assert profile().exchange_seconds(8) is None                          # not measured
    network = SharedMemory(2, fused)
    assert network.exchange_route(0, 1, 8).alpha == pytest.approx(3e-6 - fused.start)
    assert network.exchange_route(0, 1, MIB) is None   # from the rendezvous size: the general path
    # a reducing exchange takes its own table, less what the reducing receive charges itself
    summing = replace(fused, exchange_reduce=((8, 4e-6), (16 * KIB, 9e-6)), receive_reduce=5e-7)
    route = SharedMemory(2, summing, footprint=16 * KIB).exchange_route(0, 1, 16 * KIB, reducing=True)
    gamma = summing.reduce_seconds_per_byte(16 * KIB)
    assert route.alpha == pytest.approx(9e-6 - summing.start - 16 * KIB * gamma - 5e-7)
    # from a send buffer written in the call: the written exchanges, where measured
    dirty = replace(fused, exchange_written=((8, 6e-6), (16 * KIB, 8e-6)))
    dirty_network = SharedMemory(2, dirty)
    assert dirty_network.exchange_route(0, 1, 8, written=True).alpha == pytest.approx(6e-6 - fused.start)
    assert dirty_network.exchange_route(0, 1, 8).alpha == pytest.approx(3e-6 - fused.start)
    # one that lands as input ∘ incoming reads a third buffer: its own table, where measured
    sourced = replace(summing, exchange_reduce_source=((8, 5e-6), (16 * KIB, 12e-6)))
    source_route = SharedMemory(2, sourced, footprint=16 * KIB).exchange_route(0, 1, 16 * KIB,
                                                                               reducing="source")
    assert source_route.alpha == pytest.approx(12e-6 - summing.start - 16 * KIB * gamma - 5e-7)
    from algorithms import SUM

    def reduce_from(transport):
        mine, got = np.ones(2, np.float32), np.zeros(2, np.float32)
        transport.sendrecv(mine, 1 - transport.rank, got, 1 - transport.rank, 0, float("inf"),
                           SUM.from_source(mine))
        return transport.clock

    # the simulator tells a from_source reducer apart: 5 us less the start (and less γ, which this
    # world, made without one, does not charge back; the receive's call it does)
    expected = 5e-6 - summing.start - 8 * summing.reduce_seconds_per_byte(8)
    assert SimWorld(2, SharedMemory(2, sourced)).run(reduce_from)[0] == pytest.approx(expected, rel=1e-9)
    # and predict hands Rabenseifner its input apart, as colls' all_reduce(x, out=...) does: its
    # first step is priced by that table (recursive doubling, which copies x first, is not)
    dear = replace(sourced, exchange_reduce_source=((8, 5e-5), (16 * KIB, 12e-5)))
    assert predict("all_reduce", "rabenseifner", 2, 4 * KIB, dear) > \
        predict("all_reduce", "rabenseifner", 2, 4 * KIB, sourced) + 4e-5
    assert predict("all_reduce", "recursive_doubling", 2, 4 * KIB, dear) == \
        pytest.approx(predict("all_reduce", "recursive_doubling", 2, 4 * KIB, sourced))
    # right after a big copy, reduction or receive: the exchanges after a copy, where measured
    busy = replace(fused, exchange_after_copy=((8, 7e-6), (16 * KIB, 20e-6)))
    busy_network = SharedMemory(2, busy)
    assert busy_network.exchange_route(0, 1, 8, written=True, after_work=True).alpha == \
        pytest.approx(7e-6 - fused.start)
    assert busy_network.after_work_bytes == CHUNK + 1 and SharedMemory(2, fused).after_work_bytes is None

    def copy_then_swap(copied):
        def body(transport):
            out, x = symbolic(2 * CHUNK // 4), symbolic(2 * CHUNK // 4)
            np.copyto(out[:copied // 4], x[:copied // 4])
            start = transport.clock
            transport.sendrecv(x[:2], 1 - transport.rank, out[:2], 1 - transport.rank, 0, float("inf"))
            return transport.clock - start
        return body

    # a copy of more than one slot makes the next sendrecv the after-copy one; a smaller one does not
    assert SimWorld(2, busy_network).run(copy_then_swap(2 * CHUNK)) == [pytest.approx(7e-6 - fused.start)] * 2
    assert SimWorld(2, busy_network).run(copy_then_swap(CHUNK)) == [pytest.approx(3e-6 - fused.start)] * 2
    # not measured reducing: the plain table
    plain_route = SharedMemory(2, fused).exchange_route(0, 1, 8, reducing=True)
    assert plain_route.alpha == pytest.approx(3e-6 - fused.start)
    # the FIFO sizes do not enter the contention of cross-memory reads
    assert fused.contention(MIB) == replace(fused, exchange=measured[-1:]).contention(MIB) > 1.9

    def sendrecv(nbytes):
        def body(transport):
            incoming, outgoing = np.zeros(nbytes, np.uint8), np.ones(nbytes, np.uint8)
            transport.sendrecv(outgoing, 1 - transport.rank, incoming, 1 - transport.rank, 0, float("inf"))
            assert incoming.all()   # real bytes still arrive
            return transport.clock
        return body

    assert SimWorld(2, network).run(sendrecv(8)) == [pytest.approx(3e-6 - fused.start)] * 2
    assert SimWorld(2, network).run(sendrecv(16 * KIB)) == [pytest.approx(5e-6 - fused.start)] * 2
    # without the small exchanges measured, a sendrecv is a send and a receive as before: one
    # message's time (its α holds the sender's post; the receive is posted while it flows)
    apart = SimWorld(2, SharedMemory(2, replace(profile(), post=1e-6))).run(sendrecv(8))
    assert apart == [pytest.approx(profile().message[0][1], abs=2e-8)] * 2
    # and a schedule built of sendrecvs follows: recursive doubling at 2 ranks is one exchange
    cheaper = replace(fused, exchange=((8, 2.5e-6), (16 * KIB, 4e-6), measured[-1]))
    assert predict("all_reduce", "recursive_doubling", 2, 4 * KIB, fused) - \
        predict("all_reduce", "recursive_doubling", 2, 4 * KIB, cheaper) == \
        pytest.approx(fused.exchange_seconds(4 * KIB) - cheaper.exchange_seconds(4 * KIB), rel=1e-6)


def test_an_exchange_inside_a_bigger_call_costs_at_least_the_calls_rate():
    from dataclasses import replace

    # exchanges alone: 8 B 3 us, 16 KiB 5 us, 32 KiB 13 us (out of cache: 4x the bytes' cost)
    measured = ((8, 3e-6), (16 * KIB, 5e-6), (32 * KIB, 13e-6))
    spilled = replace(profile(), exchange=measured, rendezvous=64 * KIB)
    alone = SharedMemory(2, spilled, footprint=16 * KIB).exchange_route(0, 1, 16 * KIB)
    assert alone.alpha == pytest.approx(5e-6 - spilled.start)
    # a 16 KiB piece of a 32 KiB call: half the 32 KiB exchange, which is dearer per byte
    piece = SharedMemory(2, spilled, footprint=32 * KIB).exchange_route(0, 1, 16 * KIB)
    assert piece.alpha == pytest.approx(13e-6 / 2 - spilled.start)
    # never cheaper than the piece's own exchange: an 8 B piece of that call still costs 3 us
    small = SharedMemory(2, spilled, footprint=32 * KIB).exchange_route(0, 1, 8)
    assert small.alpha == pytest.approx(3e-6 - spilled.start)


def test_a_plain_exchange_of_a_call_in_huge_pages_costs_what_one_from_huge_pages_took():
    """`colls bench`'s buffers are in huge pages from 4 MiB, and a plain exchange sent from them has
    a threshold of its own (`transports.shm.exchange_huge_bytes`): a 2-rank 4 MiB all_to_all's
    2 MiB exchange went by cross-memory attach, predicted closer by that table than by the small
    pages' one."""
    from dataclasses import replace

    measured = ((8, 3e-6), (MIB, 80e-6), (4 * MIB, 330e-6))        # small pages, through the slots
    huge = ((MIB, 80e-6), (2 * MIB, 98e-6), (4 * MIB, 186e-6))       # huge pages: attach from 2 MiB
    base = replace(profile(), exchange=measured, exchange_rendezvous=32 * MIB, rendezvous=MIB)
    paged = replace(base, exchange_huge=huge)
    big_call = SharedMemory(2, paged, footprint=4 * MIB).exchange_route(0, 1, 2 * MIB)
    whole = big_call.alpha + big_call.send_busy + big_call.receive_busy
    assert whole == pytest.approx(98e-6 - paged.start)
    # a call in small pages, or a reducing exchange, or a profile without the table: as before
    small_call = SharedMemory(2, paged, footprint=2 * MIB).exchange_route(0, 1, 2 * MIB)
    before = SharedMemory(2, base, footprint=2 * MIB).exchange_route(0, 1, 2 * MIB)
    assert small_call.alpha == pytest.approx(before.alpha)
    # (a reducing one from the messages' rendezvous size here: the general path, whatever the pages)
    assert SharedMemory(2, base, footprint=4 * MIB).exchange_route(0, 1, 2 * MIB, reducing=True) is None
    assert SharedMemory(2, paged, footprint=4 * MIB).exchange_route(0, 1, 2 * MIB, reducing=True) is None


def test_posting_is_the_ranks_own_work_so_an_exchange_costs_more_than_one_message():
    from dataclasses import replace

    import numpy as np

    from transports.sim import SimWorld

    posting = replace(profile(), post=3e-6)
    # one message: the sender's post is part of the measured α, nothing changes
    assert predict("broadcast", "binomial", 2, 4 * KIB, posting) == \
        pytest.approx(predict("broadcast", "binomial", 2, 4 * KIB, profile()), rel=1e-9)

    def exchange(transport):   # as colls.tune.exchange_seconds: post the receive, then the send
        incoming, outgoing = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
        receive = transport.irecv(incoming, 1 - transport.rank, 0)
        transport.wait_all([transport.isend(outgoing, 1 - transport.rank, 0), receive], float("inf"))
        return transport.clock

    one_way = posting.message[0][1]
    # (its 8 bytes cross the CPU links both messages share, at half rate: 8 ns more)
    assert max(SimWorld(2, SharedMemory(2, posting)).run(exchange)) == pytest.approx(one_way + 3e-6, abs=1e-8)
    assert max(SimWorld(2, SharedMemory(2, profile())).run(exchange)) == pytest.approx(one_way, abs=1e-8)


def test_an_all_reduce_that_reads_its_input_itself_skips_the_copy_into_out():
    from dataclasses import replace

    from algorithms import lookup

    if not getattr(lookup("all_reduce", "ring"), "takes_source", False):
        pytest.skip("ring copies x into out here")
    cheap = profile()
    dear = replace(cheap, copy=((KIB, 1e-9), (64 * MIB, 1e-9)))   # copies 10x dearer

    def extra(algorithm: str) -> float:
        return predict("all_reduce", algorithm, 2, MIB, dear) - \
            predict("all_reduce", algorithm, 2, MIB, cheap)

    # ring reads x where it lies and copies nothing; recursive doubling copies x into out (and the
    # scratch it exchanges), so it pays at least one buffer's worth more
    assert extra("ring") == pytest.approx(0.0, abs=1e-12)
    assert extra("recursive_doubling") >= MIB * 9e-10


def test_two_cross_memory_reads_at_once_slow_each_other_as_the_exchange_measured():
    from dataclasses import replace

    import numpy as np

    from transports.sim import SimWorld

    # one 1 MiB message: 10 us + 0.1 ns/B; both ranks reading 1 MiB at once: twice the bytes' time
    alone = 10e-6 + MIB * 1e-10
    machine = replace(profile(), exchange=((MIB, 10e-6 + 2 * MIB * 1e-10),))
    assert machine.contention(MIB) == pytest.approx(2.0)
    assert profile().contention(MIB) == 1.0   # nothing measured: no contention

    def exchange(transport):   # a sendrecv: each rank reads all of the other's (shm asks no help)
        incoming, outgoing = np.zeros(MIB, np.uint8), np.zeros(MIB, np.uint8)
        transport.sendrecv(outgoing, 1 - transport.rank, incoming, 1 - transport.rank, 0, float("inf"))
        return transport.clock

    # the second read runs beside the first, and each rank also waits for its own send to be read
    both = SimWorld(2, SharedMemory(2, machine, footprint=MIB)).run(exchange)
    assert both == [pytest.approx(10e-6 + 2 * MIB * 1e-10)] * 2
    single = SimWorld(2, SharedMemory(2, profile(), footprint=MIB)).run(exchange)
    assert single == [pytest.approx(alone)] * 2


def test_a_message_from_a_buffer_its_sender_wrote_reads_at_the_written_rate():
    from dataclasses import replace

    from transports.sim import SimWorld, symbolic

    # one clean 1 MiB message: 10 us + 0.1 ns/B; from a buffer the sender just wrote: 0.3 ns/B
    machine = replace(profile(), written=((64 * KIB, 10e-6 + 64 * KIB * 3e-10), (MIB, 10e-6 + MIB * 3e-10)))
    assert machine.written_slowdown(MIB) == pytest.approx(3.0)
    assert profile().written_slowdown(MIB) == 1.0 and not SharedMemory(2, profile()).tracks_writes

    def send(write: str):
        def body(transport):
            buf = symbolic(MIB, np.uint8)
            if transport.rank == 0:
                if write == "copy":
                    np.copyto(buf, symbolic(MIB, np.uint8))   # rank 0 writes what it sends
                elif write == "receive":   # or receives into it first (a relay, as a tree's)
                    transport.wait_all([transport.irecv(buf, 1, 1)], float("inf"))
                transport.wait_all([transport.isend(buf, 1, 0)], float("inf"))
            else:
                if write == "receive":
                    transport.wait_all([transport.isend(symbolic(MIB, np.uint8), 0, 1)], float("inf"))
                start = transport.clock
                transport.wait_all([transport.irecv(buf, 0, 0)], float("inf"))
                return transport.clock - start
            return 0.0
        return SimWorld(2, SharedMemory(2, machine, footprint=MIB)).run(body)[1]

    assert send("none") == pytest.approx(10e-6 + MIB * 1e-10)
    assert send("copy") == pytest.approx(10e-6 + MIB * 3e-10)
    assert send("receive") == pytest.approx(10e-6 + MIB * 3e-10)


def test_a_write_to_lines_another_core_read_pays_for_them_once_over_the_writes_that_cover_them():
    from transports.sim import SimWorld, root_of, symbolic

    class Network(IdealNetwork):
        def rewrite_seconds(self, nbytes: int) -> float:
            return 3e-6 + nbytes * 1e-9   # not proportional: the price is of all the bytes read

    def body(transport):
        buf = symbolic(MIB, np.uint8)
        transport.world.unpaid[id(root_of(buf))] = [MIB, MIB]   # another core read all of it
        start = transport.clock
        np.copyto(buf[:MIB // 4], symbolic(MIB // 4, np.uint8))   # a quarter, then the rest
        quarter = transport.clock - start
        transport.overwrite(buf[MIB // 4:])
        whole = transport.clock - start
        np.copyto(buf, symbolic(MIB, np.uint8))   # its lines are mine again: nothing more
        return quarter, whole, transport.clock - start

    (quarter, whole, again), _ = SimWorld(2, Network(2, 0.0, 0.0)).run(body)
    assert quarter == pytest.approx((3e-6 + MIB * 1e-9) / 4)
    assert whole == again == pytest.approx(3e-6 + MIB * 1e-9)


def test_the_ring_all_reduce_rewrites_the_half_its_peer_read_in_the_call_before():
    # rewriting a byte another core read: 0.4 ns more. At 2 ranks the ring's all-gather has the
    # peer read my half of `out` (cross-memory attach), and the next call's reduce-scatter reduces
    # into it; its input, which the peer reads too, nobody writes. So the call costs the rewrite of
    # half its buffer more, and an all_to_all (whose output no peer reads) nothing more
    rewrite = tuple((n, n * 4e-10) for n in (64 * KIB, 64 * MIB))
    plain, rewriting = profile(), replace(profile(), rewrite=rewrite)
    assert SharedMemory(2, plain).rewrite_seconds is None
    assert rewriting.rewrite_seconds(2 * MIB) == pytest.approx(2 * MIB * 4e-10)
    assert rewriting.rewrite_seconds(KIB) == pytest.approx(KIB * 4e-10)   # proportional below
    extra = (predict("all_reduce", "ring", 2, 4 * MIB, rewriting)
             - predict("all_reduce", "ring", 2, 4 * MIB, plain))
    assert extra == pytest.approx(2 * MIB * 4e-10, rel=0.05)
    assert predict("all_to_all", "pairwise", 2, 4 * MIB, rewriting) == \
        pytest.approx(predict("all_to_all", "pairwise", 2, 4 * MIB, plain), rel=1e-9)
    # through the FIFO the peer reads the slots, not my buffer: nothing to rewrite
    fifo = replace(rewriting, rendezvous=MIB)
    base = predict("all_reduce", "ring", 2, 256 * KIB, replace(plain, rendezvous=MIB))
    assert predict("all_reduce", "ring", 2, 256 * KIB, fifo) == pytest.approx(base, rel=1e-9)


def test_the_rewrite_is_measured_alike_on_both_ranks_and_is_nothing_without_cross_memory_attach(monkeypatch):
    import threading

    from colls.communicator import Communicator
    from colls.tune_probes import rewrite_after_read_seconds
    from transports.local import LocalWorld

    def both(rounds: int) -> list[float]:
        world, got = LocalWorld(2), [None, None]

        def rank_main(rank: int) -> None:
            got[rank] = rewrite_after_read_seconds(Communicator(world.transport(rank)), 64 * KIB, rounds)

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return got

    measured = both(5)
    assert measured[0] is not None and measured[0] == measured[1] and measured[0] >= 0.0
    from transports import cma

    monkeypatch.setattr(cma, "_readv", None)   # no process_vm_readv here: nothing to price
    assert both(5) == [0.0, 0.0]


def test_a_planned_small_call_prices_its_exchanges_as_the_persistent_ones_measured():
    from colls.plan.shared_memory import persistent_steps

    # which bench calls a communicator plans with persistent exchanges (`colls.describe.Plan`)
    assert persistent_steps("all_reduce", "recursive_doubling", 2, KIB)
    assert persistent_steps("all_to_all", "pairwise", 2, KIB)      # each step: one peer both ways
    assert not persistent_steps("all_to_all", "pairwise", 4, KIB)  # sends to r+s, receives from r-s
    assert not persistent_steps("all_reduce", "ring", 2, KIB)
    assert not persistent_steps("all_reduce", "recursive_doubling", 2, MIB)   # beyond PLAN_BYTES
    assert not persistent_steps("broadcast", "binomial", 2, KIB)
    # a sendrecv 5 us + 1 ns/B; made persistent 3 us + 1 ns/B, reducing or not
    sendrecv = tuple((n, 5e-6 + n * 1e-9) for n in (8, 16 * KIB))
    persistent = tuple((n, 3e-6 + n * 1e-9) for n in (8, 16 * KIB))
    base = replace(profile(), rendezvous=MIB, exchange=sendrecv, exchange_reduce=sendrecv)
    measured = replace(base, exchange_persistent=persistent, exchange_persistent_reduce=persistent)
    for collective, algorithm in (("all_reduce", "recursive_doubling"), ("all_to_all", "pairwise")):
        saved = (predict(collective, algorithm, 2, KIB, base)
                 - predict(collective, algorithm, 2, KIB, measured))
        assert saved == pytest.approx(2e-6, rel=0.05), collective   # one exchange, 2 us less
    # a call that is not planned so, or a size beyond what was measured, as before
    assert predict("all_reduce", "ring", 2, KIB, measured) == \
        pytest.approx(predict("all_reduce", "ring", 2, KIB, base))
    assert predict("all_to_all", "pairwise", 2, 64 * KIB, measured) == \
        pytest.approx(predict("all_to_all", "pairwise", 2, 64 * KIB, base))


def test_a_reducing_receive_pays_its_call_beyond_gamma():
    from dataclasses import replace

    reducing = replace(profile(), receive_reduce=2e-6)
    # recursive doubling at 2 ranks: one reducing receive; a broadcast has none
    assert predict("all_reduce", "recursive_doubling", 2, KIB, reducing) == \
        pytest.approx(predict("all_reduce", "recursive_doubling", 2, KIB, profile()) + 2e-6, rel=1e-9)
    assert predict("broadcast", "binomial", 2, KIB, reducing) == \
        pytest.approx(predict("broadcast", "binomial", 2, KIB, profile()), rel=1e-9)


def test_profiles_read_the_written_and_reducing_measurements(tmp_path):
    entry = {"ranks": 2, "cores": 2, "start_s": 0.0, "call_s": {}, "message_s": {"8": 5e-6, "65536": 1e-5},
             "reduce_s_per_byte": {"1024": 1e-10}, "copy_s_per_byte": {"1024": 1e-10},
             "message_written_s": {"65536": 2e-5}, "exchange_written_s": {"65536": 3e-5},
             "receive_reduce_s": 7e-7}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(entry))
    machine = load_profiles([str(path)])[2]
    assert machine.written == ((64 * KIB, 2e-5),) and machine.exchange_written == ((64 * KIB, 3e-5),)
    assert machine.receive_reduce == pytest.approx(7e-7)
    del entry["receive_reduce_s"], entry["message_written_s"]
    path.write_text(json.dumps(entry))
    assert load_profiles([str(path)])[2].receive_reduce == 0.0 and load_profiles([str(path)])[2].written == ()


def test_placed_ranks_take_only_their_own_core():
    from types import SimpleNamespace

    from colls.plan.shared_memory import placements
    from transports.sim.ranks import _Cores

    # ranks 0 and 1 on core 0, rank 2 on core 1: rank 1 waits for core 0 even while core 1 is idle
    cores = _Cores(TimeSharing(2, spin=1e-3, wake=5e-5, placement=(0, 0, 1)))
    a, b, c = (SimpleNamespace(core=None, wake=0.0, rank=r, in_sendrecv=False, in_barrier=False)
               for r in range(3))
    assert cores.claim(a, 0.0) and a.core == 0
    assert not cores.claim(b, 0.0) and cores.next_free(b) == float("inf")
    assert cores.next_free() == 0.0                       # core 1 is idle, but not rank 1's
    assert cores.claim(c, 0.0) and c.core == 1
    cores.release(a, 1e-4)
    assert cores.next_free(b) == pytest.approx(1.1e-3) and cores.claim(b, 1.1e-3) and b.wake == 5e-5
    # every even way to deal 4 ranks to 2 cores, each once (cores are not told apart)
    assert placements(4, 2) == [(0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, 0)]
    assert len(placements(6, 3)) == 15 and placements(2, 2) == [(0, 1)]


def test_a_call_of_more_ranks_reads_the_rates_of_more_memory():
    # copies and sums cost the same up to 1 MiB in both machines, 10x more from 4 MiB in one: a
    # 1 MiB call of 2 ranks touches what the profile's two did at 1 MiB, of 4 ranks twice that
    flat = ((KIB, 1e-10), (64 * MIB, 1e-10))
    steep = ((KIB, 1e-10), (MIB, 1e-10), (4 * MIB, 1e-9), (64 * MIB, 1e-9))

    def machine(ranks: int, work) -> Profile:
        return replace(profile(ranks, 4), reduce=work, copy=work)

    assert predict("all_reduce", "ring", 2, MIB, machine(2, steep)) == \
        pytest.approx(predict("all_reduce", "ring", 2, MIB, machine(2, flat)))
    assert predict("all_reduce", "ring", 4, MIB, machine(4, steep)) > \
        1.2 * predict("all_reduce", "ring", 4, MIB, machine(4, flat))


def test_more_ranks_than_cores_predict_the_mean_over_placements():
    import statistics
    from dataclasses import replace

    from colls.plan.shared_memory import placements
    from colls.plan.simulate import run_algorithm

    machine = profile(4, 2, spin=2e-5, wake=2e-5)

    def body(transport):   # as predict's: the call's software and start, then the algorithm
        transport.elapse(6e-6 + 2e-6)
        return run_algorithm(transport, "broadcast", "pipeline", MIB)

    times = []
    for placement in placements(4, 2):
        # 4 ranks touch twice the memory the profile's two measured with: the rates of 2 MiB
        network = SharedMemory(4, machine, footprint=2 * MIB)
        network.time_sharing = replace(network.time_sharing, placement=placement)
        times.append(run_world(4, network, body, machine.reduce_seconds_per_byte(2 * MIB),
                               machine.copy_seconds_per_byte(2 * MIB)).seconds)
    assert predict("broadcast", "pipeline", 4, MIB, machine) == pytest.approx(statistics.mean(times))
    # on 4 cores nothing is shared: faster than any placement on 2
    assert predict("broadcast", "pipeline", 4, MIB, machine, cores=4) < min(times)


@pytest.mark.timeout(560)
def test_colls_tune_profiles_the_one_slot_exchange_at_every_size(tmp_path):
    # the real measurement on two shm ranks: every message size has an exchange time (the FIFO
    # sizes too, which the model prices a sendrecv at), and the one-slot wait's spin and wake.
    # About a minute on an idle machine; with every core busy its waits on one core take time
    # slices (2.5 minutes with two CPU hogs on 2 cores): the deadline leaves room for more
    from colls.tune_profile import PROFILE_MESSAGE_BYTES

    path = tmp_path / "r2.json"
    result = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "2", "--timeout", "500",
                             "-m", "colls.tune", "--profile", str(path)],
                            capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr
    measured = json.loads(path.read_text())
    for table in ("exchange_s", "exchange_reduce_s", "exchange_written_s", "exchange_after_copy_s"):
        assert sorted(int(n) for n in measured[table]) == sorted(PROFILE_MESSAGE_BYTES)
        assert all(seconds > 0 for seconds in measured[table].values())
    # polling a slot's head is far cheaper a turn than a request's wait loop
    assert 0 < measured["one_slot_spin_s"] < measured["spin_s"]
    # a FIFO send's own time, at every FIFO size: no longer than the message it starts
    fifo_sizes = [n for n in PROFILE_MESSAGE_BYTES if str(n) in measured["send_s"]]
    assert fifo_sizes and max(fifo_sizes) < 1 << 20 <= min(set(PROFILE_MESSAGE_BYTES) - set(fifo_sizes))
    assert all(0 < measured["send_s"][str(n)] <= measured["message_s"][str(n)] * 1.5 for n in fifo_sizes)
    assert Profile.load([str(path)]).send_seconds(8) == pytest.approx(measured["send_s"]["8"])
    assert measured["one_slot_wake_s"] >= 0
    machine = Profile.load([str(path)])
    assert machine.exchange_seconds(8) == pytest.approx(measured["exchange_s"]["8"])
    assert machine.one_slot_spin == pytest.approx(measured["one_slot_spin_s"])
    # the machine's mode while ranks 0 and 1 measured: a cache line's round trip before and after,
    # and a 256 KiB exchange
    assert len(measured["round_trip_ns"]) == 2 and all(0 < t < 1e6 for t in measured["round_trip_ns"])
    assert len(measured["exchange_us"]) == 2 and all(1 < t < 1e6 for t in measured["exchange_us"])
    # a write of lines the peer has just read, from the sizes a message goes by cross-memory
    # attach (the FIFO's sizes end below them; 0 where the kernel does not allow it)
    rewrite = {int(n): seconds for n, seconds in measured["rewrite_after_read_s"].items()}
    assert min(rewrite) == min(set(PROFILE_MESSAGE_BYTES) - set(fifo_sizes))
    assert max(rewrite) == max(PROFILE_MESSAGE_BYTES)
    assert all(seconds >= 0 for seconds in rewrite.values())
    # the exchanges of a planned small call, made persistent, at the sizes a call is planned
    for table in ("exchange_persistent_s", "exchange_persistent_reduce_s"):
        assert sorted(int(n) for n in measured[table]) == [n for n in PROFILE_MESSAGE_BYTES if n <= 64 * KIB]
        assert all(seconds > 0 for seconds in measured[table].values())
    assert machine.exchange_persistent_reduce[0] == \
        (8, pytest.approx(measured["exchange_persistent_reduce_s"]["8"]))
    assert machine.rewrite == tuple(sorted(rewrite.items()))


@pytest.mark.timeout(150)
def test_colls_tune_measures_how_long_mpis_barrier_holds_a_shared_core():
    from colls.launcher import find_mpiexec
    from colls.tune_probes import barrier_hold_seconds, mpi_barrier_times

    if find_mpiexec() is None:
        pytest.skip("no mpiexec (the mpi extra)")
    measured = mpi_barrier_times()
    assert measured is not None
    one_core, two_cores = measured["one_core_s"], measured["two_cores_s"]
    if two_cores is None:
        pytest.skip("one core allowed: no barrier on a core each to compare with")
    # a barrier takes microseconds on an idle machine and time slices of other processes on a
    # busy one (where the hand-over waits for them too): never a tenth of a second
    assert 0 < two_cores < 0.1 and 0 < one_core < 0.1
    # the hold: the hand-over less the free barrier and a wake-up, never negative
    hold = barrier_hold_seconds(measured, 0.0)
    assert hold == max(0.0, one_core - two_cores) and 0 <= hold < one_core
    assert barrier_hold_seconds(measured, 1.0) == 0.0
    assert barrier_hold_seconds({"one_core_s": one_core, "two_cores_s": None}, 0.0) is None


def test_each_numpy_call_pays_its_own_cost_once_and_the_tables_per_byte_exclude_it():
    from dataclasses import replace

    import numpy as np

    from transports.sim import SimWorld, symbolic

    # a 1 KiB sum took 0.5 us of which 0.4 us is the call itself: a byte adds 0.1 us / 1 KiB
    machine = replace(profile(), reduce=((KIB, 5e-7 / KIB), (MIB, 1e-10)), reduce_call=4e-7,
                      copy=((KIB, 3e-7 / KIB), (MIB, 1e-10)), copy_call=2e-7)
    assert machine.reduce_seconds_per_byte(KIB) == pytest.approx(1e-7 / KIB)
    assert machine.copy_seconds_per_byte(KIB) == pytest.approx(1e-7 / KIB)
    assert machine.reduce_seconds_per_byte(MIB) == pytest.approx(1e-10 - 4e-7 / MIB)
    assert profile().reduce_seconds_per_byte(KIB) == pytest.approx(1e-10)   # not measured: as before

    def body(transport):
        a, b = symbolic(256), symbolic(256)
        np.add(a, b, out=a)   # two sums of 1 KiB and one copy
        np.add(a, b, out=a)
        np.copyto(a, b)
        return transport.clock

    network = SharedMemory(2, machine)
    world = SimWorld(2, network, machine.reduce_seconds_per_byte(KIB), machine.copy_seconds_per_byte(KIB))
    assert world.run(body) == [pytest.approx(2 * 5e-7 + 3e-7)] * 2
