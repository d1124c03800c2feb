"""Bugs found by `colls fuzz` while the library was built, each kept as a test."""

from __future__ import annotations

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
