"""Bugs found by `colls fuzz` while the library was built, each kept as a test."""

from __future__ import annotations

import time

import numpy as np
import pytest

import colls


@pytest.mark.parametrize("size", [2, 3, 4, 5])
@pytest.mark.parametrize("algorithm", colls.algorithms("all_to_all"))
def test_all_to_all_in_place(size, algorithm):
    """out=x used to read blocks that had already been overwritten by arriving ones."""

    def body(comm):
        x = (np.arange(comm.size * 3, dtype=np.int32) + 100 * comm.rank).reshape(comm.size, 3)
        y = comm.all_to_all(x, out=x, algorithm=algorithm)
        return y is x, x.copy()

    for rank, (same, got) in enumerate(colls.spawn(body, size, transport="local")):
        assert same
        want = np.stack([np.arange(3, dtype=np.int32) + 3 * rank + 100 * src for src in range(size)])
        assert np.array_equal(got, want)


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("algorithm", colls.algorithms("all_gather"))
def test_all_gather_from_a_block_of_out(size, algorithm):
    """MPI_IN_PLACE style: the input is this rank's block of the output."""

    def body(comm):
        out = np.zeros((comm.size, 2), np.int64)
        out[comm.rank] = [comm.rank, -comm.rank]
        comm.all_gather(out[comm.rank:comm.rank + 1], out=out, algorithm=algorithm)
        return out

    want = np.array([[r, -r] for r in range(size)])
    for got in colls.spawn(body, size, transport="local"):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("algorithm", colls.algorithms("scatter"))
def test_a_scatter_whose_roots_out_lies_over_its_input_sends_the_input_as_it_was(size, algorithm):
    """Found by review: the root's `out` over another rank's block of `x` used to be
    written with the root's own block before that block went out, so that rank got the root's."""

    def body(comm):
        got = []
        for root in (0, comm.size - 1):
            x = np.arange(4 * comm.size, dtype=np.int64)
            after = (root + 1) % comm.size   # the root's out is this rank's block of x
            out = x[4 * after:4 * after + 4] if comm.rank == root else np.empty(4, np.int64)
            got.append(comm.scatter(x, root=root, out=out, algorithm=algorithm).tolist())
        return got

    for rank, got in enumerate(colls.spawn(body, size, transport="shm", timeout=60)):
        assert got == [list(range(4 * rank, 4 * rank + 4))] * 2, (rank, got)


_VEC3 = np.dtype([("x", "<i4"), ("y", "<i4"), ("z", "<i4")])   # 12 bytes: no divisor of a slot's


def _vec3_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty_like(a)
    for field in _VEC3.names:
        out[field] = a[field] + b[field]
    return out


def _reduce_vec3(comm) -> list[str]:
    op = colls.Op(_vec3_add, commutative=True, name="vec3_add")
    wrong = []
    for count in (1000, 30000, 200_000):   # one slot, several slots, the rendezvous (read in pieces)
        x = np.zeros(count, _VEC3)
        x["x"], x["y"], x["z"] = np.arange(count) + comm.rank, 1, comm.rank
        want = {"x": comm.size * np.arange(count) + sum(range(comm.size)), "y": comm.size,
                "z": sum(range(comm.size))}
        for collective, algorithm in (("reduce", "direct"), ("reduce", "binomial"),
                                      ("all_reduce", "recursive_doubling"), ("all_reduce", "ring")):
            got = getattr(comm, collective)(x, op=op, algorithm=algorithm)
            if got is not None and not all((got[f] == want[f]).all() for f in _VEC3.names):
                wrong.append(f"{collective}/{algorithm}/{count}")
    return wrong


@pytest.mark.parametrize("mapped", ["1", "0"])
def test_a_reduction_of_elements_split_between_slots_is_whole(monkeypatch, mapped):
    """Found by review: the shm transport reduced each 256 KiB slot (and each piece read
    by cross-memory attach) as a whole number of elements, so a 12-byte dtype's reduction beyond one
    slot failed half-way with numpy's ValueError and left the message half-read for the next call."""
    monkeypatch.setenv("COLLS_SHM_MAPPED", mapped)
    assert colls.spawn(_reduce_vec3, 3, transport="shm", timeout=120) == [[], [], []]


def test_a_receive_reduces_chunks_cut_anywhere_as_whole_elements():
    """The shm receive's `take` on chunks cut at random bytes (one byte to several elements), as
    numpy reduces the whole message at once."""
    from transports.shm.fifo import In as _In

    rng = np.random.default_rng(5)
    for _ in range(50):
        count = int(rng.integers(1, 40))
        acc = np.zeros(count, _VEC3)
        acc["x"], acc["y"] = np.arange(count), -1
        incoming = np.zeros(count, _VEC3)
        incoming["x"], incoming["z"] = 7, np.arange(count) * 3
        want = _vec3_add(acc, incoming)
        request = _In(1, 0, acc, lambda a, b: a.__setitem__(slice(None), _vec3_add(a, b)))
        raw = incoming.view(np.uint8)
        cuts = np.sort(rng.choice(np.arange(1, raw.size), size=min(raw.size - 1, int(rng.integers(0, 8))),
                                  replace=False))
        for piece in np.split(raw, cuts):
            request.take(piece)
        assert request.pos == raw.size and acc.tobytes() == want.tobytes()


@pytest.mark.parametrize("size", [2, 3])
def test_an_all_gather_from_its_own_block_of_out_copies_nothing(size):
    """An in-place all_gather (the input is this rank's block of the output) used to copy its input
    first, as if it could be overwritten: 360 us against MPI's 55 for 1 MiB at 2 ranks. It now
    reads the block where it lies: the communicator's scratch is never made."""

    def body(comm):
        out = np.zeros((comm.size, 1000), np.float32)
        results = []
        for algorithm in (None, *colls.algorithms("all_gather")):
            out[comm.rank] = comm.rank + 1
            comm.all_gather(out[comm.rank], out=out.reshape(-1), algorithm=algorithm)
            comm.all_gather(out[comm.rank], out=out.reshape(-1))   # the planned path
            results.append(out.copy())
        return results, comm._scratch_bytes is None

    want = np.repeat(np.arange(1, size + 1, dtype=np.float32)[:, None], 1000, axis=1)
    for results, no_scratch in colls.spawn(body, size, transport="local"):
        assert no_scratch
        assert all(np.array_equal(got, want) for got in results)


@pytest.mark.parametrize("size", [2, 3])
def test_asynchronous_folding_calls_copy_their_input_at_issue(size):
    """reduce_scatter and reduce work on a copy of their input: a blocking call's in the
    communicator's scratch, made when it runs; an asynchronous call's at issue, so changing the
    input after issuing changes nothing. Rank 0 joins late, so the other ranks' calls are still
    queued behind a first one when their inputs change."""

    def body(comm):
        if comm.rank == 0:
            time.sleep(0.3)
        n = comm.size * 4
        x = np.arange(n, dtype=np.int64) + 10 * comm.rank
        before = x.copy()
        first = comm.all_reduce(np.ones(1), async_op=True)
        folded = comm.reduce_scatter(x, algorithm="ring", async_op=True)
        reduced = comm.reduce(x, root=0, algorithm="binomial", async_op=True)
        x[:] = -1   # after issue: must not show
        first.wait()
        return before, folded.wait(), reduced.wait()

    results = colls.spawn(body, size, transport="local")
    total = sum(before for before, *_ in results)
    for rank, (_, folded, reduced) in enumerate(results):
        assert np.array_equal(folded, total.reshape(size, -1)[rank])
        assert rank != 0 or np.array_equal(reduced, total)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_reduce_root_works_in_its_out(size):
    """The root reduces straight into a contiguous `out` (it used to reduce into a copy of x, then
    copy that into out): the result is out itself, x is left alone, and in place (out=x) and a
    strided out give the same sums."""

    def body(comm):
        x = np.arange(12, dtype=np.int64) * (comm.rank + 1)
        before = x.copy()
        results = []
        for algorithm in colls.algorithms("reduce"):
            out = np.full(12, -7, np.int64) if comm.rank == 0 else None
            got = comm.reduce(x, root=0, out=out, algorithm=algorithm)
            results.append((got is out, None if got is None else got.copy(), np.array_equal(x, before)))
            wide = np.full(24, -7, np.int64)
            strided = comm.reduce(x, root=0, out=wide[::2] if comm.rank == 0 else None, algorithm=algorithm)
            results.append((True, None if strided is None else strided.copy(), np.array_equal(x, before)))
            mine = x.copy()
            comm.reduce(mine, root=0, out=mine if comm.rank == 0 else None, algorithm=algorithm)
            results.append((True, mine if comm.rank == 0 else None, True))
        return results

    want = np.arange(12, dtype=np.int64) * sum(range(1, size + 1))
    for rank, results in enumerate(colls.spawn(body, size, transport="local")):
        for same, got, untouched in results:
            assert same and untouched
            assert (got is None) == (rank != 0)
            assert rank != 0 or np.array_equal(got, want)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_all_reduce_reading_its_input_in_place_leaves_it_alone(size, algorithm):
    """The ring and Rabenseifner read x where it lies (no copy into out first): x must come out
    untouched and every element of out written (it starts as NaN); an asynchronous call still
    copies x at issue, so changing x afterwards changes nothing. (Rank order through the fused
    reduction: test_catalogue's matrix operator, whose calls are out of place.)"""
    count = 1000 + size   # blocks of unequal length

    def body(comm):
        x = np.arange(count, dtype=np.float64) + 1000 * comm.rank
        before = x.copy()
        out = np.full(count, np.nan)
        comm.all_reduce(x, out=out, algorithm=algorithm)
        late = np.ones(count)
        work = comm.all_reduce(late, out=np.empty(count), algorithm=algorithm, async_op=True)
        late[:] = -5.0   # after issue: must not show
        return np.array_equal(x, before), out, work.wait()

    want = sum(np.arange(count, dtype=np.float64) + 1000 * r for r in range(size))
    for untouched, out, late in colls.spawn(body, size, transport="local"):
        assert untouched and np.array_equal(out, want)
        assert np.array_equal(late, np.full(count, float(size)))


def test_cma_address_of_matches_numpy_for_every_kind_of_buffer():
    """The shm transport's fast address lookup gives numpy's address for writable, read-only,
    offset and empty buffers alike (a wrong one would make cross-memory attach read the wrong bytes)."""
    from transports.cma import address_of

    base = np.arange(1000, dtype=np.float32)
    read_only = np.frombuffer(bytes(64), np.uint8)
    for buf in (base, base[17:400], base[:0], read_only, read_only[3:9]):
        assert address_of(buf) == buf.ctypes.data


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "ring", "rabenseifner"])
def test_op_subclasses_keep_their_own_finish_and_combine(algorithm):
    """The hot path skips `finish` for ops without one of their own and folds plain ufunc ops
    without `combine`: a subclass that brings its own `finish` or `combine` must still get them
    (and a user op changed between calls is checked again, not remembered)."""

    class Doubled(colls.Op):
        def finish(self, result, size):
            result *= 2

    class Subtracting(colls.Op):   # a ufunc op whose own combine (reversed difference) must be used
        def combine(self, left, right, out):
            np.subtract(right, left, out=out)

    doubled = Doubled(np.add, commutative=True, name="doubled")
    subtracting = Subtracting(np.add, commutative=False, name="subtracting")

    def body(comm):
        x = np.full(5, comm.rank + 1, np.int64)
        first = comm.all_reduce(x, op=doubled, algorithm=algorithm)
        algo = "recursive_doubling" if algorithm == "ring" else algorithm   # ring refuses non-commutative
        second = comm.all_reduce(x, op=subtracting, algorithm=algo)
        return first, second

    for first, second in colls.spawn(body, 2, transport="local"):
        assert np.array_equal(first, np.full(5, 2 * (1 + 2)))
        assert np.array_equal(second, np.full(5, 2 - 1))   # rank 0's ∘ rank 1's = 1 ∘ 2 = 2 - 1
