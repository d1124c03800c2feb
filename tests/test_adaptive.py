"""Protocols chosen by how long they took lately (`transports.adaptive`, `ShmTransport.sendrecv`)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import colls
from algorithms import SUM
from transports.adaptive import ProtocolChoice
from transports.base import COLLECTIVE_TAG_BASE

TAG = COLLECTIVE_TAG_BASE + 11
KEY = ("plain", 21)


def _run(choice: ProtocolChoice, seconds: dict[bool, float], calls: int, nbytes: int = 1 << 20) -> list[bool]:
    """`calls` calls of KEY that take `seconds[protocol]`; the protocol of each."""
    taken = []
    for _ in range(calls):
        protocol = choice.choose(KEY, False)
        choice.record(KEY, protocol, seconds[protocol], nbytes)
        taken.append(protocol)
    return taken


def test_the_faster_protocol_takes_over_after_its_first_tries():
    choice = ProtocolChoice(explore_every=32)
    taken = _run(choice, {False: 500e-6, True: 100e-6}, 64)
    # the prior, the other on the second call (five times faster: it takes over at once), the
    # first again on the third (each has two times then), the other from there on but for its
    # try every 32nd call
    assert taken[:4] == [False, True, False, True]
    assert all(taken[3:31]) and taken[31] is False and all(taken[32:63])
    assert choice.preferred(KEY) is True


def test_the_slower_protocol_is_tried_once_in_explore_every_calls():
    choice = ProtocolChoice(explore_every=16)
    taken = _run(choice, {False: 100e-6, True: 300e-6}, 160)
    tries = [i + 1 for i, protocol in enumerate(taken) if protocol]
    assert tries == [2, 3] + list(range(16, 161, 16))
    assert choice.preferred(KEY) is False


def test_a_change_of_state_is_followed_within_a_few_tries():
    choice = ProtocolChoice(explore_every=16, keep=3)
    _run(choice, {False: 100e-6, True: 300e-6}, 100)
    assert choice.preferred(KEY) is False
    # the machine changes: now the other protocol is five times faster
    taken = _run(choice, {False: 500e-6, True: 100e-6}, 40)
    # it goes over at its first try, and from then on the old one comes back on its tries only
    switch = taken.index(True)
    assert choice.preferred(KEY) is True and switch < 16
    assert taken[switch:].count(False) <= -(-(40 - switch) // 16)
    # and back again
    taken = _run(choice, {False: 100e-6, True: 500e-6}, 60)
    switch = taken.index(False)
    assert choice.preferred(KEY) is False and switch < 16
    assert taken[switch:].count(True) <= -(-(60 - switch) // 16) + 2


def test_a_protocol_within_the_margin_does_not_take_over():
    choice = ProtocolChoice(margin=0.1)
    _run(choice, {False: 100e-6, True: 95e-6}, 100)
    assert choice.preferred(KEY) is False
    choice = ProtocolChoice(margin=0.1)
    _run(choice, {False: 100e-6, True: 85e-6}, 100)
    assert choice.preferred(KEY) is True


def test_times_compare_per_byte_and_keys_apart():
    choice = ProtocolChoice()
    for _ in range(10):   # key A: protocol True is faster per byte, though its calls are bigger
        for protocol, seconds, nbytes in ((False, 100e-6, 1 << 20), (True, 150e-6, 2 << 20)):
            choice.choose("A", False)
            choice.record("A", protocol, seconds, nbytes)
    choice.choose("B", True)
    assert choice.preferred("A") is True
    assert choice.preferred("B") is True and choice.preferred("C") is None
    preferred, calls, fifo, attach = choice.summary()["A"]
    assert preferred is True and calls == 20
    assert fifo == pytest.approx(100e-6 / (1 << 20)) and attach == pytest.approx(150e-6 / (2 << 20))


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="explore_every"):
        ProtocolChoice(explore_every=1)
    with pytest.raises(ValueError, match="margin"):
        ProtocolChoice(margin=1.5)


def _exchanges(comm, nbytes: int, calls: int, fixed_rank: int | None) -> list:
    """`calls` plain and reducing sendrecvs of `nbytes` of int32 between the two ranks, each checked;
    rank `fixed_rank` (if any) always sends through the FIFO, so the two directions take different
    protocols. What every call got right, and this rank's choices."""
    transport, peer = comm.transport, 1 - comm.rank
    if comm.rank == fixed_rank:
        transport.adapting = (False, False)
        transport.exchange_rendezvous_bytes = transport.reduce_exchange_rendezvous_bytes = 1 << 62
    count = nbytes // 4
    wrong = 0
    for i in range(calls):
        mine = np.arange(count, dtype=np.int32) + 1000 * comm.rank + i
        got = np.full(count, -1, np.int32)
        transport.sendrecv(mine, peer, got, peer, TAG, time.monotonic() + 20)
        wrong += int(np.count_nonzero(got != np.arange(count) + 1000 * peer + i))
        total = mine.copy()
        transport.sendrecv(mine, peer, total, peer, TAG, time.monotonic() + 20, SUM.into_left)
        wrong += int(np.count_nonzero(total != 2 * np.arange(count) + 1000 + 2 * i))
    posted = sum(transport.rendezvous_posted)
    summary = {repr(key): list(value) for key, value in transport.adaptive.summary().items()}
    return [wrong, posted, transport.cma, summary]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fixed_rank", [None, 1])
def test_shm_exchanges_try_both_protocols_and_deliver_whichever_each_side_takes(fixed_rank):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("with more ranks than cores the exchanges keep the FIFO (no choice made)")
    calls = 70
    results = colls.spawn(_exchanges, 2, transport="shm", args=(1 << 20, calls, fixed_rank), timeout=100)
    for rank, (wrong, posted, attach, summary) in enumerate(results):
        assert wrong == 0
        if not attach:
            pytest.skip("cross-memory attach is not allowed here (ptrace scope)")
        if rank == fixed_rank:
            assert posted == 0 and summary == {}   # all through the FIFO, nothing chosen
            continue
        assert set(summary) == {repr((False, False, 21)), repr((True, False, 21))}
        for preferred, made, fifo, attach_time in summary.values():
            assert made == calls
            assert fifo is not None and attach_time is not None   # both protocols were timed
            # and the one kept is not beaten by the other's best by more than the margin
            kept, other = (attach_time, fifo) if preferred else (fifo, attach_time)
            assert other >= kept * (1 - ProtocolChoice().margin)
        # cross-memory attach was used at least on its tries (calls 2, 32 and 64 of each kind; the
        # third call tries the FIFO again if the second's try took over)
        assert posted >= 2 * 3
