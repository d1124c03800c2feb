"""The shm transport counts the cores its ranks may use, and a waiting rank yields its core sooner
where ranks outnumber them (`ShmTransport.spin_polls`), and every exchange the FIFO cannot hold
whole then goes by cross-memory attach."""

from __future__ import annotations

import os

import pytest

import colls
from transports.base import Backoff
from transports.shm.transport import OVERSUBSCRIBED_SPIN_POLLS


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
        declared = group.transport.capabilities
        got.append([group.transport.cores, group.transport.spin_polls,
                    declared.exchange_address_from_bytes, declared.reduce_exchange_address_from_bytes,
                    declared.huge_exchange_address_from_bytes])
        group.close()
    os.sched_setaffinity(0, kept)
    return got


@pytest.mark.timeout(60)
def test_ranks_pinned_a_cpu_each_have_cores_of_their_own():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: no two ranks can be pinned apart")
    for apart, together in colls.spawn(_pinned_subgroups, 2, transport="shm", timeout=50):
        assert apart[:2] == [2, Backoff.SPIN_POLLS]             # each pinned alone: 2 CPUs for 2 ranks
        assert together[:2] == [1, OVERSUBSCRIBED_SPIN_POLLS]   # both on one CPU
        if not apart[2]:
            pytest.skip("cross-memory attach is not allowed here (ptrace scope): no thresholds")
        # on one core, every exchange bigger than the FIFO (4 slots of 256 KiB) goes by attach
        assert together[2:] == [(1 << 20) + 1] * 3
        assert apart[2] > together[2] and apart[3] > together[3] and apart[4] > together[4]


@pytest.mark.timeout(60)
def test_a_waiting_rank_yields_sooner_where_ranks_outnumber_cores():
    assert OVERSUBSCRIBED_SPIN_POLLS < Backoff.SPIN_POLLS
    if len(os.sched_getaffinity(0)) >= 2:
        assert colls.spawn(_spin_polls, 2, transport="shm", timeout=50) == [Backoff.SPIN_POLLS] * 2
    kept = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(kept)})   # two ranks on one core
    try:
        assert colls.spawn(_spin_polls, 2, transport="shm", timeout=50) == [OVERSUBSCRIBED_SPIN_POLLS] * 2
    finally:
        os.sched_setaffinity(0, kept)
