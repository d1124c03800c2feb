"""The wide matrix on the `local` transport (ranks as threads), plus property tests and byte counters.

`run_matrix` runs every collective × dtype × count × output mode with operators and roots spread
over them, at world sizes 1-16, and checks every answer bitwise against numpy. Hypothesis then
draws single calls and short programs of calls (world size 1-9, count 0-300, any dtype, operator,
root and algorithm) and checks them against the same oracles.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import Case, Checker

import colls

SIZES = (1, 2, 3, 4, 5, 8, 16)
TIMEOUT_S = 60.0


def _matrix(comm, seed: int, big: bool) -> dict[str, object]:
    # out_of_order needs a send that completes before its receive is posted: see test_isend_* below
    if big:
        return reference.run_matrix(comm, seed, out_of_order=False)
    return reference.run_matrix(comm, seed, big_dtypes=("float32",),
                                big_collectives=("all_reduce", "reduce_scatter", "all_gather"),
                                out_of_order=False)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", SIZES)
def test_matrix(size: int) -> None:
    """Every collective, dtype, count (0 to 2**20 + 3), output mode, root and op, exactly."""
    summaries = colls.spawn(_matrix, size, transport="local", timeout=TIMEOUT_S, args=(size, size <= 8))
    failures = [f for s in summaries for f in s["failures"]]
    assert not failures, "\n".join(failures[:20])
    assert min(s["checks"] for s in summaries) > 2900


# -- property tests --------------------------------------------------------------------------------

ROOTED = ("broadcast", "reduce", "gather", "scatter")


@st.composite
def cases(draw, size: int) -> Case:
    """One call for a group of `size`: any collective, dtype, count, op, root, mode and algorithm."""
    collective = draw(st.sampled_from(reference.COLLECTIVES))
    dtype = draw(st.sampled_from(reference.DTYPES))
    count = draw(st.integers(0, 300))
    op = draw(st.sampled_from(reference.valid_ops(dtype))) if collective in reference.REDUCING else None
    root = draw(st.integers(0, size - 1)) if collective in ROOTED else None
    modes = ["new"]
    if collective != "all_to_all_v":
        modes.append("out")
    if collective in ("all_reduce", "broadcast"):
        modes.append("inplace")
    mode = draw(st.sampled_from(modes))
    tail = draw(st.sampled_from([(), (), (3,), (2, 1)]))
    algorithm = draw(st.sampled_from([None, *colls.algorithms(collective)]))
    if collective in ("reduce_scatter", "all_to_all", "scatter"):
        count = count // size   # rows per block: keep the whole input near 300 rows
    return Case(collective, dtype, count, op=op, root=root, mode=mode, tail=tail, algorithm=algorithm)


@st.composite
def programs(draw, max_calls: int = 1) -> tuple[int, list[Case], int]:
    """(world size, a sequence of calls every rank makes, seed)."""
    size = draw(st.integers(1, 9))
    calls = draw(st.lists(cases(size), min_size=1, max_size=max_calls))
    return size, calls, draw(st.integers(0, 2**16))


def _run_program(comm, calls: list[Case], seed: int) -> dict[str, object]:
    checker = Checker(comm.rank, comm)
    try:
        for case in calls:
            reference.run_case(checker, comm, case, seed)
    except reference.Abort:
        pass
    return checker.summary()


def _check_program(size: int, calls: list[Case], seed: int) -> None:
    summaries = colls.spawn(_run_program, size, transport="local", timeout=20.0, args=(calls, seed))
    failures = [f for s in summaries for f in s["failures"]]
    assert not failures, "\n".join(failures[:10])


@pytest.mark.timeout(120)
@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_property_single_call(program) -> None:
    """Any one collective call agrees with the numpy oracle on every rank."""
    _check_program(*program)


@pytest.mark.timeout(120)
@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_calls=6))
def test_property_programs(program) -> None:
    """A sequence of mixed calls on one communicator: each agrees with the oracle."""
    _check_program(*program)


@pytest.mark.timeout(120)
@settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(1, 9), calls=st.lists(st.sampled_from(reference.COLLECTIVES), min_size=2, max_size=5),
       seed=st.integers(0, 1000))
def test_property_async_reverse_wait(size: int, calls: list[str], seed: int) -> None:
    """Calls issued with async_op=True and waited on in reverse order all finish correctly."""
    batch = [Case(c, "int32", 5 + i, op="SUM" if c in reference.REDUCING else None,
                  root=(seed + i) % size if c in ROOTED else None) for i, c in enumerate(calls)]

    def body(comm):
        checker = Checker(comm.rank, comm)
        posted = [(case, reference.issue(comm, case, seed, range(size), async_op=True)) for case in batch]
        for case, (work, x, pristine, out) in reversed(posted):
            reference.verify(checker, comm, case, seed, range(size), work.wait(), x, pristine, out)
        return checker.summary()

    summaries = colls.spawn(body, size, transport="local", timeout=20.0)
    failures = [f for s in summaries for f in s["failures"]]
    assert not failures, "\n".join(failures[:10])


# -- byte counters ---------------------------------------------------------------------------------

def _ring_traffic(comm, count: int, dtype: str) -> dict[str, object]:
    x = reference.make_input(0, comm.rank, count, dtype, op="SUM")
    comm.reset_stats()
    comm.all_reduce(x, algorithm="ring")
    return comm.stats()["all_reduce"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size,transport", [(2, "local"), (3, "local"), (4, "local"), (5, "local"),
                                            (7, "local"), (3, "shm")])
@pytest.mark.parametrize("count,dtype", [(1000, "float32"), (1001, "float64"), (4099, "int8")])
def test_ring_all_reduce_sends_two_n_minus_one_over_n(size: int, transport: str, count: int,
                                                      dtype: str) -> None:
    """A ring all-reduce of S bytes sends and receives 2(n-1)/n·S per rank, within one element per
    phase (blocks of a count that doesn't divide by n differ by one element)."""
    itemsize = np.dtype(dtype).itemsize
    total = count * itemsize
    for rank, traffic in enumerate(colls.spawn(_ring_traffic, size, transport=transport, timeout=20.0,
                                               args=(count, dtype))):
        ideal = 2 * (size - 1) / size * total
        for key in ("bytes_sent", "bytes_received"):
            assert abs(traffic[key] - ideal) <= 2 * itemsize, (rank, key, traffic[key], ideal)
        assert traffic["messages_sent"] == traffic["messages_received"] == 2 * (size - 1)
        assert traffic["calls"] == 1
        # only the two ring neighbours ever see a byte from this rank
        neighbours = {(rank + 1) % size, (rank - 1) % size}
        assert {p for p, b in enumerate(traffic["bytes_sent_to"]) if b} <= neighbours


# -- a missing rank ------------------------------------------------------------------------------------

def _one_rank_absent(comm) -> str | None:
    """Rank 1 skips the all_reduce; the others must time out with a message naming call and peer."""
    if comm.rank == 1:
        time.sleep(1.5)   # alive but silent: a dead peer is reported as PeerLost instead
        return None
    with pytest.raises(colls.CollectiveTimeout) as info:
        comm.all_reduce(np.ones(4), timeout=0.5, algorithm="ring")
    return str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ("local", "shm"))
def test_timeout_names_the_call_and_the_silent_peer(transport: str) -> None:
    messages = colls.spawn(_one_rank_absent, 3, transport=transport, timeout=10.0)
    for rank in (0, 2):
        assert "all_reduce" in messages[rank] and f"rank {rank}" in messages[rank], messages[rank]
        assert "rank 1" in messages[rank] or "rank 0" in messages[rank], messages[rank]


# -- AVG at the edge of a signed dtype ---------------------------------------------------------------

def _avg_to_the_minimum(comm, dtype: str) -> list[list[int]]:
    low = int(np.iinfo(dtype).min)
    # the two ranks' values add up to exactly the dtype's minimum: the sum is representable,
    # and so is the average low / 2
    x = np.array([low // 2, low // 2 + 1, -1], dtype) if comm.rank == 0 else \
        np.array([low // 2, low // 2 - 1, low + 1], dtype)
    return [comm.all_reduce(x, op=colls.AVG).tolist(),
            comm.reduce_scatter(np.concatenate([x, x]), op=colls.AVG).tolist()]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("dtype", ("int8", "int16", "int32", "int64"))
def test_avg_of_signed_values_summing_to_the_dtype_minimum(dtype: str) -> None:
    """AVG truncates toward zero; int8 -64 and -64 on 2 ranks average to -64, not +64."""
    half = int(np.iinfo(dtype).min) // 2
    want = [half, half, half]
    assert colls.spawn(_avg_to_the_minimum, 2, transport="local", timeout=10.0, args=(dtype,)) == \
        [[want, want], [want, want]]


# -- point to point: known limitations turned into tests ------------------------------------------

def _isend_ring(comm, count: int) -> bool:
    """The MPI idiom: post a non-blocking send to the right, receive from the left, wait."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    mine = reference.make_input(0, comm.rank, count, "float64")
    got = np.empty_like(mine)
    work = comm.send(mine, right, tag=3, async_op=True)
    comm.recv(got, left, tag=3)
    work.wait()
    return bool(np.array_equal(got, reference.make_input(0, left, count, "float64")))


def _out_of_order_tags(comm) -> object:
    """Rank 0 sends tag 1 then tag 2 (both async_op); rank 1 receives tag 2 first."""
    first, second = np.arange(3, dtype=np.int64), np.arange(10, 14, dtype=np.int64)
    if comm.rank == 0:
        works = [comm.send(first, 1, tag=1, async_op=True), comm.send(second, 1, tag=2, async_op=True)]
        for work in works:
            work.wait()
        return None
    got_second, got_first = np.empty(4, np.int64), np.empty(3, np.int64)
    comm.recv(got_second, 0, tag=2)
    comm.recv(got_first, 0, tag=1)
    return got_first.tolist(), got_second.tolist()


@pytest.mark.timeout(30)
def test_out_of_order_tags_local() -> None:
    """Non-overtaking holds per tag only: a receive for tag 2 may match before tag 1's."""
    results = colls.spawn(_out_of_order_tags, 2, transport="local", timeout=3.0)
    assert results[1] == ([0, 1, 2], [10, 11, 12, 13])


@pytest.mark.timeout(30)
def test_isend_ring_local() -> None:
    """isend right, recv left, wait: the standard deadlock-free ring exchange."""
    assert all(colls.spawn(_isend_ring, 3, transport="local", timeout=3.0, args=(10,)))


def _p2p_then_collective(comm) -> list[float]:
    """Ranks 0 and 1 exchange a message; then the whole group all-reduces."""
    if comm.rank == 0:
        comm.send(np.ones(3), 1, tag=7)
    elif comm.rank == 1:
        comm.recv(np.empty(3), 0, tag=7)
    return comm.all_reduce(np.full(2, float(comm.rank))).tolist()


@pytest.mark.timeout(30)
def test_point_to_point_among_some_ranks_then_collective_local() -> None:
    """Point-to-point between a subset of ranks must not shift the next collective's matching."""
    results = colls.spawn(_p2p_then_collective, 3, transport="local", timeout=3.0)
    assert results == [[3.0, 3.0]] * 3
