"""Deterministic inputs, numpy oracles and the wide correctness matrix shared by the collective tests.

Inputs are integer-valued (small ints, cast to the dtype), so every float or complex reduction of
them is exact and results can be compared bitwise with the oracle; an exact match on every rank also
proves the ranks hold identical bytes. `run_matrix(comm)` runs every collective over a spread of
dtypes, counts, roots, operators and output modes on one communicator and returns
`{"checks": N, "failures": [...]}` for this rank; the same function runs on threads (`local`),
forked processes (`shm`) and under mpiexec (`mpi`, or `shm` bootstrapped by MPI).
"""

from __future__ import annotations

import hashlib
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import colls

DTYPES = ("int8", "uint8", "int32", "int64", "uint64", "float16", "float32", "float64",
          "complex64", "complex128", "bool")
SMALL_COUNTS = (0, 1, 7, 1000)
BIG_COUNT = 2**20 + 3
BIG_DTYPES = ("float32", "int64", "uint8")
BIG_COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
OPS = {"SUM": colls.SUM, "PROD": colls.PROD, "MIN": colls.MIN, "MAX": colls.MAX, "AVG": colls.AVG,
       "BAND": colls.BAND, "BOR": colls.BOR, "BXOR": colls.BXOR}
UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
          "AVG": np.add, "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
               "all_to_all_v", "gather", "scatter")
SENTINEL_BYTE = 0xA5   # what a preallocated `out` holds before the call: never a valid result here


def valid_ops(dtype: str | np.dtype) -> list[str]:
    """The built-in operators that make sense on `dtype` (the others must raise TypeError)."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return ["SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if kind in "iu":
        return list(OPS)
    if kind == "f":
        return ["SUM", "PROD", "MIN", "MAX", "AVG"]
    return ["SUM", "PROD", "AVG"]   # complex


# -- inputs ----------------------------------------------------------------------------------------

def _code(text: str) -> int:
    return zlib.crc32(text.encode())


@lru_cache(maxsize=256)
def _cached_input(seed: int, rank: int, count: int, dtype: str, shape_tail: tuple[int, ...],
                  op: str | None) -> np.ndarray:
    dt = np.dtype(dtype)
    shape = (count, *shape_tail)
    n = int(np.prod(shape, dtype=np.int64))
    rng = np.random.default_rng([seed, rank, count, _code(dt.name), _code(op or "-"), *shape_tail])
    if dt.kind == "b":
        values = rng.integers(0, 2, n, dtype=np.uint8).astype(bool)
    elif op == "PROD":
        # products of these never overflow: {-1, 1}, {0, 1} unsigned, {±1, ±i} complex
        if dt.kind == "u":
            values = rng.integers(0, 2, n, dtype=np.int8).astype(dt)
        else:
            values = rng.choice(np.array([-1, 1], np.int8), n).astype(dt)
            if dt.kind == "c":
                values = values * np.where(rng.integers(0, 2, n, dtype=np.int8) == 1, 1j, 1).astype(dt)
    elif op in ("SUM", "AVG"):
        # sums of 16 ranks stay exact in int8 (|7·16| < 127), uint8 (15·16 < 255) and float16
        if dt.kind == "u":
            values = rng.integers(0, 16, n, dtype=np.int8).astype(dt)
        elif dt.kind == "i":
            values = rng.integers(-7, 8, n, dtype=np.int8).astype(dt)
        else:
            values = _float_ints(rng, n, dt, 64 if dt.itemsize <= 4 and dt.kind == "f" else 100)
    elif dt.kind in "iu":
        info = np.iinfo(dt)   # data movement, MIN/MAX and bitwise ops: the whole range
        values = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    else:
        values = _float_ints(rng, n, dt, 1000)
    array = np.ascontiguousarray(values.reshape(shape), dtype=dt)
    array.setflags(write=False)
    return array


def _float_ints(rng: np.random.Generator, n: int, dt: np.dtype, bound: int) -> np.ndarray:
    real = rng.integers(-bound, bound + 1, n, dtype=np.int16)
    if dt.kind == "c":
        return (real + 1j * rng.integers(-bound, bound + 1, n, dtype=np.int16)).astype(dt)
    return real.astype(dt)


def make_input(seed: int, rank: int, count: int, dtype: str | np.dtype, shape_tail: tuple[int, ...] = (),
               op: str | None = None) -> np.ndarray:
    """Rank `rank`'s integer-valued input of shape (count, *shape_tail); `op` picks a safe range."""
    return _cached_input(seed, rank, count, np.dtype(dtype).name, tuple(shape_tail), op).copy()


def v_rows(seed: int, rank: int, count: int) -> int:
    """How many rows rank `rank` sends in an all_to_all_v of nominal size `count` (0..count)."""
    return int(np.random.default_rng([seed, rank, count, 7]).integers(0, count + 1))


def v_counts(seed: int, rank: int, rows: int, size: int) -> list[int]:
    """An uneven split of `rows` into `size` send counts, zeros included, derived from the seed."""
    rng = np.random.default_rng([seed, rank, rows, size, 11])
    cuts = np.sort(rng.integers(0, rows + 1, size - 1))
    counts = np.diff(np.concatenate([[0], cuts, [rows]])).astype(int).tolist()
    if size > 2 and rows:
        counts[int(rng.integers(1, size))] += counts[0]   # make sure some peer gets nothing
        counts[0] = 0
    return counts


# -- oracles ---------------------------------------------------------------------------------------

def reduce_arrays(inputs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction of `inputs` (rank order) with built-in `op`, in the inputs' dtype."""
    dt = inputs[0].dtype
    size = len(inputs)
    if op == "AVG":
        if dt.kind in "iu":
            total = np.zeros(inputs[0].shape, np.int64)
            for x in inputs:
                total += x.astype(np.int64)
            quotient = np.abs(total) // size
            return np.where(total < 0, -quotient, quotient).astype(dt)   # C division: toward zero
        total = inputs[0].astype(np.complex128 if dt.kind == "c" else np.float64)
        for x in inputs[1:]:
            total = total + x   # exact: integer values
        if dt.kind == "c":
            # numpy's complex division by a real is not correctly rounded per part (complex64
            # -18/5 gives -3.6000001), so the oracle is numpy's own complex division in the dtype
            return np.divide(total.astype(dt), dt.type(size))
        return (total / size).astype(dt)   # correctly rounded in float64 = IEEE division in dt
    ufunc = UFUNCS[op]
    result = inputs[0].copy()
    for x in inputs[1:]:
        ufunc(result, x, out=result)
    return result


def oracle_all_reduce(inputs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """Every rank: the reduction of all inputs."""
    return reduce_arrays(inputs, op)


def oracle_broadcast(inputs: Sequence[np.ndarray], root: int) -> np.ndarray:
    """Every rank: the root's input."""
    return inputs[root].copy()


def oracle_reduce(inputs: Sequence[np.ndarray], op: str, root: int, rank: int) -> np.ndarray | None:
    """The root: the reduction; the others: None."""
    return reduce_arrays(inputs, op) if rank == root else None


def oracle_all_gather(inputs: Sequence[np.ndarray]) -> np.ndarray:
    """Every rank: the inputs concatenated along axis 0 in rank order."""
    return np.concatenate(inputs)


def oracle_reduce_scatter(inputs: Sequence[np.ndarray], op: str, rank: int) -> np.ndarray:
    """Rank r: block r (axis 0 in size equal blocks) of the reduction."""
    block = inputs[0].shape[0] // len(inputs)
    return reduce_arrays(inputs, op)[rank * block:(rank + 1) * block]


def oracle_all_to_all(inputs: Sequence[np.ndarray], rank: int) -> np.ndarray:
    """Rank r: block r of every rank's input, in rank order."""
    block = inputs[0].shape[0] // len(inputs)
    return np.concatenate([x[rank * block:(rank + 1) * block] for x in inputs])


def oracle_all_to_all_v(inputs: Sequence[np.ndarray], send_counts: Sequence[Sequence[int]],
                        rank: int) -> tuple[np.ndarray, list[int]]:
    """Rank r: (rows every rank j sent to r, in rank order; how many came from each j)."""
    pieces, received = [], []
    for x, counts in zip(inputs, send_counts, strict=True):
        start = sum(counts[:rank])
        pieces.append(x[start:start + counts[rank]])
        received.append(int(counts[rank]))
    return np.concatenate(pieces), received


def oracle_gather(inputs: Sequence[np.ndarray], root: int, rank: int) -> np.ndarray | None:
    """The root: the inputs concatenated in rank order; the others: None."""
    return np.concatenate(inputs) if rank == root else None


def oracle_scatter(inputs: Sequence[np.ndarray], root: int, rank: int) -> np.ndarray:
    """Rank r: block r of the root's input."""
    block = inputs[root].shape[0] // len(inputs)
    return inputs[root][rank * block:(rank + 1) * block].copy()


# -- one case --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One collective call: what, on which dtype and count, with which root, operator and output."""

    collective: str
    dtype: str
    count: int                      # rows per rank; per block for reduce_scatter/all_to_all/scatter
    op: str | None = None
    root: int | None = None
    mode: str = "new"               # new: out=None; out: preallocated out; inplace: out=x
    tail: tuple[int, ...] = ()
    algorithm: str | None = None

    def label(self) -> str:
        """Short text naming the case in failure messages."""
        parts = [self.collective, self.dtype, f"count={self.count}", f"mode={self.mode}"]
        for name in ("op", "root", "algorithm"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)}")
        if self.tail:
            parts.append(f"tail={self.tail}")
        return " ".join(parts)


def _rows(case: Case, size: int) -> int:
    if case.collective in ("reduce_scatter", "all_to_all", "scatter"):
        return case.count * size
    return case.count


def case_input(case: Case, seed: int, identity: int, size: int) -> tuple[np.ndarray, list[int] | None]:
    """This rank's input for `case` (and its send counts for all_to_all_v)."""
    if case.collective == "all_to_all_v":
        rows = v_rows(seed, identity, case.count)
        return make_input(seed, identity, rows, case.dtype, case.tail, None), v_counts(seed, identity,
                                                                                       rows, size)
    return make_input(seed, identity, _rows(case, size), case.dtype, case.tail, case.op), None


_oracle_lock = threading.Lock()


@lru_cache(maxsize=32)
def _cached_expected(case: Case, seed: int, identities: tuple[int, ...], rank: int):
    size = len(identities)
    made = [case_input(case, seed, identity, size) for identity in identities]
    inputs = [x for x, _ in made]
    c = case.collective
    if c == "all_reduce":
        return oracle_all_reduce(inputs, case.op)
    if c == "broadcast":
        return oracle_broadcast(inputs, case.root)
    if c == "reduce":
        return oracle_reduce(inputs, case.op, case.root, rank)
    if c == "all_gather":
        return oracle_all_gather(inputs)
    if c == "reduce_scatter":
        return oracle_reduce_scatter(inputs, case.op, rank)
    if c == "all_to_all":
        return oracle_all_to_all(inputs, rank)
    if c == "all_to_all_v":
        return oracle_all_to_all_v(inputs, [counts for _, counts in made], rank)
    if c == "gather":
        return oracle_gather(inputs, case.root, rank)
    if c == "scatter":
        return oracle_scatter(inputs, case.root, rank)
    raise ValueError(c)


def expected(case: Case, seed: int, identities: Sequence[int], rank: int):
    """The oracle's answer for rank `rank` of the group whose ranks have input identities `identities`.

    Reduced results do not depend on the rank, so they are computed once per case (and shared by
    all thread ranks of a `local` group).
    """
    key_rank = rank if case.collective not in ("all_reduce", "broadcast", "all_gather") else -1
    if case.collective in ("reduce", "gather"):
        key_rank = rank if rank == case.root else -2
    with _oracle_lock:
        return _cached_expected(case, seed, tuple(identities), key_rank)


def describe_difference(got: object, want: np.ndarray | None) -> str | None:
    """None if `got` is bitwise `want` (same dtype and shape), else what differs."""
    if want is None:
        return None if got is None else f"expected None, got {type(got).__name__}"
    if not isinstance(got, np.ndarray):
        return f"expected an array, got {type(got).__name__}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes():
        return None
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    if flat_got.dtype.kind in "fc":
        wrong = np.flatnonzero(~((flat_got == flat_want) & (np.signbit(flat_got.real)
                                                             == np.signbit(flat_want.real))))
    else:
        wrong = np.flatnonzero(flat_got != flat_want)
    if wrong.size == 0:
        return "same values but different bytes"
    first = int(wrong[0])
    return (f"{wrong.size} of {flat_want.size} elements differ; first at flat index {first}: "
            f"got {flat_got[first]!r}, expected {flat_want[first]!r}")


class Checker:
    """Counts checks, collects failures, and hashes results that must be identical on every rank."""

    def __init__(self, rank: int, world: object = None) -> None:
        self.rank = rank
        self.world = world   # only this communicator's results go into the cross-rank digest
        self.checks = 0
        self.failures: list[str] = []
        self.digest = hashlib.sha1()

    def expect(self, label: str, got: object, want: np.ndarray | None, same_everywhere: bool = False,
               signed_zeros: bool = False) -> None:
        """Record one comparison with the oracle (`signed_zeros`: -0.0 may stand for 0.0)."""
        self.checks += 1
        problem = describe_difference(got, want)
        if problem and signed_zeros and isinstance(got, np.ndarray) and got.shape == want.shape \
                and got.dtype == want.dtype and np.array_equal(got, want):
            problem = None
        if problem:
            self.failures.append(f"rank {self.rank}: {label}: {problem}")
        if same_everywhere and isinstance(got, np.ndarray):
            self.digest.update(label.encode())
            self.digest.update(np.ascontiguousarray(got).tobytes())

    def truth(self, label: str, ok: bool, what: str) -> None:
        """Record one yes/no check."""
        self.checks += 1
        if not ok:
            self.failures.append(f"rank {self.rank}: {label}: {what}")

    def summary(self) -> dict[str, object]:
        """{checks, failures} for this rank."""
        return {"checks": self.checks, "failures": list(self.failures)}


class Abort(Exception):
    """A call raised: the ranks may now disagree on what comes next, so the matrix stops."""


def _fill_sentinel(out: np.ndarray) -> np.ndarray:
    """Fill a preallocated output with bytes no correct result holds (bool 0xA5 is not even valid)."""
    out.view(np.uint8).fill(SENTINEL_BYTE)
    return out


def issue(comm, case: Case, seed: int, identities: Sequence[int], async_op: bool = False):
    """Post `case` on `comm`; returns (result or Work, the input, a pristine copy, the out passed)."""
    rank, size = comm.rank, comm.size
    x, counts = case_input(case, seed, identities[rank], size)
    pristine = x.copy()
    kw: dict[str, object] = {"async_op": async_op}
    if case.algorithm is not None:
        kw["algorithm"] = case.algorithm
    op = OPS[case.op] if case.op else None
    c = case.collective
    want_shape = None
    if c in ("all_reduce", "broadcast", "reduce"):
        want_shape = x.shape
    elif c in ("all_gather", "gather"):
        want_shape = (size * x.shape[0], *x.shape[1:])
    elif c in ("reduce_scatter", "all_to_all", "scatter"):
        want_shape = x.shape if c == "all_to_all" else (x.shape[0] // size, *x.shape[1:])
    out = None
    if case.mode == "inplace":
        out = x
        if c == "broadcast" and rank != case.root:
            _fill_sentinel(x)
    elif case.mode == "out" and want_shape is not None and not (c == "gather" and rank != case.root):
        out = _fill_sentinel(np.empty(want_shape, x.dtype))
    if c == "all_reduce":
        result = comm.all_reduce(x, op=op, out=out, **kw)
    elif c == "broadcast":
        result = comm.broadcast(x, root=case.root, out=out, **kw)
    elif c == "reduce":
        result = comm.reduce(x, root=case.root, op=op, out=out, **kw)
    elif c == "all_gather":
        result = comm.all_gather(x, out=out, **kw)
    elif c == "reduce_scatter":
        result = comm.reduce_scatter(x, op=op, out=out, **kw)
    elif c == "all_to_all":
        result = comm.all_to_all(x, out=out, **kw)
    elif c == "all_to_all_v":
        result = comm.all_to_all_v(x, counts, **kw)
    elif c == "gather":
        result = comm.gather(x, root=case.root, out=out, **kw)
    elif c == "scatter":
        if case.mode == "out" and rank != case.root:
            result = comm.scatter(None, root=case.root, out=out, **kw)   # the out-only form
        else:
            result = comm.scatter(x, root=case.root, out=out, **kw)
    else:
        raise ValueError(c)
    return result, x, pristine, out


def verify(checker: Checker, comm, case: Case, seed: int, identities: Sequence[int], result, x,
           pristine, out) -> None:
    """Compare one finished call with the oracle, and check `out`, in-place and untouched inputs."""
    label = case.label()
    want = expected(case, seed, identities, comm.rank)
    if case.collective == "all_to_all_v":
        got, recv_counts = result
        want, want_counts = want
        checker.truth(label, list(recv_counts) == want_counts,
                      f"recv_counts {list(recv_counts)}, expected {want_counts}")
        checker.expect(label, got, want)
        return
    same = case.collective in ("all_reduce", "broadcast", "all_gather") and comm is checker.world
    # a commutative PROD of complex numbers with zero parts may sign those zeros by operand order
    signed_zeros = case.op == "PROD" and np.dtype(case.dtype).kind == "c"
    checker.expect(label, result, want, same_everywhere=same, signed_zeros=signed_zeros)
    if out is not None and result is not None:
        checker.truth(label, result is out, "the returned array is not the `out` passed")
    if case.mode != "inplace":
        checker.truth(label, x.tobytes() == pristine.tobytes(), "the input array was modified")


def run_case(checker: Checker, comm, case: Case, seed: int, identities: Sequence[int] | None = None) -> None:
    """Run one blocking case and check it; a raising call becomes a failure and aborts the matrix."""
    identities = list(range(comm.size)) if identities is None else list(identities)
    try:
        result, x, pristine, out = issue(comm, case, seed, identities)
    except Exception as error:
        checker.failures.append(f"rank {comm.rank}: {case.label()}: raised {error!r}\n"
                                f"{traceback.format_exc()}")
        raise Abort(case.label()) from error
    verify(checker, comm, case, seed, identities, result, x, pristine, out)


# -- the matrix ------------------------------------------------------------------------------------

def small_cases(size: int, dtypes: Sequence[str], counts: Sequence[int]) -> list[Case]:
    """Every collective × dtype × count, with operators, roots and output modes spread over them."""
    roots = sorted({0, size - 1, size // 2, 1 % size})
    cases: list[Case] = []
    turn = 0
    for dtype in dtypes:
        ops = valid_ops(dtype)
        for count in counts:
            for i, op in enumerate(ops):
                modes = ("new", "out", "inplace") if op == "SUM" else (("new", "out", "inplace")[i % 3],)
                cases += [Case("all_reduce", dtype, count, op=op, mode=m) for m in modes]
            for mode in ("new", "out", "inplace"):
                cases.append(Case("broadcast", dtype, count, root=roots[turn % len(roots)], mode=mode))
                turn += 1
            for i, op in enumerate(ops[::2]):
                cases.append(Case("reduce", dtype, count, op=op, root=roots[turn % len(roots)],
                                  mode=("new", "out")[i % 2]))
                turn += 1
            cases += [Case("all_gather", dtype, count, mode=m) for m in ("new", "out")]
            cases.append(Case("reduce_scatter", dtype, count, op="SUM", mode="new"))
            cases.append(Case("reduce_scatter", dtype, count, op=ops[(turn % (len(ops) - 1)) + 1],
                              mode="out"))
            cases += [Case("all_to_all", dtype, count, mode=m) for m in ("new", "out")]
            cases.append(Case("all_to_all_v", dtype, count))
            for mode in ("new", "out"):
                cases.append(Case("gather", dtype, count, root=roots[turn % len(roots)], mode=mode))
                turn += 1
                cases.append(Case("scatter", dtype, count, root=roots[turn % len(roots)], mode=mode))
                turn += 1
    return cases


def big_cases(size: int, count: int, dtypes: Sequence[str], collectives: Sequence[str]) -> list[Case]:
    """About `count` elements per rank for each of `collectives`, on `dtypes`."""
    per_rank = count // size + 1   # gather-type and divisible collectives: about `count` in total
    cases = []
    for dtype in dtypes:
        for c in collectives:
            if c == "all_reduce":
                cases += [Case(c, dtype, count, op="SUM", mode="new"),
                          Case(c, dtype, count, op="MAX", mode="inplace")]
            elif c == "broadcast":
                cases.append(Case(c, dtype, count, root=size - 1, mode="out"))
            elif c == "reduce":
                cases.append(Case(c, dtype, count, op="SUM", root=size // 2))
            elif c in ("reduce_scatter",):
                cases.append(Case(c, dtype, per_rank, op="SUM"))
            else:
                cases.append(Case(c, dtype, per_rank, root=0 if c in ("gather", "scatter") else None))
    return cases


def shaped_cases(size: int) -> list[Case]:
    """Rows of shape (3,) (and (2, 2)) for the collectives that work along axis 0."""
    cases = []
    for dtype, count in (("float64", 5), ("int32", 1), ("complex64", 0), ("uint8", 33)):
        for tail in ((3,), (2, 2)):
            cases += [Case("all_gather", dtype, count, tail=tail, mode="out"),
                      Case("gather", dtype, count, tail=tail, root=size - 1),
                      Case("scatter", dtype, count, tail=tail, root=size // 2, mode="out"),
                      Case("all_to_all", dtype, count, tail=tail),
                      Case("all_to_all_v", dtype, count, tail=tail),
                      Case("reduce_scatter", dtype, count, tail=tail, op="SUM"),
                      Case("broadcast", dtype, count, tail=tail, root=size - 1, mode="inplace"),
                      Case("all_reduce", dtype, count, tail=tail, op="PROD", mode="out")]
    return cases


def algorithm_cases(size: int) -> list[Case]:
    """Each registered algorithm of each collective, forced by name, on a few counts; 70001 float64
    (547 KiB) spans several 256 KiB pipeline pieces."""
    cases = []
    for c in COLLECTIVES:
        for name in colls.algorithms(c):
            medium = 70001 if c in ("all_reduce", "broadcast", "reduce") else 70001 // size + 1
            for dtype, count in (("float32", 0), ("int32", 7), ("float64", 1000), ("float64", medium)):
                op = "SUM" if c in REDUCING else None
                root = size - 1 if c in ("broadcast", "reduce", "gather", "scatter") else None
                cases.append(Case(c, dtype, count, op=op, root=root, algorithm=name))
    return cases


def run_async(checker: Checker, comm, seed: int) -> None:
    """Several calls issued with async_op=True, then waited on in reverse order, then a blocking one."""
    size = comm.size
    identities = list(range(size))
    batch = [Case("all_reduce", "float32", 1000, op="SUM"),
             Case("broadcast", "int64", 7, root=size - 1, mode="inplace"),
             Case("all_gather", "uint8", 33, mode="out"),
             Case("reduce_scatter", "int32", 5, op="MAX"),
             Case("all_to_all", "float64", 3),
             Case("all_to_all_v", "int16", 9),
             Case("reduce", "complex128", 4, op="SUM", root=0),
             Case("gather", "int8", 2, root=size // 2),
             Case("scatter", "float16", 2, root=size - 1),
             Case("all_reduce", "int64", 2**16, op="BXOR", mode="inplace")]
    try:
        posted = [(case, issue(comm, case, seed, identities, async_op=True)) for case in batch]
        finished = [(case, (work.wait(), x, pristine, out)) for case, (work, x, pristine, out)
                    in reversed(posted)]
        tail_case = Case("all_reduce", "float64", 7, op="SUM")
        after = issue(comm, tail_case, seed, identities)   # blocking, behind nothing now
    except Exception as error:
        checker.failures.append(f"rank {comm.rank}: async batch raised {error!r}\n{traceback.format_exc()}")
        raise Abort("async") from error
    for case, outcome in finished:
        verify(checker, comm, case, seed, identities, *outcome)
    verify(checker, comm, tail_case, seed, identities, *after)


def run_splits(checker: Checker, comm, seed: int) -> None:
    """split by rank % 2, a reversed key, and a color=None rank; collectives on each sub-group."""
    rank, size = comm.rank, comm.size
    try:
        parity = comm.split(rank % 2)
        members = [r for r in range(size) if r % 2 == rank % 2]
        checker.truth("split(rank % 2)", parity is not None and parity.size == len(members)
                      and parity.rank == members.index(rank), "wrong size or rank")
        for case in (Case("all_reduce", "int64", 7, op="SUM"), Case("broadcast", "float32", 5,
                     root=parity.size - 1), Case("all_gather", "int8", 3), Case("reduce", "float64", 4,
                     op="PROD", root=0), Case("all_to_all_v", "uint8", 6)):
            run_case(checker, parity, case, seed, members)
        # a nested split of the sub-group, then back to the parent
        nested = parity.split(0, key=-parity.rank)
        run_case(checker, nested, Case("all_gather", "int32", 2), seed, list(reversed(members)))
        reverse = comm.split(0, key=size - rank)
        checker.truth("split(0, key=size-rank)", reverse.rank == size - 1 - rank, f"rank {reverse.rank}")
        run_case(checker, reverse, Case("gather", "int32", 3, root=0), seed, list(range(size))[::-1])
        left_out = comm.split(None if rank == 0 else 1)
        checker.truth("split(None)", (left_out is None) == (rank == 0),
                      f"got {left_out!r} on rank {rank}")
        if left_out is not None:
            run_case(checker, left_out, Case("all_reduce", "float64", 9, op="SUM"), seed,
                     list(range(1, size)))
            left_out.close()
        run_case(checker, comm, Case("all_reduce", "int32", 3, op="SUM"), seed)   # parent still fine
        for sub in (nested, parity, reverse):
            sub.close()
    except Abort:
        raise
    except Exception as error:
        checker.failures.append(f"rank {rank}: split raised {error!r}\n{traceback.format_exc()}")
        raise Abort("split") from error


def run_point_to_point(checker: Checker, comm, seed: int, out_of_order: bool = True) -> None:
    """Ring exchanges with user tags: parity-ordered blocking calls (safe without buffering), then
    `async_op` sends of tag 1 and tag 2 received as tag 2 first. Every rank makes the same calls."""
    rank, size = comm.rank, comm.size
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    try:
        for tag, count in ((0, 7), (5, 1000), (2**29 - 1, 0)):   # 2**29 - 1: MPICH's TAG_UB
            mine = make_input(seed, rank, count, "float64")
            got = np.empty_like(mine)
            if rank % 2 == 0:
                comm.send(mine, right, tag=tag)
                comm.recv(got, left, tag=tag)
            else:
                comm.recv(got, left, tag=tag)
                comm.send(mine, right, tag=tag)
            checker.expect(f"ring send/recv tag {tag} count {count}", got,
                           make_input(seed, left, count, "float64"))
        if out_of_order:
            first, second = make_input(seed, rank, 5, "int32"), make_input(seed, rank, 6, "int32")
            works = [comm.send(first, right, tag=1, async_op=True),
                     comm.send(second, right, tag=2, async_op=True)]
            got_second, got_first = np.empty(6, np.int32), np.empty(5, np.int32)
            comm.recv(got_second, left, tag=2)   # the later tag first
            comm.recv(got_first, left, tag=1)
            for work in reversed(works):
                work.wait()
            checker.expect("recv tag 2 before tag 1", got_second, make_input(seed, left, 6, "int32"))
            checker.expect("recv tag 1 after tag 2", got_first, make_input(seed, left, 5, "int32"))
    except Exception as error:
        checker.failures.append(f"rank {rank}: point-to-point raised {error!r}\n{traceback.format_exc()}")
        raise Abort("p2p") from error


def run_barriers(checker: Checker, comm) -> None:
    """No rank leaves a barrier before the last one entered (CLOCK_MONOTONIC is machine-wide)."""
    try:
        for algorithm in (None, *colls.algorithms("barrier")):
            late = (comm.size - 1) if algorithm is None else 0
            if comm.rank == late:
                time.sleep(0.05)
            entered = time.monotonic()
            comm.barrier(algorithm=algorithm)
            left = time.monotonic()
            table = comm.all_gather(np.array([[entered, left]]))
            checker.truth(f"barrier algorithm={algorithm}", table[:, 1].min() >= table[:, 0].max(),
                          f"a rank left at {table[:, 1].min():.6f} before rank "
                          f"{int(table[:, 0].argmax())} entered at {table[:, 0].max():.6f}")
    except Exception as error:
        checker.failures.append(f"rank {comm.rank}: barrier raised {error!r}\n{traceback.format_exc()}")
        raise Abort("barrier") from error


def run_matrix(comm, seed: int = 0, dtypes: Sequence[str] = DTYPES, counts: Sequence[int] = SMALL_COUNTS,
               big_count: int = BIG_COUNT, big_dtypes: Sequence[str] = BIG_DTYPES,
               big_collectives: Sequence[str] = BIG_COLLECTIVES, extras: bool = True,
               out_of_order: bool = True) -> dict[str, object]:
    """Run the whole matrix on `comm` (every rank calls it alike); {checks, failures} of this rank.

    `extras` adds multi-dimensional rows, forced algorithms, barriers, async batches, splits and
    point-to-point; `out_of_order` the tag-order exchange that needs non-blocking sends.
    """
    size = comm.size
    checker = Checker(comm.rank, comm)
    cases = small_cases(size, dtypes, counts) + big_cases(size, big_count, big_dtypes, big_collectives)
    if extras:
        cases += shaped_cases(size) + algorithm_cases(size)
    steps: list[Callable[[], None]] = [
        lambda case=case: run_case(checker, comm, case, seed) for case in cases]
    if extras:
        steps += [lambda: run_barriers(checker, comm), lambda: run_async(checker, comm, seed),
                  lambda: run_splits(checker, comm, seed),
                  lambda: run_point_to_point(checker, comm, seed, out_of_order)]
    try:
        for step in steps:
            step()
        # every rank hashed the results that must be identical everywhere: compare the digests
        digest = np.frombuffer(checker.digest.digest(), np.uint8).reshape(1, -1)
        table = comm.all_gather(digest)
        checker.truth("digest of all_reduce/broadcast/all_gather results", bool((table == table[0]).all()),
                      f"ranks disagree: {[row.tobytes().hex()[:8] for row in table]}")
    except Abort:
        pass
    return checker.summary()


def gather_failures(comm, summary: dict[str, object]) -> tuple[int, list[str]]:
    """(total checks, every rank's failures) on every rank, via all_gather of padded bytes."""
    text = "\n\x00".join(summary["failures"]).encode()   # type: ignore[arg-type]
    lengths = comm.all_gather(np.array([len(text), summary["checks"]], np.int64).reshape(1, 2))
    padded = np.zeros(max(1, int(lengths[:, 0].max())), np.uint8)
    padded[:len(text)] = np.frombuffer(text, np.uint8)
    table = comm.all_gather(padded.reshape(1, -1))
    failures: list[str] = []
    for r in range(comm.size):
        chunk = table[r, :lengths[r, 0]].tobytes().decode()
        failures += [f for f in chunk.split("\n\x00") if f]
    return int(lengths[:, 1].sum()), failures


def finite_difference_gradient(model, flat: np.ndarray, tokens: np.ndarray, targets: np.ndarray,
                               step: float = 1e-6) -> np.ndarray:
    """Central differences of `model`'s loss in every parameter: the reference for a backward pass."""
    numeric = np.empty_like(flat)
    for i in range(flat.size):
        plus, minus = flat.copy(), flat.copy()
        plus[i] += step
        minus[i] -= step
        numeric[i] = (model.loss_and_grad(plus, tokens, targets)[0]
                      - model.loss_and_grad(minus, tokens, targets)[0]) / (2 * step)
    return numeric
