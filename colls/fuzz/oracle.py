"""The fuzzer's numpy oracle: every rank's input from the seed, the expected result, an exact check.

Inputs are chosen so that every reduction is exact in its dtype whatever the order of evaluation:
integers wrap (a ring, so any order gives the same bytes), floats hold small integers or powers of
two, and data movement uses arbitrary bytes (NaN payloads included). So results are compared
bitwise, and a rank whose bytes differ from its peers' differs from the oracle too. A 2x2 integer
matrix product is the non-commutative operator that catches operands folded in the wrong order.
The printed reproduction snippets call these same functions.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from algorithms import BUILTIN, Op

MATRIX = np.dtype([("m", np.int64, (2, 2))])
DTYPES = ("int32", "float32", "int8", "uint8", "int64", "uint64", "float16", "float64",
          "complex64", "complex128", "bool", "matrix")
SENTINEL_BYTE = 0xA5   # what a preallocated `out` holds before the call
# Inputs longer than this repeat with this period: drawing every element of every rank's MiBs on
# every rank would cost more than the collective. The period is prime, so no block, chunk or pipeline
# piece (all powers of two or near-equal splits) lines up with it and a misplaced one still shows.
PERIOD = 65521


def matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Elementwise 2x2 integer matrix product: associative (it wraps in int64), not commutative."""
    result = np.empty(left.shape, MATRIX)
    result["m"] = left["m"] @ right["m"]
    return result


MATMUL = Op(matmul, commutative=False, name="MATMUL")
OPS: dict[str, Op] = {**BUILTIN, "MATMUL": MATMUL}
_UFUNCS = {"SUM": np.add, "AVG": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
           "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def dtype_of(name: str) -> np.dtype:
    """The numpy dtype for a fuzzer dtype name ("matrix" is the 2x2 int64 matrix)."""
    return MATRIX if name == "matrix" else np.dtype(name)


def valid_ops(dtype: str) -> list[str]:
    """The operators the fuzzer may pair with `dtype` (SUM first, so shrinking lands on it)."""
    kind = dtype_of(dtype).kind
    if dtype == "matrix":
        return ["MATMUL"]
    if kind == "b":
        return ["SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    if kind in "iu":
        return ["SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]
    if kind == "f":
        return ["SUM", "PROD", "MIN", "MAX", "AVG"]
    return ["SUM", "PROD", "AVG"]


# -- inputs ----------------------------------------------------------------------------------------

def make_input(seed: int, step: int, rank: int, rows: int, dtype: str, tail: Sequence[int] = (),
               op: str | None = None) -> np.ndarray:
    """Rank `rank`'s input of shape (rows, *tail) for step `step` of the program with `seed`."""
    dt = dtype_of(dtype)
    shape = (rows, *tail)
    total = int(np.prod(shape, dtype=np.int64))
    n = min(total, PERIOD)
    rng = np.random.default_rng([seed, step, rank, 1])
    if dtype == "matrix":
        values = np.empty(n, MATRIX)
        values["m"] = rng.integers(-2, 3, (n, 2, 2))
    elif dt.kind == "b":
        values = rng.integers(0, 2, n, dtype=np.uint8).astype(bool)
    elif op is None or (dt.kind in "iu" and op != "AVG"):
        # data movement, and integer ops that wrap: any bytes at all
        values = np.frombuffer(rng.bytes(n * dt.itemsize), dt).copy()
        if op == "PROD":
            values |= 1   # odd factors, so that products do not collapse to zero
    elif dt.kind in "iu":
        values = rng.integers(-7 if dt.kind == "i" else 0, 8 if dt.kind == "i" else 16, n).astype(dt)
    elif op == "PROD":
        # powers of two, and for complex a unit times 1+2i, whose powers never have a zero part: a
        # zero part could come out as -0.0 or +0.0 depending on the order of evaluation
        choices = np.array([1 + 2j, -1 - 2j, -2 + 1j, 2 - 1j] if dt.kind == "c" else
                           [1, -1, 0.5, -0.5] if dt.itemsize == 2 else [1, -1, 0.5, -0.5, 2, -2])
        values = rng.choice(choices, n).astype(dt)
    else:
        # SUM, AVG (small integers: exact sums of up to 16 ranks even in float16), MIN and MAX
        bound = 64 if dt.itemsize <= 4 and dt.kind == "f" else 100
        if op in ("MIN", "MAX"):
            bound = 1000
        values = rng.integers(-bound, bound + 1, n).astype(dt)
        if dt.kind == "c":
            values = values + 1j * rng.integers(-bound, bound + 1, n).astype(dt)
    values = values.astype(dt, copy=False)
    return (np.resize(values, total) if total > n else values).reshape(shape)


def v_rows(seed: int, step: int, rank: int, rows: int) -> int:
    """How many rows rank `rank` sends in an all_to_all_v of nominal `rows`: 0 to 2 x rows."""
    return int(np.random.default_rng([seed, step, rank, 2]).integers(0, 2 * rows + 1))


def split_counts(seed: int, step: int, rank: int, rows: int, size: int) -> list[int]:
    """An uneven split of `rows` into `size` send counts, often with zeros, from the seed."""
    rng = np.random.default_rng([seed, step, rank, 3])
    cuts = np.sort(rng.integers(0, rows + 1, size - 1))
    counts = np.diff(np.concatenate([[0], cuts, [rows]])).astype(int).tolist()
    if size > 2 and rows and rng.integers(0, 2):
        victim = int(rng.integers(0, size))   # some peer gets nothing at all
        counts[(victim + 1) % size] += counts[victim]
        counts[victim] = 0
    return counts


_cache_lock = threading.Lock()


@lru_cache(maxsize=4)
def _inputs(seed: int, step: int, size: int, collective: str, rows: int, dtype: str,
            tail: tuple[int, ...], op: str | None) -> tuple[np.ndarray, ...]:
    made = []
    for rank in range(size):
        if collective == "all_to_all_v":
            mine = v_rows(seed, step, rank, rows)
        elif collective in ("reduce_scatter", "all_to_all", "scatter"):
            mine = rows * size   # `rows` per block
        else:
            mine = rows
        array = make_input(seed, step, rank, mine, dtype, tail, op)
        array.setflags(write=False)
        made.append(array)
    return tuple(made)


def inputs(seed: int, step: int, size: int, collective: str, rows: int, dtype: str = "int32",
           tail: Sequence[int] = (), op: str | None = None) -> list[np.ndarray]:
    """Every rank's (read-only) input for one step, in group-rank order; rank r passes a copy of [r]."""
    with _cache_lock:   # thread ranks of one process share the work
        return list(_inputs(seed, step, size, collective, rows, dtype, tuple(tail), op))


def send_counts(seed: int, step: int, xs: Sequence[np.ndarray]) -> list[list[int]]:
    """Every rank's all_to_all_v send counts for inputs `xs` (one list per rank)."""
    return [split_counts(seed, step, rank, x.shape[0], len(xs)) for rank, x in enumerate(xs)]


# -- expected results ------------------------------------------------------------------------------

_reductions: list[tuple[tuple[np.ndarray, ...], str, np.ndarray]] = []   # the last few, newest last


def reduced(xs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction of `xs` in rank order (rank 0's operand leftmost), in their dtype (read-only)."""
    with _cache_lock:   # thread ranks of one group ask for the same one: compute it once
        for known, known_op, result in _reductions:
            if known_op == op and len(known) == len(xs) and all(map(_same_object, known, xs)):
                return result
    result = _reduce(xs, op)
    result.setflags(write=False)
    with _cache_lock:
        _reductions.append((tuple(xs), op, result))
        del _reductions[:-4]
    return result


def _same_object(a: object, b: object) -> bool:
    return a is b


def _reduce(xs: Sequence[np.ndarray], op: str) -> np.ndarray:
    dt, size = xs[0].dtype, len(xs)
    if op == "MATMUL":
        result = xs[0].copy()
        for x in xs[1:]:
            result = matmul(result, x)
    elif op == "AVG" and dt.kind in "iu":
        total = np.zeros(xs[0].shape, np.int64)
        for x in xs:
            total += x.astype(np.int64)
        quotient = np.abs(total) // size
        result = np.where(total < 0, -quotient, quotient).astype(dt)   # C division: toward zero
    elif op == "AVG":
        total = xs[0].astype(np.complex128 if dt.kind == "c" else np.float64)
        for x in xs[1:]:
            total = total + x   # exact: integer values
        # complex division is not correctly rounded per part, so divide as the library does, in dt
        result = np.divide(total.astype(dt), dt.type(size)) if dt.kind == "c" else (total / size).astype(dt)
    else:
        result = xs[0].copy()
        for x in xs[1:]:
            _UFUNCS[op](result, x, out=result)
    return result


def expected(collective: str, xs: Sequence[np.ndarray], rank: int, op: str | None = None,
             root: int = 0, counts: Sequence[Sequence[int]] | None = None):
    """What rank `rank` must get from `collective` over inputs `xs` (None where it gets nothing)."""
    size = len(xs)
    if collective == "barrier":
        return None
    if collective == "all_reduce":
        return reduced(xs, op)
    if collective == "broadcast":
        return xs[root]
    if collective == "reduce":
        return reduced(xs, op) if rank == root else None
    if collective in ("all_gather", "gather"):
        return np.concatenate(xs) if collective == "all_gather" or rank == root else None
    block = xs[0].shape[0] // size if size else 0
    if collective == "reduce_scatter":
        return reduced(xs, op)[rank * block:(rank + 1) * block]
    if collective == "all_to_all":
        return np.concatenate([x[rank * block:(rank + 1) * block] for x in xs])
    if collective == "scatter":
        return xs[root][rank * block:(rank + 1) * block]
    if collective == "all_to_all_v":
        assert counts is not None
        pieces = [x[sum(c[:rank]):sum(c[:rank]) + c[rank]] for x, c in zip(xs, counts, strict=True)]
        return np.concatenate(pieces), [int(c[rank]) for c in counts]
    raise ValueError(f"no oracle for {collective!r}")


def same_everywhere(collective: str) -> bool:
    """Whether every rank of the group must hold the very same result bytes."""
    return collective in ("all_reduce", "broadcast", "all_gather")


# -- checking --------------------------------------------------------------------------------------

def sentinel_like(want: np.ndarray) -> np.ndarray:
    """An `out` array of `want`'s shape and dtype holding bytes no correct result holds."""
    out = np.empty(want.shape, want.dtype)
    out.reshape(-1).view(np.uint8).fill(SENTINEL_BYTE)
    return out


def difference(got: object, want: object) -> str | None:
    """None if `got` is bitwise `want` (same type, dtype and shape), else what differs."""
    if isinstance(want, tuple):   # all_to_all_v: (rows, recv_counts)
        if not isinstance(got, tuple) or len(got) != 2:
            return f"expected (array, recv_counts), got {type(got).__name__}"
        if list(got[1]) != want[1]:
            return f"recv_counts {list(got[1])}, expected {want[1]}"
        return difference(got[0], want[0])
    if want is None:
        return None if got is None else f"expected None, got {type(got).__name__}"
    if not isinstance(got, np.ndarray):
        return f"expected an array, got {type(got).__name__}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    got_bytes = np.ascontiguousarray(got).view(np.uint8).reshape(-1, want.dtype.itemsize or 1)
    want_bytes = np.ascontiguousarray(want).view(np.uint8).reshape(-1, want.dtype.itemsize or 1)
    wrong = np.flatnonzero((got_bytes != want_bytes).any(axis=1))
    if wrong.size == 0:
        return None
    first = int(wrong[0])
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    return (f"{wrong.size} of {flat_want.size} elements differ; first at flat index {first}: "
            f"got {flat_got[first]!r}, expected {flat_want[first]!r}")


def call_problem(got: object, want: object, given: np.ndarray | None = None,
                 original: np.ndarray | None = None, out: np.ndarray | None = None) -> str | None:
    """What is wrong with one call, or None: its result must be bitwise `want`, be the `out` it was
    given (if any), and leave its input `given` as `original` (unless it worked in place)."""
    problem = difference(got, want)
    if problem is None and out is not None and want is not None and got is not out:
        problem = "returned a new array instead of the `out` it was given"
    if problem is None and given is not None and original is not None and given is not out \
            and difference(given, original) is not None:
        problem = "modified its input"
    return problem


def verify(what: str, got: object, want: object, given: np.ndarray | None = None,
           original: np.ndarray | None = None, out: np.ndarray | None = None) -> None:
    """Raise AssertionError naming `what` if `call_problem` finds anything."""
    problem = call_problem(got, want, given, original, out)
    if problem:
        raise AssertionError(f"{what}: {problem}")


def digest(result: object) -> str:
    """A short hash of a result's bytes, to compare across ranks."""
    if isinstance(result, tuple):
        result = result[0]
    if not isinstance(result, np.ndarray):
        return "-"
    return hashlib.blake2b(np.ascontiguousarray(result).view(np.uint8).data, digest_size=8).hexdigest()
