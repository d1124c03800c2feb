"""Bad arguments fail on the rank that passed them, before any byte moves, with a message naming the
argument and the rank; odd but valid arguments (strided views, Fortran order, strided `out`) give
the right answer; a non-commutative user operator keeps rank order or is refused clearly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
import reference

import colls

TIMEOUT_S = 20.0
MATRIX = np.dtype([("m", np.int64, (2, 2))])


def spawn(fn, size: int, transport: str = "local", args: tuple = ()) -> list:
    """Run `fn(comm, *args)` on `size` ranks with a short call timeout."""
    return colls.spawn(fn, size, transport=transport, timeout=TIMEOUT_S, args=args)


def raises(comm, kind: type[BaseException], call, *words: str) -> str:
    """`call()` raises `kind` whose message names this rank and every one of `words`."""
    with pytest.raises(kind) as info:
        call()
    message = str(info.value)
    for word in (f"rank {comm.rank}", *words):
        assert word in message, f"{word!r} missing from {message!r}"
    return message


def nothing_moved(comm) -> None:
    """No collective has run on `comm` yet, and the ranks still agree on what comes next."""
    assert comm.stats() == {}, comm.stats()
    total = comm.all_reduce(np.array([comm.rank], np.int64))
    assert total.tolist() == [comm.size * (comm.size - 1) // 2]


@pytest.mark.timeout(30)
def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(colls.InvalidArgument, ValueError)


# -- arguments every rank gets wrong alike ---------------------------------------------------------

def _bad_roots(comm) -> None:
    x = np.arange(comm.size * 2, dtype=np.float64)
    for root in (comm.size, -1, comm.size + 7):
        for method in (comm.broadcast, comm.reduce, comm.gather, comm.scatter):
            raises(comm, colls.InvalidArgument, partial(method, x, root=root), "root", str(root))
    for root in (1.0, "0", None, True):
        raises(comm, colls.InvalidArgument, partial(comm.broadcast, x, root=root), "root")
    raises(comm, colls.InvalidArgument, lambda: comm.broadcast(x, root=comm.size, async_op=True), "root")
    nothing_moved(comm)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", (1, 3))
def test_root_out_of_range(size: int) -> None:
    spawn(_bad_roots, size)


@pytest.mark.timeout(60)
def test_root_out_of_range_shm() -> None:
    spawn(_bad_roots, 2, transport="shm")


def _not_divisible(comm) -> None:
    x = np.zeros((comm.size * 3 + 1, 2), np.float32)
    for name in ("reduce_scatter", "all_to_all", "scatter"):
        raises(comm, colls.InvalidArgument, partial(getattr(comm, name), x), name, "axis 0", "x",
               str(x.shape[0]), str(comm.size))
    nothing_moved(comm)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", (2, 3, 4))
def test_axis_zero_not_divisible(size: int) -> None:
    spawn(_not_divisible, size)


def _bad_counts(comm) -> None:
    size = comm.size
    x = np.zeros((6, 2), np.int32)
    good = [6] + [0] * (size - 1)
    cases = [good + [0],                      # one too many
             good[:-1],                       # one too few
             [7, -1] + [0] * (size - 2),      # negative
             [5] + [0] * (size - 1),          # adds up to 5 of 6 rows
             [4] * size,                      # too many rows
             ["a"] * size,                    # not ints
             None]
    for counts in cases:
        raises(comm, colls.InvalidArgument, lambda counts=counts: comm.all_to_all_v(x, counts), "send_counts")
    nothing_moved(comm)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", (2, 3))
def test_all_to_all_v_counts(size: int) -> None:
    spawn(_bad_counts, size)


def _fractional_counts(comm) -> None:
    x = np.zeros(2, np.int32)
    raises(comm, colls.InvalidArgument, lambda: comm.all_to_all_v(x, [0.9, 2.5]), "send_counts")


@pytest.mark.timeout(60)
def test_all_to_all_v_fractional_counts() -> None:
    spawn(_fractional_counts, 2)


def _bad_out(comm) -> None:
    size = comm.size
    n = size * 4
    x = np.arange(n, dtype=np.float32)
    calls = {   # collective: (call, the shape its out must have)
        "all_reduce": (lambda out: comm.all_reduce(x, out=out), (n,)),
        "broadcast": (lambda out: comm.broadcast(x, out=out), (n,)),
        "reduce": (lambda out: comm.reduce(x, root=0, out=out), (n,)),
        "all_gather": (lambda out: comm.all_gather(x, out=out), (n * size,)),
        "reduce_scatter": (lambda out: comm.reduce_scatter(x, out=out), (4,)),
        "all_to_all": (lambda out: comm.all_to_all(x, out=out), (n,)),
        "gather": (lambda out: comm.gather(x, root=0, out=out), (n * size,)),
        "scatter": (lambda out: comm.scatter(x, out=out), (4,)),
    }
    for name, (call, shape) in calls.items():
        if name in ("reduce", "gather") and comm.rank != 0:
            continue   # out is only read on the root
        read_only = np.empty(shape, np.float32)
        read_only.setflags(write=False)
        for out, word in ((np.empty(shape[0] + 1, np.float32), "shape"),
                          (np.empty((1, *shape), np.float32), "shape"),
                          (np.empty(shape, np.float64), "dtype"), (read_only, "read-only"),
                          (list(range(shape[0])), "numpy array")):
            raises(comm, colls.InvalidArgument, partial(call, out), name, "out", word)
    assert comm.stats() == {}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", (1, 2))
def test_out_of_wrong_shape_dtype_or_kind(size: int) -> None:
    spawn(_bad_out, size)


def _one_rank_wrong(comm) -> list[float]:
    """Only rank 1 passes a bad `out`; it fixes it and calls again; everyone agrees afterwards."""
    x = np.full(5, float(comm.rank))
    if comm.rank == 1:
        raises(comm, colls.InvalidArgument, lambda: comm.all_reduce(x, out=np.empty(4)), "out")
        assert comm.stats() == {}
    return comm.all_reduce(x).tolist()


@pytest.mark.timeout(60)
def test_only_the_rank_that_erred_raises_and_nothing_moved() -> None:
    expected = [float(sum(range(3)))] * 5
    assert spawn(_one_rank_wrong, 3) == [expected] * 3


def _bad_algorithm(comm) -> None:
    x = np.ones(4 * comm.size, np.float32)
    for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
                 "gather", "scatter"):
        message = raises(comm, colls.InvalidArgument,
                         lambda name=name: getattr(comm, name)(x, algorithm="no_such_algorithm"),
                         name, "algorithm", "no_such_algorithm")
        for known in colls.algorithms(name):
            assert known in message   # the message lists what would have worked
        for odd in ([], ["ring"], 0):   # not a name: refused by name, not hashed into a plan's key
            raises(comm, colls.InvalidArgument,
                   lambda name=name, odd=odd: getattr(comm, name)(x, algorithm=odd),
                   name, "algorithm must be a name", repr(odd))
    raises(comm, colls.InvalidArgument, lambda: comm.all_to_all_v(x, [x.shape[0]] + [0] * (comm.size - 1),
                                                                  algorithm="nope"), "algorithm")
    raises(comm, colls.InvalidArgument, lambda: comm.barrier(algorithm="nope"), "algorithm")
    nothing_moved(comm)


@pytest.mark.timeout(60)
def test_unknown_algorithm() -> None:
    spawn(_bad_algorithm, 2)


BAD_PAIRS = [(op, dtype) for dtype in ("float16", "float32", "float64", "complex64", "complex128")
             for op in ("BAND", "BOR", "BXOR")]
BAD_PAIRS += [(op, dtype) for dtype in ("complex64", "complex128") for op in ("MIN", "MAX")]
BAD_PAIRS += [("AVG", "bool")]


def _bad_op_dtype(comm) -> None:
    for op_name, dtype in BAD_PAIRS:
        x = np.zeros(2 * comm.size, dtype)
        op = reference.OPS[op_name]
        for call in (partial(comm.all_reduce, x, op=op), partial(comm.reduce, x, op=op),
                     partial(comm.reduce_scatter, x, op=op),
                     partial(comm.all_reduce, x, op=op, async_op=True),
                     partial(comm.all_reduce, x, op=op_name.lower())):
            raises(comm, TypeError, call, op_name, dtype)
    for op in ("FOO", 3, np.add, None):
        raises(comm, colls.InvalidArgument, lambda op=op: comm.all_reduce(np.ones(2), op=op), "op")
    nothing_moved(comm)


@pytest.mark.timeout(60)
def test_op_dtype_pairs_that_make_no_sense() -> None:
    """BXOR on floats, MIN/MAX on complex, AVG on bool: TypeError; a non-operator: InvalidArgument."""
    spawn(_bad_op_dtype, 2)


def _object_arrays(comm) -> None:
    x = np.array([1, "two", None], dtype=object)
    for call in (lambda: comm.all_reduce(x), lambda: comm.broadcast(x), lambda: comm.all_gather(x),
                 lambda: comm.send(x, 0)):
        raises(comm, colls.InvalidArgument, call, "object")
    raises(comm, colls.InvalidArgument, lambda: comm.all_reduce(None), "None")
    nothing_moved(comm)


@pytest.mark.timeout(60)
def test_object_arrays_and_none() -> None:
    spawn(_object_arrays, 2)


def _bad_point_to_point(comm) -> None:
    x = np.ones(3)
    for tag in (-3, 2**32, 1.5, True, "1", None):   # (-1 is ANY_TAG; 2**31.. colls' own)
        raises(comm, colls.InvalidArgument, lambda tag=tag: comm.send(x, 0, tag=tag), "send", "tag")
        raises(comm, colls.InvalidArgument, lambda tag=tag: comm.recv(x, 0, tag=tag), "recv", "tag")
    raises(comm, colls.InvalidArgument, lambda: comm.send(x, 0, tag=colls.ANY_TAG), "send", "tag")
    for peer in (comm.size, -1, True, 1.0, None):
        raises(comm, colls.InvalidArgument, lambda peer=peer: comm.send(x, peer), "send", "dst")
        raises(comm, colls.InvalidArgument, lambda peer=peer: comm.recv(x, peer), "recv", "src")
    strided, read_only = np.ones(6)[::2], np.ones(3)
    read_only.setflags(write=False)
    for buf in (strided, read_only, [1.0, 2.0], np.ones((3, 2)).T):
        raises(comm, colls.InvalidArgument, lambda buf=buf: comm.recv(buf, 0), "recv", "x")
    for buf in (np.empty(2, object), np.empty(2, [("a", "O")])):   # (found by review)
        raises(comm, colls.InvalidArgument, lambda buf=buf: comm.recv(buf, 0), "recv", "x", "objects")
    nothing_moved(comm)


@pytest.mark.timeout(60)
def test_bad_tag_and_peer_for_send_and_recv() -> None:
    spawn(_bad_point_to_point, 2)


def _bad_timeouts(comm) -> list[float]:
    """Bad `timeout=`s on rank 0 alone, each refused before the call takes its number or posts:
    the collectives after them still line up on every rank, and the refused send never arrives."""
    x = np.full(3, comm.rank + 1.0)
    got = [comm.all_reduce(x)[0]]   # the signature is planned from here on
    if comm.rank == 0:
        for bad in ("5s", float("nan"), float("inf"), 0, -1.0, True, None.__class__):
            for call in (lambda bad=bad: comm.all_reduce(x, timeout=bad),              # planned
                         lambda bad=bad: comm.all_reduce(x, algorithm="ring", timeout=bad),
                         lambda bad=bad: comm.broadcast(x, timeout=bad),
                         lambda bad=bad: comm.barrier(timeout=bad),
                         lambda bad=bad: comm.channel(timeout=bad),
                         lambda bad=bad: comm.send(np.full(2, -1.0), 1, tag=5, timeout=bad)):
                raises(comm, colls.InvalidArgument, call, "timeout", repr(bad))
        comm.send(np.full(2, 7.0), 1, tag=5)
    else:
        into = np.zeros(2)
        comm.recv(into, 0, tag=5)
        got.append(into[0])   # the good send's, not a refused one's
    got.append(comm.all_reduce(x, timeout=np.float32(10))[0])
    got.append(comm.all_reduce(x, algorithm="ring", timeout=1e6)[0])
    return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "shm"])
def test_a_bad_timeout_is_refused_before_the_call_takes_its_number(transport) -> None:
    """Found by review: `timeout=` was read after the call had taken its sequence
    number (the ranks' calls then no longer lined up) or a send had posted its message, as a bare
    ValueError; NaN meant no deadline at all."""
    assert spawn(_bad_timeouts, 2, transport) == [[3.0, 3.0, 3.0], [3.0, 7.0, 3.0, 3.0]]


def test_a_bad_default_timeout_names_its_variable() -> None:
    for bad in ("nan", "inf", "0", "-3"):
        done = subprocess.run([sys.executable, "-c", "import colls; colls.spawn(lambda c: 0, 1)"],
                              env={**os.environ, "COLLS_TIMEOUT": bad}, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode != 0 and f"COLLS_TIMEOUT={bad!r}" in done.stderr, done.stderr[-300:]
    from colls.spawn import SpawnError

    with pytest.raises(SpawnError, match="timeout must be a finite number of seconds > 0, got nan"):
        colls.spawn(lambda comm: 0, 1, timeout=float("nan"))


def _closed_and_bad_split(comm) -> None:
    for color in (1.5, "a", True):
        raises(comm, colls.InvalidArgument, lambda color=color: comm.split(color), "split", "color")
    raises(comm, colls.InvalidArgument, lambda: comm.split(0, key=2.5), "split", "key")
    raises(comm, colls.InvalidArgument, lambda: comm.split(0, key=2**70), "split", "key", "64 bits")
    raises(comm, colls.InvalidArgument, lambda: comm.split(-(2**64)), "split", "color", "64 bits")
    nothing_moved(comm)
    sub = comm.split(0)
    sub.close()
    raises(comm, colls.InvalidArgument, lambda: sub.all_reduce(np.ones(2)), "closed")


@pytest.mark.timeout(60)
def test_bad_split_and_closed_communicator() -> None:
    spawn(_closed_and_bad_split, 2)


@pytest.mark.timeout(30)
def test_spawn_arguments() -> None:
    for nprocs in (0, -1, 1.5, True):
        with pytest.raises(colls.InvalidArgument, match="nprocs"):
            colls.spawn(lambda comm: None, nprocs)
    with pytest.raises(colls.InvalidArgument, match="transport"):
        colls.spawn(lambda comm: None, 2, transport="carrier-pigeon")


INIT_SCRIPT = """
import os, sys
import colls
if sys.argv[1] == "again":
    colls.init()
try:
    colls.init(transport=sys.argv[2] if len(sys.argv) > 2 else None)
except colls.InvalidArgument as error:
    print("InvalidArgument:", error)
else:
    print("accepted")
"""


def run_init(*args: str, **env: str) -> str:
    """Run INIT_SCRIPT in a fresh interpreter (colls.init keeps a process-wide world)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("COLLS_", "PMI_", "OMPI_", "PMIX_"))}
    done = subprocess.run([sys.executable, "-c", INIT_SCRIPT, *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(60)
def test_init_rejects_an_unknown_transport() -> None:
    assert "InvalidArgument" in run_init("once", COLLS_TRANSPORT="carrier-pigeon")
    assert "InvalidArgument" in run_init("once", "carrier-pigeon")


@pytest.mark.timeout(60)
def test_init_rejects_an_unknown_transport_after_a_world_exists() -> None:
    assert "InvalidArgument" in run_init("again", "carrier-pigeon")


# -- valid but unusual layouts ---------------------------------------------------------------------

def _strided(comm) -> list[str]:
    """Strided, Fortran-ordered and transposed inputs, and strided `out`s, against the oracle."""
    rank, size = comm.rank, comm.size
    seed, problems = 5, []

    def inputs(rows: int, tail=(), op=None, step=2):
        """Every rank's contiguous input and, for this rank, a strided view with the same values."""
        base = [reference.make_input(seed, r, rows, "int64", tail, op) for r in range(size)]
        spread = np.zeros((rows * step, *tail), np.int64)
        spread[::step] = base[rank]
        return base, spread[::step]

    def check(label, got, want):
        if not (isinstance(got, np.ndarray) and got.shape == want.shape and np.array_equal(got, want)):
            problems.append(f"rank {rank}: {label}: got {got!r}, expected {want!r}")

    base, view = inputs(7, op="SUM")
    assert not view.flags.c_contiguous
    check("all_reduce strided x", comm.all_reduce(view), reference.reduce_arrays(base, "SUM"))
    got = comm.reduce(view, root=size - 1)
    if rank == size - 1:
        check("reduce strided x", got, reference.reduce_arrays(base, "SUM"))
    check("all_gather strided x", comm.all_gather(view), np.concatenate(base))
    check("broadcast strided x", comm.broadcast(view, root=0), base[0])
    got = comm.gather(view, root=0)
    if rank == 0:
        check("gather strided x", got, np.concatenate(base))
    base, view = inputs(3 * size, op="SUM")
    check("reduce_scatter strided x", comm.reduce_scatter(view),
          reference.reduce_arrays(base, "SUM")[3 * rank:3 * rank + 3])
    check("all_to_all strided x", comm.all_to_all(view), reference.oracle_all_to_all(base, rank))
    check("scatter strided x", comm.scatter(view, root=size - 1),
          reference.oracle_scatter(base, size - 1, rank))
    counts = reference.v_counts(seed, rank, view.shape[0], size)
    got, _ = comm.all_to_all_v(view, counts)
    everyone = [reference.v_counts(seed, r, view.shape[0], size) for r in range(size)]
    check("all_to_all_v strided x", got, reference.oracle_all_to_all_v(base, everyone, rank)[0])

    # Fortran order and a transposed view: the values, not the memory layout, define the rows
    matrix = [reference.make_input(seed, r, 4, "int64", (3,), "SUM") for r in range(size)]
    check("all_gather fortran", comm.all_gather(np.asfortranarray(matrix[rank])), np.concatenate(matrix))
    check("all_reduce transposed", comm.all_reduce(np.ascontiguousarray(matrix[rank].T).T),
          reference.reduce_arrays(matrix, "SUM"))

    # strided outputs: the result lands in the view, the gaps between its elements stay untouched
    base, view = inputs(5, op="SUM")
    holder = np.full(10 * size, -99, np.int64)
    out = holder[:10:2]
    assert comm.all_reduce(base[rank], out=out) is out
    check("all_reduce strided out", out, reference.reduce_arrays(base, "SUM"))
    check("gaps after all_reduce", holder[1:10:2], np.full(5, -99))
    out = holder[: 10 * size: 2]
    assert comm.all_gather(base[rank], out=out) is out
    check("all_gather strided out", out, np.concatenate(base))
    check("gaps after all_gather", holder[1::2], np.full(5 * size, -99))
    fortran = np.asfortranarray(np.zeros((4 * size, 3), np.int64))
    assert comm.all_gather(matrix[rank], out=fortran) is fortran
    check("all_gather fortran out", fortran, np.concatenate(matrix))
    holder = np.full(10, -99, np.int64)
    out = holder[::2]
    assert comm.broadcast(base[rank], root=size - 1, out=out) is out
    check("broadcast strided out", out, base[size - 1])
    # in place on a strided view: out=x where x itself is the view
    base, view = inputs(6, op="SUM")
    assert comm.all_reduce(view, out=view) is view
    check("all_reduce in place on a strided view", view, reference.reduce_arrays(base, "SUM"))
    base, view = inputs(2 * size, op="SUM")
    holder = np.full(4, -99, np.int64)
    out = holder[::2]
    assert comm.reduce_scatter(view, out=out) is out
    check("reduce_scatter strided out", out, reference.reduce_arrays(base, "SUM")[2 * rank:2 * rank + 2])
    out = np.full(4 * size, -99, np.int64)[::2]
    assert comm.all_to_all(view, out=out) is out
    check("all_to_all strided out", out, reference.oracle_all_to_all(base, rank))
    out = np.full(4, -99, np.int64)[::2]
    assert comm.scatter(view, root=0, out=out) is out
    check("scatter strided out", out, reference.oracle_scatter(base, 0, rank))
    holder = np.full(8 * size * size, -99, np.int64)
    out = holder[::4] if rank == size - 1 else None
    got = comm.gather(view, root=size - 1, out=out)
    if rank == size - 1:
        assert got is out
        check("gather strided out", out, np.concatenate(base))
        check("gaps after gather", holder[1::4], np.full(2 * size * size, -99))
    out = np.full(4 * size, -99, np.int64)[::2] if rank == 0 else None
    got = comm.reduce(view, root=0, out=out)
    if rank == 0:
        assert got is out
        check("reduce strided out", out, reference.reduce_arrays(base, "SUM"))
    return problems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size,transport", [(1, "local"), (2, "local"), (3, "local"), (5, "local"),
                                            (3, "shm")])
def test_non_contiguous_inputs_and_outputs(size: int, transport: str) -> None:
    problems = [p for rank in spawn(_strided, size, transport) for p in rank]
    assert not problems, "\n".join(problems)


def _strided_recv(comm) -> None:
    """A send from a strided view moves the view's values, not the bytes underneath."""
    if comm.rank == 0:
        comm.send(np.arange(10, dtype=np.int32)[::3], 1, tag=4)
    elif comm.rank == 1:
        got = np.empty(4, np.int32)
        comm.recv(got, 0, tag=4)
        assert got.tolist() == [0, 3, 6, 9]


@pytest.mark.timeout(60)
def test_send_from_a_strided_view() -> None:
    spawn(_strided_recv, 2)


# -- a non-commutative user operator: 2x2 integer matrix products ------------------------------------

def matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Elementwise product of 2x2 int64 matrices: associative, not commutative."""
    result = np.empty(left.shape, MATRIX)
    result["m"] = left["m"] @ right["m"]
    return result


MATMUL = colls.Op(matmul, commutative=False, name="matmul")


def matrices(rank: int, count: int) -> np.ndarray:
    """Rank `rank`'s matrices: entries in -1..2, so products of six stay small and exact."""
    x = np.empty(count, MATRIX)
    x["m"] = np.random.default_rng([rank, count, 2]).integers(-1, 3, (count, 2, 2))
    return x


def ordered_product(size: int, count: int) -> np.ndarray:
    """Rank 0's matrix leftmost: the only right answer for a non-commutative reduction."""
    result = matrices(0, count)
    for rank in range(1, size):
        result["m"] = result["m"] @ matrices(rank, count)["m"]
    return result


@pytest.mark.timeout(30)
def test_matrix_product_is_not_commutative() -> None:
    """The inputs really are order-sensitive: the reversed product differs."""
    forward = ordered_product(4, 5)
    backward = matrices(3, 5)
    for rank in (2, 1, 0):
        backward["m"] = backward["m"] @ matrices(rank, 5)["m"]
    assert not np.array_equal(forward["m"], backward["m"])


def _matmul_reduce(comm, count: int) -> list[str]:
    problems = []
    want = ordered_product(comm.size, count)
    for root in sorted({0, comm.size - 1, comm.size // 2}):
        for algorithm in (None, *colls.algorithms("reduce")):
            label = f"reduce root={root} algorithm={algorithm}"
            try:
                got = comm.reduce(matrices(comm.rank, count), root=root, op=MATMUL, algorithm=algorithm)
            except colls.InvalidArgument as error:
                message = str(error)
                if algorithm is None or "commutative" not in message or algorithm not in message:
                    problems.append(f"{label}: unclear refusal {message!r}")
                continue
            if comm.rank != root:
                if got is not None:
                    problems.append(f"{label}: non-root got {got!r}")
            elif not np.array_equal(got["m"], want["m"]):
                problems.append(f"rank {comm.rank}: {label}: wrong order\n{got['m']}\n{want['m']}")
    return problems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", (1, 2, 3, 4, 5, 6))
def test_reduce_with_matrix_product_keeps_rank_order(size: int) -> None:
    """binomial (and every other order-keeping reduce) multiplies in rank order for any root."""
    problems = [p for rank in spawn(_matmul_reduce, size, args=(3,)) for p in rank]
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(60)
def test_reduce_with_matrix_product_on_shm() -> None:
    problems = [p for rank in spawn(_matmul_reduce, 3, "shm", args=(1000,)) for p in rank]
    assert not problems, "\n".join(problems)


def _matmul_all_reduce(comm, collective: str) -> list[str]:
    """Forcing a commutative-only algorithm is refused by name; the default keeps rank order."""
    size, problems = comm.size, []
    count = 2 * size
    want = ordered_product(size, count)
    if collective == "reduce_scatter":
        want = want[2 * comm.rank:2 * comm.rank + 2]
    call = getattr(comm, collective)
    forced_ring = raises(comm, colls.InvalidArgument,
                         lambda: call(matrices(comm.rank, count), op=MATMUL, algorithm="ring"),
                         collective, "ring", "commutative")
    order_keeping = [a for a in colls.algorithms(collective) if f"'{a}'" in forced_ring.split("pick")[-1]]
    if not order_keeping:
        problems.append(f"the refusal names no algorithm to use instead: {forced_ring!r}")
    for algorithm in (None, *colls.algorithms(collective)):
        try:
            got = call(matrices(comm.rank, count), op=MATMUL, algorithm=algorithm)
        except colls.InvalidArgument as error:
            if algorithm is None or algorithm in order_keeping or "commutative" not in str(error):
                problems.append(f"{collective} algorithm={algorithm}: refused {error}")
            continue
        if algorithm is not None and algorithm not in order_keeping:
            problems.append(f"{collective} algorithm={algorithm} ran, but the refusal called it reordering")
        if not np.array_equal(got["m"], want["m"]):
            problems.append(f"rank {comm.rank}: {collective} algorithm={algorithm}: wrong order")
    return problems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("collective", ("all_reduce", "reduce_scatter"))
@pytest.mark.parametrize("size", (1, 2, 3, 4, 5, 6))
def test_non_commutative_all_reduce_and_reduce_scatter(size: int, collective: str) -> None:
    problems = [p for rank in spawn(_matmul_all_reduce, size, args=(collective,)) for p in rank]
    assert not problems, "\n".join(problems)
