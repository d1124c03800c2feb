"""Compiled calls: a call repeated with the same signature takes its `Description` (checks, algorithm
and schedule) from the communicator's cache (`Communicator._describe`). These check that it still
gives numpy's answer whatever the buffers of each call are, checks what can differ between calls
(the buffers), counts its traffic, names itself in a timeout, runs what the cache holds, and keeps
a forced algorithm apart; and the explicit persistent collectives (`all_reduce_init` ...) built on
the same path."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

import colls
from algorithms.blocks import Schedule
from colls.describe import Description


def _cached(comm, collective: str) -> dict[tuple, Description]:
    """The communicator's cached descriptions of `collective`, by signature."""
    return {key: d for key, d in comm._check.described.items() if key[0] == collective}


def _swap(comm, key: tuple, **fields) -> Description:
    """Replace the cached description of `key` by one with `fields` changed (descriptions are
    immutable): what later calls of that signature then run."""
    old = comm._check.described[key]
    values = {name: getattr(old, name) for name in ("collective", "dtype", "shape", "root", "op", "algorithm",
                                                    "group", "out_shape", "schedule", "exchanges")}
    values.update(fields)
    comm._check.described[key] = new = Description(**values)
    return new


def _every_kind_of_buffer(comm) -> list[bool]:
    """The same signature called with each kind of `out`, twice each, then broken layouts."""
    x = np.arange(12, dtype=np.int64).reshape(3, 4) + 100 * comm.rank
    want = sum(np.arange(12, dtype=np.int64).reshape(3, 4) + 100 * r for r in range(comm.size))
    ok = []
    for _ in range(2):
        got = comm.all_reduce(x, op="sum")                      # out=None: a fresh array
        ok.append(np.array_equal(got, want) and got is not x)
        out = np.full((3, 4), -1, np.int64)
        got = comm.all_reduce(x, op="sum", out=out)             # out given: the result lands in it
        ok.append(got is out and np.array_equal(out, want))
        strided = np.full((3, 8), -1, np.int64)[:, ::2]         # a strided out: the full path copies back
        got = comm.all_reduce(x, op="sum", out=strided)
        ok.append(got is strided and np.array_equal(strided, want))
        y = x.copy()
        got = comm.all_reduce(y, op="sum", out=y)               # in place
        ok.append(got is y and np.array_equal(y, want))
        wide = np.repeat(x, 2, axis=1)[:, ::2]                  # a strided x of the cached shape
        ok.append(np.array_equal(comm.all_reduce(wide, op="sum"), want))
        wide = np.repeat(x, 2, axis=1)[:, ::2]
        got = comm.all_reduce(wide, op="sum", out=wide)         # in place into a strided x
        ok.append(got is wide and np.array_equal(wide, want))
        read_only = np.full((3, 4), -1, np.int64)
        read_only.flags.writeable = False
        with pytest.raises(colls.InvalidArgument, match="read-only"):
            comm.all_reduce(x, op="sum", out=read_only)         # refused though the signature is cached
        with pytest.raises(colls.InvalidArgument, match="read-only"):
            frozen = x.copy()
            frozen.flags.writeable = False
            comm.all_reduce(frozen, op="sum", out=frozen)       # in place into a read-only x: refused too
        ok.append(np.array_equal(comm.all_reduce(x.astype(np.float64), op="avg"), want / comm.size))
    ok.append(comm.stats()["all_reduce"]["calls"] == 14)
    ok.append(len(_cached(comm, "all_reduce")) >= 2)   # (sum, int64, (3, 4)) and (avg, float64, (3, 4))
    return ok


@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_cached_calls_give_numpys_answer_for_every_kind_of_buffer(transport, size):
    for rank, checks in enumerate(colls.spawn(_every_kind_of_buffer, size, transport=transport, timeout=60)):
        assert all(checks), (rank, checks)


def test_a_user_op_is_not_cached():
    """A user's Op may change between calls, so its calls always take the full checks."""
    def body(comm):
        op = colls.Op(np.add, commutative=True)
        for _ in range(3):
            comm.all_reduce(np.ones(2), op=op)
            comm.reduce_scatter(np.ones(2), op=op)
            comm.reduce(np.ones(2), op=op)
        return len(comm._check.described)

    assert colls.spawn(body, 2, transport="local") == [0, 0]


def _second_call_alone(comm, collective: str) -> str | None:
    """Both ranks make call #0; only rank 0 makes call #1, the same signature, so it runs cached."""
    getattr(comm, collective)(np.ones(4))
    if comm.rank == 1:
        time.sleep(1.5)
        return None
    with pytest.raises(colls.CollectiveTimeout) as info:
        getattr(comm, collective)(np.ones(4), timeout=0.5)
    return str(info.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("collective,label", [("all_reduce", "(recursive_doubling, 4 x float64, SUM)"),
                                              ("all_to_all", "(pairwise, 4 x float64)"),
                                              ("reduce_scatter", "(pairwise, 4 x float64, SUM)"),
                                              ("reduce", "(binomial, 4 x float64, SUM, root 0)")])
def test_a_cached_call_names_itself_in_a_timeout(transport, collective, label):
    message = colls.spawn(_second_call_alone, 2, transport=transport, args=(collective,), timeout=10.0)[0]
    assert f"{collective} #1 {label}" in message and "rank 0" in message, message


def test_a_bad_op_is_still_named_once_a_signature_is_cached():
    """An unhashable op must get the usual InvalidArgument, not a TypeError from the cache lookup."""
    def body(comm):
        x = np.ones(3)
        comm.all_reduce(x, op="sum")
        comm.all_reduce(x, op="sum")
        with pytest.raises(colls.InvalidArgument, match="op must be"):
            comm.all_reduce(x, op=["sum"])
        return True

    assert colls.spawn(body, 2, transport="local") == [True, True]


def _compiled_exchanges(comm) -> tuple:
    """Which exchanges the compiled schedule of a small sum holds, and whether a float sum still
    agrees bitwise."""
    x = np.linspace(0.1, 1.7, 5, dtype=np.float32) * (comm.rank + 1)
    first = comm.all_reduce(x, op="sum")
    again = comm.all_reduce(x, op="sum")   # cached
    description = next(iter(_cached(comm, "all_reduce").values()))
    schedule = description.schedule
    peers = None if schedule is None else [step.dst for step in schedule.steps]
    return peers, first.tobytes(), again.tobytes()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_recursive_doubling_compiles_to_its_exchanges_where_they_are_all_it_does(size):
    results = colls.spawn(_compiled_exchanges, size, transport="shm", timeout=60)
    for rank, (peers, first, again) in enumerate(results):
        # partners rank XOR 1, XOR 2, ... (recursive doubling); of 3 ranks, 0 and 1 fold into one
        # (they run the algorithm) and rank 2 only exchanges with rank 1
        want = {3: {0: None, 1: None, 2: [1]}}.get(size, {r: [r ^ 1, r ^ 2][:size // 2] for r in range(size)})
        assert peers == want[rank], (rank, peers)
        assert again == first == results[0][1]   # the same bits on every rank, cached or not
    want = sum(np.linspace(0.1, 1.7, 5, dtype=np.float32) * (r + 1) for r in range(size))
    np.testing.assert_allclose(np.frombuffer(results[0][1], np.float32), want, rtol=1e-6)


_LATE_CASES = (("sum", np.float64), ("max", np.int8), ("prod", np.int32), ("bxor", np.uint16),
               ("sum", np.complex64), ("min", np.float16))


def _cached_with_late_peers(comm, calls: int) -> list[bool]:
    """Cached calls of several signatures in turn, one rank or another arriving late to some, so
    that a transport's short spin gives up and waits the general way; each call's result against
    numpy's."""
    rng = np.random.default_rng(7)   # the same draws on every rank
    ok = []
    for call in range(calls):
        op, dtype = _LATE_CASES[call % len(_LATE_CASES)]
        values = [((np.arange(5) + call + r) % 3 + 1).astype(dtype) for r in range(comm.size)]
        want = {"sum": np.add, "max": np.maximum, "prod": np.multiply, "bxor": np.bitwise_xor,
                "min": np.minimum}[op].reduce(values)
        late = rng.integers(-1, comm.size)   # -1: nobody
        if comm.rank == late:
            time.sleep(0.01 + 0.01 * rng.random())
        got = comm.all_reduce(values[comm.rank], op=op)
        ok.append(got.dtype == dtype and np.array_equal(got, want))
    return ok


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_a_compiled_exchange_gives_numpys_answer_when_its_peer_is_late(size):
    results = colls.spawn(_cached_with_late_peers, size, transport="shm", args=(60,), timeout=90)
    for rank, ok in enumerate(results):
        assert all(ok), (rank, [call for call, good in enumerate(ok) if not good])


def _blocks_every_kind_of_buffer(comm) -> list[bool]:
    """all_gather and all_to_all of one signature, twice each, with each kind of `out`."""
    n = comm.size
    x = np.arange(2 * n * 3, dtype=np.int32).reshape(2 * n, 3) + 1000 * comm.rank
    gathered = np.concatenate([np.arange(2 * n * 3, dtype=np.int32).reshape(2 * n, 3) + 1000 * r
                               for r in range(n)])
    swapped = np.concatenate([(np.arange(2 * n * 3, dtype=np.int32).reshape(2 * n, 3) + 1000 * r)
                              [2 * comm.rank:2 * comm.rank + 2] for r in range(n)])
    ok = []
    for _ in range(2):
        ok.append(np.array_equal(comm.all_gather(x), gathered))
        out = np.full(gathered.shape, -1, np.int32)
        ok.append(comm.all_gather(x, out=out) is out and np.array_equal(out, gathered))
        strided = np.full((gathered.shape[0], 6), -1, np.int32)[:, ::2]      # the full path copies back
        ok.append(comm.all_gather(x, out=strided) is strided and np.array_equal(strided, gathered))
        inside = np.full(gathered.shape, -1, np.int32)                      # x is a view of out
        mine = inside[2 * n * comm.rank:2 * n * (comm.rank + 1)]
        mine[...] = x
        ok.append(np.array_equal(comm.all_gather(mine, out=inside), gathered))
        ok.append(np.array_equal(comm.all_to_all(x), swapped))
        out = np.full(x.shape, -1, np.int32)
        ok.append(comm.all_to_all(x, out=out) is out and np.array_equal(out, swapped))
        y = x.copy()
        ok.append(comm.all_to_all(y, out=y) is y and np.array_equal(y, swapped))   # in place
        wide = np.repeat(x, 2, axis=1)[:, ::2]                                   # a strided x
        ok.append(np.array_equal(comm.all_to_all(wide), swapped))
        read_only = np.full(x.shape, -1, np.int32)
        read_only.flags.writeable = False
        with pytest.raises(colls.InvalidArgument, match="read-only"):
            comm.all_to_all(x, out=read_only)                                   # refused once cached too
        with pytest.raises(colls.InvalidArgument, match="shape"):
            comm.all_gather(x, out=np.empty((gathered.shape[0] + 1, 3), np.int32))   # a wrong out: named
    stats = comm.stats()
    ok.append(stats["all_gather"]["calls"] == 8 and stats["all_to_all"]["calls"] == 8)
    ok.append(len(_cached(comm, "all_gather")) + len(_cached(comm, "all_to_all")) >= 2)
    return ok


@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_cached_all_gather_and_all_to_all_give_numpys_answer_for_every_kind_of_buffer(transport, size):
    _every_check_holds(_blocks_every_kind_of_buffer, size, transport)


def _reduce_scatter_every_kind_of_buffer(comm) -> list[bool]:
    """reduce_scatter of one signature, twice each, with each kind of `out` and two ops."""
    n = comm.size
    x = np.arange(2 * n * 3, dtype=np.int32).reshape(2 * n, 3) * (comm.rank + 1)
    everyone = [np.arange(2 * n * 3, dtype=np.int32).reshape(2 * n, 3) * (r + 1) for r in range(n)]
    mine = slice(2 * comm.rank, 2 * comm.rank + 2)
    summed, largest = np.sum(everyone, axis=0)[mine], np.max(everyone, axis=0)[mine]
    kept = x.copy()
    ok = []
    for _ in range(2):
        ok.append(np.array_equal(comm.reduce_scatter(x), summed))
        out = np.full(summed.shape, -1, np.int32)
        ok.append(comm.reduce_scatter(x, out=out) is out and np.array_equal(out, summed))
        ok.append(np.array_equal(comm.reduce_scatter(x, op="max"), largest))
        strided = np.full((2, 6), -1, np.int32)[:, ::2]                      # the full path copies back
        ok.append(comm.reduce_scatter(x, out=strided) is strided and np.array_equal(strided, summed))
        y = x.copy()
        inside = y[:2]                                                       # out over x
        ok.append(comm.reduce_scatter(y, out=inside) is inside and np.array_equal(inside, summed))
        ok.append(np.array_equal(x, kept))                                  # x left alone
        with pytest.raises(colls.InvalidArgument, match="shape"):
            comm.reduce_scatter(x, out=np.empty((3, 3), np.int32))          # a wrong out: named
    ok.append(comm.stats()["reduce_scatter"]["calls"] == 10)
    ok.append(len(_cached(comm, "reduce_scatter")) == 2)
    return ok


@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_cached_reduce_scatters_give_numpys_answer_for_every_kind_of_buffer(transport, size):
    _every_check_holds(_reduce_scatter_every_kind_of_buffer, size, transport)


def _reduce_every_kind_of_buffer(comm) -> list[bool]:
    """reduce of one signature per root, twice each, with each kind of `out` and two ops."""
    n = comm.size
    x = np.arange(6, dtype=np.int32).reshape(2, 3) * (comm.rank + 1)
    everyone = [np.arange(6, dtype=np.int32).reshape(2, 3) * (r + 1) for r in range(n)]
    summed, largest = np.sum(everyone, axis=0), np.max(everyone, axis=0)
    kept = x.copy()
    ok = []
    for _ in range(2):
        for root in range(n):
            mine = comm.rank == root
            got = comm.reduce(x, root=root)
            ok.append(np.array_equal(got, summed) if mine else got is None)
            out = np.full(x.shape, -1, np.int32)
            got = comm.reduce(x, root=root, out=out)
            ok.append((got is out and np.array_equal(out, summed)) if mine else got is None)
            ok.append(np.array_equal(comm.reduce(x, root=root, op="max"), largest) if mine
                      else comm.reduce(x, root=root, op="max") is None)
            strided = np.full((2, 6), -1, np.int32)[:, ::2]                 # the full path copies back
            got = comm.reduce(x, root=root, out=strided)
            ok.append((got is strided and np.array_equal(strided, summed)) if mine else got is None)
            y = x.copy()
            got = comm.reduce(y, root=root, out=y)                          # in place at the root
            ok.append((got is y and np.array_equal(y, summed)) if mine else np.array_equal(y, x))
            ok.append(np.array_equal(x, kept))                             # x left alone
            if mine:
                with pytest.raises(colls.InvalidArgument, match="shape"):
                    comm.reduce(x, root=root, out=np.empty((3, 3), np.int32))   # a wrong out: named
    ok.append(comm.stats()["reduce"]["calls"] == 10 * n)
    ok.append(len(_cached(comm, "reduce")) == 2 * n)
    return ok


@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_cached_reduces_give_numpys_answer_for_every_kind_of_buffer(transport, size):
    _every_check_holds(_reduce_every_kind_of_buffer, size, transport)


def _compiled_blocks_with_late_peers(comm, calls: int) -> tuple:
    """Cached small all_gathers and all_to_alls, one rank or another late to some: each result
    against numpy's, and whether each compiled schedule sends every step to the peer it receives
    from."""
    rng = np.random.default_rng(11)   # the same draws on every rank
    n, ok = comm.size, []
    for call in range(calls):
        x = np.arange(2 * n, dtype=np.int64) + 100 * comm.rank + call
        everyone = [np.arange(2 * n, dtype=np.int64) + 100 * r + call for r in range(n)]
        late = rng.integers(-1, n)   # -1: nobody
        if comm.rank == late:
            time.sleep(0.01 + 0.01 * rng.random())
        ok.append(np.array_equal(comm.all_gather(x), np.concatenate(everyone)))
        ok.append(np.array_equal(comm.all_to_all(x), np.concatenate([e[2 * comm.rank:2 * comm.rank + 2]
                                                                     for e in everyone])))
    described = comm._check.described
    held = []
    for collective in ("all_gather", "all_to_all"):
        schedule = described[collective, None, np.dtype(np.int64), (2 * n,), None, None].schedule
        held.append(schedule is not None and all(step.dst == step.src for step in schedule.steps))
    return ok, held


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size,held", [(2, [True, True]), (4, [True, False])])
def test_small_compiled_block_schedules_are_right_with_late_peers(transport, size, held, monkeypatch):
    # recursive doubling's partners are paired at every step; pairwise's only at 2 ranks
    monkeypatch.setenv("COLLS_ALGO", "all_gather:recursive_doubling;all_to_all:pairwise")
    for rank, (ok, paired) in enumerate(colls.spawn(_compiled_blocks_with_late_peers, size,
                                                    transport=transport, args=(40,), timeout=90)):
        assert all(ok), (rank, [call for call, good in enumerate(ok) if not good])
        assert paired == held


def _every_check_holds(fn, size: int, transport: str) -> None:
    """Run `fn` (a list of checks per rank) on `size` ranks; every check of every rank must hold."""
    for rank, checks in enumerate(colls.spawn(fn, size, transport=transport, timeout=60)):
        assert all(checks), (rank, checks)


@pytest.mark.parametrize("pinned", ["all_gather:ring;all_to_all:pairwise",
                                    "all_gather:recursive_doubling;all_to_all:direct"])
@pytest.mark.parametrize("size", [3, 4, 5, 8])
def test_compiled_schedules_give_numpys_answer_at_every_group_size(pinned, size, monkeypatch):
    """Ring and recursive-doubling all_gather and pairwise all_to_all run from their compiled
    schedules (recursive doubling only at powers of two) at more ranks than two."""
    monkeypatch.setenv("COLLS_ALGO", pinned)
    _every_check_holds(_blocks_every_kind_of_buffer, size, "local")


def _broadcasts_every_kind_of_buffer(comm) -> list[bool]:
    """Broadcasts of one shape from two roots, three times each, with each kind of `out`: the later
    calls run cached (one description per root), and give what the first did."""
    x = np.arange(12, dtype=np.int64).reshape(4, 3) + 100 * comm.rank
    ok = []
    for root in (0, comm.size - 1):
        want = np.arange(12, dtype=np.int64).reshape(4, 3) + 100 * root
        for _ in range(3):
            got = comm.broadcast(x, root=root)
            untouched = np.array_equal(x, want + 100 * (comm.rank - root))
            ok.append(np.array_equal(got, want) and got is not x and untouched)
            out = np.full(x.shape, -1, np.int64)
            ok.append(comm.broadcast(x, root=root, out=out) is out and np.array_equal(out, want))
            y = x.copy()
            ok.append(comm.broadcast(y, root=root, out=y) is y and np.array_equal(y, want))   # in place
            strided = np.full((4, 6), -1, np.int64)[:, ::2]                 # the full path copies back
            ok.append(comm.broadcast(x, root=root, out=strided) is strided and np.array_equal(strided, want))
            with pytest.raises(colls.InvalidArgument, match="shape"):
                comm.broadcast(x, root=root, out=np.empty((5, 3), np.int64))   # a wrong out: named
            frozen = x.copy()
            frozen.flags.writeable = False
            with pytest.raises(colls.InvalidArgument, match="read-only"):
                comm.broadcast(frozen, root=root, out=frozen)   # in place, read-only: refused on every rank
            with pytest.raises(colls.InvalidArgument, match="root"):
                comm.broadcast(x, root=comm.size)              # a bad root: named, cached or not
    ok.append(comm.stats()["broadcast"]["calls"] == 24)
    ok.append(sorted(key[4] for key in _cached(comm, "broadcast")) == sorted({0, comm.size - 1}))
    return ok


@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_cached_broadcasts_give_the_roots_buffer_for_every_kind_of_buffer(transport, size):
    _every_check_holds(_broadcasts_every_kind_of_buffer, size, transport)


def _later_calls_take_the_cached_description(comm) -> tuple[list[str], list[bool]]:
    """After one call each, the cached descriptions' algorithms (or the schedules they hold) are
    swapped for recording ones: later calls of the same signature must run them (and be right)."""
    ran, scheduled = [], []

    class Recording(tuple):
        name = ""

        def __iter__(self):
            ran.append(self.name)
            return super().__iter__()

    x = np.arange(4 * comm.size, dtype=np.float32) + comm.rank
    for collective in ("all_gather", "all_to_all"):
        getattr(comm, collective)(x)
        key = (collective, None, x.dtype, x.shape, None, None)
        cached = comm._check.described[key]
        run = cached.algorithm.run

        def recording(*args, run=run, collective=collective):
            ran.append(collective)
            return run(*args)

        schedule = cached.schedule
        scheduled.append(schedule is not None)
        if schedule is not None:   # the schedule runs, not the algorithm's function
            steps = Recording(schedule.steps)
            steps.name = collective
            schedule = Schedule(schedule.copy_from, schedule.copy_to, steps)
        _swap(comm, key, algorithm=replace(cached.algorithm, run=recording), schedule=schedule)
    want = np.concatenate([np.arange(4 * comm.size, dtype=np.float32) + r for r in range(comm.size)])
    assert np.array_equal(comm.all_gather(x), want)
    assert np.array_equal(comm.all_to_all(x), want.reshape(comm.size, -1)[:, 4 * comm.rank:4 * comm.rank + 4]
                          .reshape(-1))
    comm.all_gather(x, algorithm="ring")   # a forced algorithm: a description of its own, not this one
    return ran, scheduled


@pytest.mark.parametrize("pinned, scheduled", [("all_gather:ring;all_to_all:pairwise", True),
                                               ("all_gather:bruck;all_to_all:direct", False)])
def test_later_calls_of_a_signature_run_the_cached_description(pinned, scheduled, monkeypatch):
    """Ring and pairwise compile to their schedules (copy and exchanges worked out once), the
    others run their functions; either way a later call runs what the cache holds."""
    monkeypatch.setenv("COLLS_ALGO", pinned)   # chosen, not forced by `algorithm=`
    assert colls.spawn(_later_calls_take_the_cached_description, 2, transport="shm", timeout=30) == [
        (["all_gather", "all_to_all"], [scheduled, scheduled])] * 2


# (collective, the algorithm forced, its call on x of 4 * size int64, numpy's answer on every rank)
_FORCED = (("all_reduce", "ring"), ("broadcast", "pipeline"), ("reduce", "ring"),
           ("reduce_scatter", "recursive_halving"), ("all_gather", "bruck"), ("all_to_all", "direct"))


def _forced_calls_are_cached_under_their_name(comm) -> list:
    """Calls that force an algorithm, three times each, beside unforced ones of the same signature:
    the forced ones' later calls run the forced algorithm from a description of its own, right
    each time."""
    n, rank = comm.size, comm.rank
    x = np.arange(4 * n, dtype=np.int64) + 100 * rank
    every = [np.arange(4 * n, dtype=np.int64) + 100 * r for r in range(n)]
    total = np.sum(every, axis=0)
    want = {"all_reduce": total, "broadcast": every[0], "reduce": total if rank == 0 else None,
            "reduce_scatter": total[4 * rank:4 * rank + 4], "all_gather": np.concatenate(every),
            "all_to_all": np.concatenate([e[4 * rank:4 * rank + 4] for e in every])}
    ran, found = [], []
    for collective, forced in _FORCED:
        call = getattr(comm, collective)
        for algorithm in (forced, None, forced, forced, None):
            got = call(x, algorithm=algorithm)
            found.append(want[collective] is None and got is None or np.array_equal(got, want[collective]))
            if algorithm is not None and (not ran or ran[-1][0] != collective):
                # the first forced call cached a description under the forced name: record what
                # its later calls run
                key = next(key for key in _cached(comm, collective) if key[-1] == forced)
                cached = comm._check.described[key]
                run = cached.algorithm.run

                def recording(*args, run=run, collective=collective, name=cached.algorithm.name):
                    ran.append((collective, name))
                    return run(*args)

                # run the algorithm's function, not a schedule
                _swap(comm, key, algorithm=replace(cached.algorithm, run=recording), schedule=None)
                ran.append((collective, "cached"))
    return found, ran


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [2, 3])
def test_a_forced_algorithm_is_cached_under_its_own_name(transport, size):
    """`algorithm=` calls are cached as the selector's are, each forced name apart."""
    for found, ran in colls.spawn(_forced_calls_are_cached_under_their_name, size, transport=transport,
                                  timeout=90):
        assert all(found)
        assert ran == [entry for collective, forced in _FORCED
                       for entry in ((collective, "cached"), (collective, forced), (collective, forced))]


# -- persistent collectives -----------------------------------------------------------------------

def _persistent_of_every_kind(comm) -> list[bool]:
    """Each persistent collective made once, then run several times by start/wait and by call,
    with the input changed between runs: each run reads the input anew and lands in the same out."""
    n, rank = comm.size, comm.rank
    x = np.zeros((2 * n, 3), np.int64)
    summed = np.empty_like(x)
    gathered = np.empty((2 * n * n, 3), np.int64)
    handles = {
        "all_reduce": comm.all_reduce_init(x, out=summed),
        "broadcast": comm.broadcast_init(x, root=n - 1),
        "all_gather": comm.all_gather_init(x, out=gathered),
        "reduce_scatter": comm.reduce_scatter_init(x, op="max"),
        "all_to_all": comm.all_to_all_init(x),
    }
    ok = []
    for run in range(4):
        every = [np.arange(6 * n, dtype=np.int64).reshape(2 * n, 3) * (r + 1) + run for r in range(n)]
        x[...] = every[rank]
        want = {"all_reduce": np.sum(every, axis=0), "broadcast": every[n - 1],
                "all_gather": np.concatenate(every),
                "reduce_scatter": np.max(every, axis=0)[2 * rank:2 * rank + 2],
                "all_to_all": np.concatenate([e[2 * rank:2 * rank + 2] for e in every])}
        if run % 2:
            results = {name: handle() for name, handle in handles.items()}
        else:
            for handle in handles.values():
                handle.start()
            results = {name: handle.wait() for name, handle in handles.items()}
        ok += [np.array_equal(results[name], want[name]) for name in handles]
        ok.append(results["all_reduce"] is summed and results["all_gather"] is gathered)
        ok.append(all(handle.is_completed() for handle in handles.values()))
    ok.append(comm.stats()["all_reduce"]["calls"] == 4)
    return ok


@pytest.mark.parametrize("transport", ["local", "shm"])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_persistent_collectives_read_their_input_at_each_start(transport, size):
    _every_check_holds(_persistent_of_every_kind, size, transport)


def _persistent_in_order(comm) -> list[bool]:
    """A persistent all_reduce started between blocking and async calls runs in issue order."""
    x = np.full(4, comm.rank + 1.0)
    handle = comm.all_reduce_init(x, op="max")
    before = comm.all_reduce(np.ones(3), async_op=True)
    handle.start()
    after = comm.broadcast(np.full(2, float(comm.rank)), root=0)
    return [np.array_equal(before.wait(), np.full(3, comm.size)),
            np.array_equal(handle.wait(), np.full(4, comm.size)),
            np.array_equal(after, np.zeros(2))]


def test_persistent_starts_keep_issue_order_with_other_calls():
    _every_check_holds(_persistent_in_order, 3, "local")


def _persistent_errors(comm) -> list[str]:
    """What a persistent request refuses, and when."""
    seen = []
    x = np.ones(4)
    for bad in (lambda: comm.all_reduce_init(x, out=np.empty(5)),
                lambda: comm.all_reduce_init(x, op="nonsense"),
                lambda: comm.broadcast_init(x, root=comm.size),
                lambda: comm.reduce_scatter_init(np.ones(comm.size + 1) if comm.size > 1 else None),
                lambda: comm.all_to_all_init(x, timeout=-1)):
        try:
            bad()
        except colls.InvalidArgument as error:
            seen.append(str(error))
    handle = comm.all_reduce_init(x)
    with pytest.raises(colls.InvalidArgument, match="not started"):
        handle.wait()
    handle.start()
    with pytest.raises(colls.InvalidArgument, match="not waited"):
        handle.start()
    with pytest.raises(colls.InvalidArgument, match="not waited"):
        handle()
    handle.wait()
    comm.barrier()
    comm.close()
    with pytest.raises(colls.InvalidArgument, match="closed"):
        handle()
    return seen


def test_persistent_requests_check_once_at_init_and_refuse_misuse():
    for rank, seen in enumerate(colls.spawn(_persistent_errors, 2, transport="local")):
        assert len(seen) == 5, seen
        assert all(message.startswith(f"rank {rank}: ") for message in seen), seen
        assert "out has shape (5,)" in seen[0] and "op must be" in seen[1] and "root=2" in seen[2]
        assert "axis 0 of x" in seen[3] and "timeout" in seen[4]
