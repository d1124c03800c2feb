"""A kind of call takes the way (thresholds or cross-memory attach throughout) that has been faster
lately: `transports.adaptive` and `ShmTransport.begin_call`."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

import colls
from transports.adaptive import TIMED, ProtocolChoice
from transports.base import COLLECTIVE_TAG_BASE
from transports.shm import CHOICES_OFFSET

KEY = ("all_to_all", "pairwise", 1 << 20)


def _run(choice: ProtocolChoice, seconds: dict[int, float], calls: int, nbytes: int = 1 << 20) -> list[int]:
    """`calls` calls of KEY that take `seconds[way]`, timed when asked to; the way of each."""
    taken = []
    for _ in range(calls):
        code = choice.choose(KEY, 0)
        if code & TIMED:
            choice.record(KEY, code & 1, seconds[code & 1], nbytes)
        taken.append(code & 1)
    return taken


def test_by_default_the_first_try_waits_for_the_48th_call():
    choice = ProtocolChoice()
    taken = _run(choice, {0: 100e-6, 1: 300e-6}, 200)
    assert [i + 1 for i, way in enumerate(taken) if way] == list(range(48, 54)) + list(range(144, 150))


def test_the_other_way_is_tried_from_first_try_on_six_calls_in_a_row_every_explore_every():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    taken = _run(choice, {0: 100e-6, 1: 300e-6}, 70)
    tries = [i + 1 for i, way in enumerate(taken) if way]
    assert tries == [call + k for call in (16, 40, 64) for k in range(6)]
    assert choice.preferred(KEY) == 0


def test_a_try_but_its_first_call_and_five_calls_before_and_after_it_are_timed():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    timed = [i + 1 for i in range(46) if choice.choose(KEY, 0) & TIMED]
    # the first call of a try pays for the change of way, the first after it for the change back
    assert timed == [11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27,
                     35, 36, 37, 38, 39, 41, 42, 43, 44, 45]


def test_the_faster_way_takes_over_at_its_first_try():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    taken = _run(choice, {0: 500e-6, 1: 100e-6}, 64)
    assert taken[:15] == [0] * 15            # the prior until the first try (calls 16-21)
    assert taken[15:21] == [1] * 6
    assert taken[21:27] == [0] * 6           # the way in use again (calls 22-27), after which
    assert taken[27:39] == [1] * 12          # the try's way takes over
    assert taken[39:45] == [0] * 6           # the old way's try (calls 40-45)
    assert choice.preferred(KEY) == 1


def test_a_change_of_state_is_followed_within_two_periods():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    _run(choice, {0: 100e-6, 1: 300e-6}, 100)
    assert choice.preferred(KEY) == 0
    # now the other way is five times faster: the next whole cycle of windows switches, and from
    # then on the old way comes back on its tries only
    taken = _run(choice, {0: 500e-6, 1: 100e-6}, 48)
    assert choice.preferred(KEY) == 1
    assert taken[16:].count(0) <= 6 * 2
    taken = _run(choice, {0: 100e-6, 1: 500e-6}, 48)   # and back again
    assert choice.preferred(KEY) == 0
    assert taken[16:].count(1) <= 6 * 2


def test_a_way_within_the_margin_does_not_take_over():
    choice = ProtocolChoice(explore_every=24, margin=0.1, first_try=16)
    _run(choice, {0: 100e-6, 1: 95e-6}, 100)
    assert choice.preferred(KEY) == 0
    choice = ProtocolChoice(explore_every=24, margin=0.1, first_try=16)
    _run(choice, {0: 100e-6, 1: 85e-6}, 100)
    assert choice.preferred(KEY) == 1


def test_times_compare_per_byte_and_keys_apart():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    for _ in range(28):   # key A: way 1 is faster per byte, though its calls are bigger
        code = choice.choose("A", 0)
        if code & TIMED:
            way = code & 1
            choice.record("A", way, (150e-6, 100e-6)[way] * (1 + way), (1 + way) << 20)
    choice.choose("B", 1)
    assert choice.preferred("A") == 1
    assert choice.preferred("B") == 1 and choice.preferred("C") is None
    preferred, calls, by_slots, by_attach = choice.summary()["A"]
    assert (preferred, calls) == (1, 28)
    assert by_slots == pytest.approx(150e-6 / (1 << 20)) and by_attach == pytest.approx(100e-6 / (1 << 20))


def test_a_follower_takes_the_way_it_is_given_and_tries_on_the_same_calls():
    leader = ProtocolChoice(explore_every=24, first_try=16)
    follower = ProtocolChoice(explore_every=24, first_try=16)
    for _ in range(100):
        given = leader.preferred(KEY)   # what the leader had chosen when the call began
        code = leader.choose(KEY, 0)
        if code & TIMED:
            leader.record(KEY, code & 1, {0: 300e-6, 1: 100e-6}[code & 1], 1 << 20)
        assert follower.choose(KEY, 0, given) & 1 == code & 1
    assert follower.preferred(KEY) == leader.preferred(KEY) == 1


def test_calls_that_speed_up_whichever_the_way_do_not_switch():
    # a key's calls get faster over their first hundred or so (2026-12-05, colls bench: a 4 MiB
    # all_to_all's calls 43-46 took 1047-1321 us through the slots, its try's 49-53 by attach
    # 290-314, and the slots' own from call 139 on 272-334): a try then beats the calls before it
    # but not those after it
    choice = ProtocolChoice(explore_every=24, first_try=16)
    for call in range(1, 121):
        code = choice.choose(KEY, 0)
        if code & TIMED:
            choice.record(KEY, code & 1, 1e-3 * 0.95 ** call, 1 << 20)
    assert choice.preferred(KEY) == 0
    # where a way's calls slow down instead, its try of the other way switches (the faster of the
    # windows around the try is the one before it)
    choice = ProtocolChoice(explore_every=24, first_try=16)
    for call in range(1, 29):
        code = choice.choose(KEY, 0)
        if code & TIMED:
            choice.record(KEY, code & 1, 1e-4 * 1.05 ** call if code & 1 == 0 else 1e-4, 1 << 20)
    assert choice.preferred(KEY) == 1


def test_times_come_in_late_by_call_number_and_a_cycle_short_of_times_gives_no_verdict():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    codes = [choice.choose(KEY, 0) for _ in range(28)]   # the first cycle: calls 11-27
    # rank 0 records each call at the end of the next: by number, into the right window
    for call, code in enumerate(codes, 1):
        if code & TIMED and call not in (24, 25, 26, 27):   # the calls after the try: one timed
            choice.record(KEY, code & 1, (500e-6, 100e-6)[code & 1], 1 << 20, call)
    for _ in range(7):
        choice.choose(KEY, 0)
    code = choice.choose(KEY, 0)   # call 35, the next cycle's first timed: closes the first
    choice.record(KEY, code & 1, 500e-6, 1 << 20, 35)
    assert choice.preferred(KEY) == 0   # one time after the try: no verdict, though the try was 5x faster
    choice.record(KEY, 1, 100e-6, 1 << 20, 20)   # a late time of the closed cycle changes nothing
    assert choice.preferred(KEY) == 0


def test_a_window_with_calls_untimed_gets_its_verdict_two_calls_after_it():
    choice = ProtocolChoice(explore_every=24, first_try=16)
    taken = []
    for call in range(1, 31):
        code = choice.choose(KEY, 0)
        taken.append(code & 1)
        # rank 0 records a call at the end of the next; calls 26 and 27 follow other work (untimed)
        if code & TIMED and call not in (26, 27):
            choice.record(KEY, code & 1, (500e-6, 100e-6)[code & 1], 1 << 20, call)
    # the window after the try (calls 23-27) has three times: the try's way takes over on call 29,
    # not on the next cycle's first record (call 35)
    assert taken[21:28] == [0] * 7 and taken[28:] == [1, 1]
    assert choice.preferred(KEY) == 1


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="explore_every"):
        ProtocolChoice(explore_every=8)
    with pytest.raises(ValueError, match="margin"):
        ProtocolChoice(margin=1.5)
    with pytest.raises(ValueError, match="first_try"):
        ProtocolChoice(first_try=2)


def test_a_choosing_transport_keeps_the_slots_as_far_as_the_default_whatever_the_tune(tmp_path, monkeypatch):
    from transports.shm import exchange_rendezvous_bytes

    # a tune made in the slow state: cross-memory attach from 512 KiB, plain and reducing
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"shm": {"exchange_cma": {"plain": 512 << 10, "reducing": 512 << 10}}}))
    monkeypatch.setenv("COLLS_TUNE_FILE", str(path))
    for variable in ("COLLS_SHM_EXCHANGE_CMA_BYTES", "COLLS_SHM_REDUCE_EXCHANGE_CMA_BYTES"):
        monkeypatch.delenv(variable, raising=False)
    chunk, slots = 256 << 10, 4
    assert exchange_rendezvous_bytes(chunk, slots, 2, cores=2) == 512 << 10   # the tune's
    assert exchange_rendezvous_bytes(chunk, slots, 2, True, cores=2) == 512 << 10
    # choosing per kind of call, the thresholds' way goes through the slots up to the defaults
    assert exchange_rendezvous_bytes(chunk, slots, 2, cores=2, slots_first=True) == 4 << 20
    assert exchange_rendezvous_bytes(chunk, slots, 2, True, cores=2, slots_first=True) == 16 << 20
    # a tune that found the slots faster further up is kept
    path.write_text(json.dumps({"shm": {"exchange_cma": {"plain": 32 << 20, "reducing": 32 << 20}}}))
    assert exchange_rendezvous_bytes(chunk, slots, 2, cores=2, slots_first=True) == 32 << 20
    # and a threshold the user set is the user's
    monkeypatch.setenv("COLLS_SHM_EXCHANGE_CMA_BYTES", str(256 << 10))
    assert exchange_rendezvous_bytes(chunk, slots, 2, cores=2, slots_first=True) == 256 << 10


def _all_to_alls(comm, nbytes: int, calls: int, pause: float = 0.0) -> list:
    """`calls` all_to_alls of `nbytes` of int32 back to back (the planned path after the first),
    each checked; what every call got right, the cross-memory reads this rank's sends asked for,
    its choices and rank 0's published table."""
    transport = comm.transport
    count = nbytes // 4
    x = np.arange(count, dtype=np.int32) + 1000 * comm.rank
    want = np.concatenate([np.arange(count, dtype=np.int32).reshape(comm.size, -1)[comm.rank] + 1000 * peer
                           for peer in range(comm.size)])
    got = np.empty_like(x)
    wrong = 0
    for _ in range(calls):
        x += 1        # every call moves new values, made in place: the calls follow each other
        want += 1     # closely enough to be timed for the choice (`STEADY_GAP_S`), unless paused
        time.sleep(pause)
        comm.all_to_all(x, out=got)
        wrong += int(np.count_nonzero(got != want))
    posted = sum(transport.rendezvous_posted)
    summary = {repr(key): list(value) for key, value in transport.adaptive.summary().items()}
    table = transport.peers[0].array[CHOICES_OFFSET:CHOICES_OFFSET + 4].tolist()
    report = transport.reports[comm.rank][4:7].tolist()   # its last odd-numbered timed call
    return [wrong, posted, transport.adapting, summary, table, dict(transport.call_kinds), report]


@pytest.mark.timeout(120)
def test_shm_calls_try_both_ways_with_rank_0_choosing_for_both(monkeypatch):
    monkeypatch.setenv("COLLS_SHM_ADAPTIVE", "1")
    monkeypatch.setenv("COLLS_SHM_EXCHANGE_CMA_BYTES", str(8 << 20))   # whatever a tune file says
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("with more ranks than cores the calls keep the thresholds (no choice made)")
    calls = 150   # tries on calls 48-53 and 144-149
    ranks = colls.spawn(_all_to_alls, 2, transport="shm", args=(1 << 20, calls), timeout=100)
    wrong_0, posted_0, adapting, summary_0, table, kinds_0, _ = ranks[0]
    wrong_1, posted_1, _, summary_1, _, kinds_1, report_1 = ranks[1]
    assert wrong_0 == wrong_1 == 0
    if not adapting:
        pytest.skip("cross-memory attach is not allowed here (ptrace scope)")
    assert kinds_0 == kinds_1 == {("all_to_all", "pairwise", 1 << 20): 0}   # one kind, numbered alike
    preferred, made, by_slots, by_attach = summary_0["0"]
    assert made == calls and by_slots is not None and by_attach is not None   # both ways timed
    kept, other = (by_attach, by_slots) if preferred else (by_slots, by_attach)
    assert other >= kept * (1 - ProtocolChoice().margin)   # the faster one is kept
    assert table[0] == 1 + preferred                      # and published for the other ranks
    # rank 1 keeps no times of its own and takes rank 0's way; it reports its timed calls' times,
    # of which rank 0 takes the slower rank's (the last timed call is number 149, a try's last)
    assert summary_1["0"][:2] == [preferred, calls] and summary_1["0"][2:] == [None, None]
    assert report_1[:2] == [0, 149] and 0 < report_1[2] < 10**9
    # the 512 KiB exchanges went by cross-memory attach on the tries at least (the thresholds send
    # them through the slots)
    assert posted_0 >= 12 and posted_1 >= 12


@pytest.mark.timeout(60)
def test_no_choice_is_made_unless_asked_for(monkeypatch):
    monkeypatch.delenv("COLLS_SHM_ADAPTIVE", raising=False)
    monkeypatch.setenv("COLLS_SHM_EXCHANGE_CMA_BYTES", str(8 << 20))
    for wrong, posted, adapting, summary, _, kinds, _ in colls.spawn(_all_to_alls, 2, transport="shm",
                                                                    args=(1 << 20, 70), timeout=50):
        assert wrong == 0 and not adapting and summary == {} and kinds == {}
        assert posted == 0   # the thresholds throughout: 512 KiB exchanges through the slots


@pytest.mark.timeout(60)
def test_calls_after_other_work_are_not_timed(monkeypatch):
    monkeypatch.setenv("COLLS_SHM_ADAPTIVE", "1")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("with more ranks than cores the calls keep the thresholds (no choice made)")
    # 3 ms of something else before each call: the cache is not what a run of calls leaves it
    wrong, _, adapting, summary, table, _, _ = colls.spawn(_all_to_alls, 2, transport="shm",
                                                        args=(1 << 20, 60, 3e-3), timeout=50)[0]
    assert wrong == 0
    if not adapting:
        pytest.skip("cross-memory attach is not allowed here (ptrace scope)")
    assert summary["0"][1:] == [60, None, None] and table[0] == 0   # tried, but nothing timed or chosen


def _helped_copies(comm, nbytes: int) -> list:
    """Rank 1 sends rank 0 a big collective message that rank 0 takes only 50 ms later, and
    meanwhile receives one from rank 0: a receive from a peer that my own message to it still waits
    on. Then a broadcast of as much from rank 0. Which messages this rank helped its receiver copy
    (`ShmTransport.helped`, per peer) after the exchange and after the broadcast, and whether every
    result was right."""
    transport = comm.transport
    count = nbytes // 4
    tag = COLLECTIVE_TAG_BASE + 999_999   # a collective's tag: help applies (not to user messages)
    mine = np.arange(count, dtype=np.float32) + 1000 * comm.rank
    theirs = np.zeros(count, np.float32)
    peer = 1 - comm.rank
    deadline = time.monotonic() + 30
    if comm.rank == 0:
        sent = transport.isend(mine, peer, tag)
        transport.wait_all([sent], deadline)      # rank 1 has read it
        time.sleep(0.05)
        transport.wait_all([transport.irecv(theirs, peer, tag)], deadline)
    else:
        sent = transport.isend(mine, peer, tag)   # not taken for 50 ms
        transport.wait_all([transport.irecv(theirs, peer, tag)], deadline)
        transport.wait_all([sent], deadline)
    right = bool(np.array_equal(theirs, np.arange(count, dtype=np.float32) + 1000 * peer))
    after_exchange = list(transport.helped)
    data = np.arange(count, dtype=np.float32) if comm.rank == 0 else np.zeros(count, np.float32)
    comm.broadcast(data, root=0, out=data)
    right = right and bool(np.array_equal(data, np.arange(count, dtype=np.float32)))
    return [after_exchange, list(transport.helped), right, transport.cma]


@pytest.mark.timeout(60)
def test_a_sender_that_is_reading_my_message_is_not_asked_to_help_copy_its_own():
    # rank 1 receives rank 0's 4 MiB message while its own to rank 0 is still unread: asked to help,
    # rank 0 would put its copy for rank 1 before its own read of rank 1's (`direct`'s all_to_all
    # posts its receive and send to one peer apart: 110 against 96 us measured); a broadcast's root
    # sends only, and copies half of each big message
    ranks = colls.spawn(_helped_copies, 2, transport="shm", args=(4 << 20,), timeout=50)
    for _, _, right, cma in ranks:
        assert right
        if not cma:
            pytest.skip("cross-memory attach is not allowed here (ptrace scope)")
    (zero_exchange, zero_end, _, _), (one_exchange, one_end, _, _) = ranks
    assert zero_exchange == [0, 0]   # rank 1 did not ask rank 0 to help with rank 0's message
    # (rank 0, its own message read, may ask rank 1 to help with rank 1's: that one is allowed)
    assert zero_end[1] > zero_exchange[1] and one_end == one_exchange   # the broadcast: 0 helped 1


def _slow_slots(comm, calls: int) -> tuple[bool, int, bool]:
    """`calls` 1 MiB all_to_alls (512 KiB each way, through the slots by the thresholds), then a
    256 KiB broadcast: whether every result was right, how many messages went by cross-memory
    attach, and whether the slots were taken for slow at the end."""
    transport = comm.transport
    count = (1 << 20) // 4
    x = np.arange(count, dtype=np.float32) + 1000 * comm.rank
    want = np.concatenate([np.arange(count, dtype=np.float32).reshape(comm.size, -1)[comm.rank] + 1000 * peer
                           for peer in range(comm.size)])
    right = True
    for _ in range(calls):
        right = right and bool(np.array_equal(comm.all_to_all(x, algorithm="pairwise"), want))
    data = np.arange(count // 4, dtype=np.float32) if comm.rank == 0 else np.zeros(count // 4, np.float32)
    comm.broadcast(data, root=0, out=data)
    right = right and bool(np.array_equal(data, np.arange(count // 4, dtype=np.float32)))
    return right, sum(transport.rendezvous_posted), transport._slots_slow() and transport.cma


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gbps,slow", [("100000", True), ("0", False)])
def test_slow_copies_into_slots_send_big_messages_by_cross_memory_attach(monkeypatch, gbps, slow):
    # every copy into a slot "slower" than 100 TB/s: after five of them the rank sends its messages
    # of 64 KiB or more by cross-memory attach; none slower than 0 B/s: the thresholds throughout
    monkeypatch.setenv("COLLS_SHM_SLOW_SLOT_GBPS", gbps)
    monkeypatch.setenv("COLLS_SHM_EXCHANGE_CMA_BYTES", str(8 << 20))   # 512 KiB exchanges: slots
    for right, attached, slow_now in colls.spawn(_slow_slots, 2, transport="shm", args=(20,), timeout=50):
        assert right
        if slow and not slow_now:
            pytest.skip("cross-memory attach is not allowed here (ptrace scope)")
        assert slow_now == slow
        # (the first three all_to_alls fill the window of five slow copies; the rest go by attach)
        assert (attached >= 15) if slow else (attached == 0), attached


@pytest.mark.timeout(60)
def test_with_more_ranks_than_cores_slow_copies_into_slots_change_nothing(monkeypatch):
    # two ranks on one core: a copy's time includes the other rank's turns, and a pull must wait
    # for its reader to get the core, so the switch stays off (4 ranks on 2 cores, a 512 KiB
    # all_reduce took 540-680 us with it, 310 without)
    monkeypatch.setenv("COLLS_SHM_SLOW_SLOT_GBPS", "100000")   # every copy "slow"
    kept = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(kept)})   # the ranks inherit it
    try:
        ranks = colls.spawn(_slow_slots, 2, transport="shm", args=(20,), timeout=50)
    finally:
        os.sched_setaffinity(0, kept)
    for right, attached, slow_now in ranks:
        assert right
        assert not slow_now
        assert attached == 0, attached   # 512 KiB: below the FIFO's threshold, so through the slots


def _spin_polls(comm) -> int:
    return comm.transport.spin_polls


def _pinned_subgroups(comm) -> list:
    """Each rank pinned to a CPU of its own, then to one CPU all: a group made then (a split)
    counts its cores from the CPUs its ranks may use, whatever each rank's own set."""
    kept = os.sched_getaffinity(0)
    cpus = sorted(kept)
    got = []
    for mine in (cpus[comm.rank % len(cpus)], cpus[0]):
        os.sched_setaffinity(0, {mine})
        group = comm.split(0)
        got.append([group.transport.cores, group.transport.spin_polls])
        group.close()
    os.sched_setaffinity(0, kept)
    return got


@pytest.mark.timeout(60)
def test_ranks_pinned_a_cpu_each_have_cores_of_their_own():
    from transports.base import Backoff
    from transports.shm import OVERSUBSCRIBED_SPIN_POLLS

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no two ranks can be pinned apart")
    for apart, together in colls.spawn(_pinned_subgroups, 2, transport="shm", timeout=50):
        assert apart == [2, Backoff.SPIN_POLLS]             # each pinned alone: 2 CPUs for 2 ranks
        assert together == [1, OVERSUBSCRIBED_SPIN_POLLS]   # both on one CPU


def test_a_spin_of_no_polls_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("COLLS_SHM_SPIN_POLLS", "0")
    with pytest.raises(Exception, match="COLLS_SHM_SPIN_POLLS=0"):
        colls.spawn(_spin_polls, 2, transport="shm", timeout=30)


@pytest.mark.timeout(60)
def test_a_waiting_rank_yields_sooner_where_ranks_outnumber_cores(monkeypatch):
    from transports.base import Backoff
    from transports.shm import OVERSUBSCRIBED_SPIN_POLLS

    assert OVERSUBSCRIBED_SPIN_POLLS < Backoff.SPIN_POLLS
    if len(os.sched_getaffinity(0)) >= 2:
        assert colls.spawn(_spin_polls, 2, transport="shm", timeout=50) == [Backoff.SPIN_POLLS] * 2
    kept = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(kept)})   # two ranks on one core
    try:
        assert colls.spawn(_spin_polls, 2, transport="shm", timeout=50) == [OVERSUBSCRIBED_SPIN_POLLS] * 2
        monkeypatch.setenv("COLLS_SHM_SPIN_POLLS", "7")
        assert colls.spawn(_spin_polls, 2, transport="shm", timeout=50) == [7, 7]
    finally:
        os.sched_setaffinity(0, kept)
