"""Describe, then execute: arguments normalised and checked once, before any byte moves.

Every collective turns its arguments into an immutable `Description` (as mpi4py's `for_allreduce`
does) and buffers it can hand to an algorithm. The description serves validation messages, the name
in timeout errors, byte counters, traces and the fingerprints that detect mismatched calls across
ranks; it is made once per call signature and cached, with the algorithm's schedule compiled in.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from algorithms import BUILTIN, Op, lookup, names
from algorithms.blocks import Schedule
from algorithms.registry import Algorithm
from transports.base import COLLECTIVE_TAG_BASE, fingerprint
from transports.errors import InvalidArgument

from .device import as_cupy, is_cuda_dlpack, is_cupy, module_of
from .selection import Selector

BUILTIN_OPS = frozenset(BUILTIN.values())   # Op hashes by identity
Result = Any  # what a collective returns: the array (or None), or a Work handle when async_op=True


def fixed_op(op: object) -> bool:
    """Whether `op` is a name or a built-in Op, which no program changes: what may key a cached
    description (a user's Op may change, and would stay alive in the cache). TypeError if unhashable."""
    return type(op) is str or op in BUILTIN_OPS

CACHED_SIGNATURES = 4096   # a program repeats a few signatures; past this many, start afresh


class Description:
    """What one collective call signature is, checked and compiled: the collective, its element
    type, input and output shapes, root, operator and algorithm, and (where the algorithm declares
    one) its schedule worked out for this rank, with each of its steps bound to the transport
(`exchanges`, from `algorithms.blocks.bind_schedule`). Immutable: made once per signature and cached
    (`Validator.described`), so a call repeated with the same signature costs one dict lookup
    here; the call's buffers and number travel beside it (`Communicator._execute`). `tag` is the
    collective tag of its call #0, fingerprint included (`transports.base.fingerprint`): call
    number `seq` sends on `tag + (seq << FP_BITS)`."""

    __slots__ = ("collective", "dtype", "shape", "count", "out_shape", "root", "op", "algorithm",
                 "schedule", "exchanges", "group", "tag")

    def __init__(self, collective: str, dtype: np.dtype | None, shape: tuple[int, ...], root: int | None,
                 op: Op | None, algorithm: Algorithm, group: str = "",
                 out_shape: tuple[int, ...] | None = None, schedule: Schedule | None = None,
                 exchanges: tuple | None = None) -> None:
        count = 0 if dtype is None else math.prod(shape)   # elements of this rank's input
        for name, value in (("collective", collective), ("dtype", dtype), ("shape", shape), ("count", count),
                            ("out_shape", shape if out_shape is None else out_shape), ("root", root),
                            ("op", op), ("algorithm", algorithm), ("schedule", schedule),
                            ("exchanges", exchanges), ("group", group)):
            object.__setattr__(self, name, value)
        # every rank's count must agree but all_to_all_v's (its counts are each rank's own)
        fp = fingerprint(collective, dtype, 0 if collective == "all_to_all_v" else count, root,
                         None if op is None else op.name)
        object.__setattr__(self, "tag", COLLECTIVE_TAG_BASE + fp)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Description is immutable (tried to set {name})")

    def label(self, seq: int) -> str:
        """Short text for messages: `all_reduce #3 (ring, 1000 x float32, SUM)`."""
        parts = [self.algorithm.name, f"{self.count} x {self.dtype}"]
        if self.op is not None:
            parts.append(self.op.name)
        if self.root is not None:
            parts.append(f"root {self.root}")
        return f"{self.collective} #{seq} ({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"<Description {self.group} {self.label(-1)}>"


class CallName:
    """One call as messages name it: its description and its number in the communicator's
    sequence, formatted only when a message needs it (`world all_reduce #3 (ring, ...)`)."""

    __slots__ = ("description", "seq")

    def __init__(self, description: Description | None = None, seq: int = -1) -> None:
        self.description = description
        self.seq = seq

    def label(self) -> str:
        """The call without the communicator's name (traces add their own)."""
        return self.description.label(self.seq)

    def __str__(self) -> str:
        group = self.description.group
        return f"{group} {self.label()}" if group else self.label()


def seconds(value: object) -> float | None:
    """`value` as a number of seconds to wait, finite and > 0 (every wait has a deadline); None if
    it is none (a bool, a string, NaN, infinity, zero or less)."""
    if type(value) is bool or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    value = float(value)
    return value if 0 < value < math.inf else None   # (NaN fails both)


class Validator:
    """Argument checks for one rank; every message names the argument and the rank."""

    def __init__(self, rank: int, size: int, selector: Selector, device_buffers: bool = False) -> None:
        self.rank = rank
        self.size = size
        self.device_buffers = device_buffers   # whether the transport moves GPU arrays (cuda_ipc)
        self.use(selector)

    def use(self, selector: Selector) -> None:
        """Choose algorithms with `selector` from now on (a communicator that learned its hosts)."""
        self.selector = selector
        # (collective, op as given, dtype, shape, root, algorithm as given) -> Description: what the
        # checks and the compilation of a signature concluded (`Communicator._describe`)
        self.described: dict[tuple, Description] = {}

    def timeout(self, collective: str, timeout: object) -> float:
        """`timeout=` as seconds, checked before the call takes its number or posts anything."""
        given = seconds(timeout)
        if given is None:
            raise self.fail(collective, f"timeout must be a finite number of seconds > 0, "
                                        f"got {timeout!r}")
        return given

    def fail(self, collective: str, message: str) -> InvalidArgument:
        """The error to raise: `rank 2: all_reduce: out has shape (3,), expected (4,)`."""
        return InvalidArgument(f"rank {self.rank}: {collective}: {message}")

    def array(self, collective: str, x: object, name: str = "x") -> np.ndarray:
        """`x` as a C-contiguous numpy array (copied if it was not), or a C-contiguous cupy array
        where the transport moves device buffers (other CUDA arrays through DLPack, not copied);
        else InvalidArgument."""
        if x is None:
            raise self.fail(collective, f"{name} is None; pass a numpy array")
        if type(x) is not np.ndarray and (is_cupy(x) or is_cuda_dlpack(x)):
            return self.device_array(collective, x, name)
        array = x if type(x) is np.ndarray else np.asarray(x)
        if array.dtype.hasobject:
            raise self.fail(collective, f"{name} has dtype {array.dtype}; object arrays cannot be sent")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)   # never move a strided view's bytes as if contiguous
        return array

    def device_array(self, collective: str, x: object, name: str = "x"):
        """A GPU array `x` as a C-contiguous cupy array, or InvalidArgument where the transport
        moves host memory only (copying to the host behind the user's back would hide the cost)."""
        if not self.device_buffers:
            raise self.fail(collective, f"{name} is a GPU array ({type(x).__module__}."
                                        f"{type(x).__name__}) but this communicator's transport moves "
                                        f"host memory: use the cuda_ipc transport (colls run --transport "
                                        f"cuda_ipc) or pass a host copy (cupy: {name}.get(); torch: "
                                        f"{name}.cpu().numpy())")
        array = x if is_cupy(x) else as_cupy(x)
        if not array.flags.c_contiguous:
            array = module_of(array).ascontiguousarray(array)
        return array

    def output(self, collective: str, out: object, shape: tuple[int, ...], dtype: np.dtype,
               name: str = "out", like: object = None) -> np.ndarray | None:
        """Check a user-supplied output array (on the same side, host or device, as `like`, the
        input); None if none was given."""
        if out is None:
            return None
        if type(out) is not np.ndarray and (is_cupy(out) or is_cuda_dlpack(out)):
            out = self.device_array(collective, out, name) if is_cuda_dlpack(out) else out
            if module_of(like) is np:
                raise self.fail(collective, f"{name} is a GPU array but the input is in host memory; "
                                            f"pass both on the device or both on the host")
            writeable = True
        elif not isinstance(out, np.ndarray):
            raise self.fail(collective, f"{name} must be a numpy array, got {type(out).__name__}")
        elif like is not None and module_of(like) is not np:
            raise self.fail(collective, f"{name} is a numpy array but the input is a GPU array; "
                                        f"pass both on the device or both on the host")
        else:
            writeable = out.flags.writeable
        if out.shape != shape or out.dtype != dtype:
            raise self.fail(collective, f"{name} has shape {out.shape} and dtype {out.dtype}; expected "
                                        f"shape {shape} and dtype {dtype}")
        if not writeable:
            raise self.fail(collective, f"{name} is read-only")
        return out

    def result(self, collective: str, out: object, shape: tuple[int, ...],
               dtype: np.dtype, like: object = None) -> tuple[np.ndarray | None, np.ndarray]:
        """(what the call returns into, where its algorithm writes), after checking `out`: the
        user's `out` itself when it is contiguous, else a fresh buffer copied into it at the end.
        Fresh buffers are made where `like` (the input) lives: numpy, or cupy on the device."""
        empty = np.empty if type(like) is np.ndarray or like is None else module_of(like).empty
        if out is None:
            work = empty(shape, dtype)
            return work, work
        given = self.output(collective, out, shape, dtype, like=like)
        if given.flags.c_contiguous:
            return given, given
        return given, empty(shape, dtype)   # strided out: work contiguously, copy back at the end

    def root(self, collective: str, root: object) -> int:
        """`root` as an int in range."""
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise self.fail(collective, f"root must be an int, got {root!r}")
        if not 0 <= int(root) < self.size:
            raise self.fail(collective, f"root={root} is out of range for a group of {self.size} ranks")
        return int(root)

    def peer(self, collective: str, peer: object, name: str) -> int:
        """A point-to-point peer rank, in range."""
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size:
            raise self.fail(collective, f"{name}={peer!r} is not a rank of this group of {self.size}")
        return int(peer)

    def op(self, collective: str, op: object, dtype: np.dtype) -> Op:
        """The operator, checked against the dtype (a TypeError for pairs that make no sense)."""
        if isinstance(op, str):
            op = BUILTIN.get(op.upper(), op)
        if not isinstance(op, Op):
            raise self.fail(collective, f"op must be colls.SUM, colls.MAX, ... or a colls.Op, got {op!r}")
        try:
            op.check(dtype)
        except TypeError as error:
            raise TypeError(f"rank {self.rank}: {collective}: {error}") from None
        return op

    def algorithm(self, collective: str, algorithm: str | None, op: Op | None = None,
                  nbytes: int = 0) -> Algorithm:
        """The algorithm asked for, else the selector's choice; refuses one that breaks rank order,
        and an `algorithm=` that is not a name."""
        if algorithm is not None and type(algorithm) is not str:
            raise self.fail(collective, f"algorithm must be a name (a str such as {names(collective)[0]!r}) "
                                        f"or None, got {algorithm!r}")
        commutative = op is None or op.commutative
        name = algorithm or self.selector.choose(collective, nbytes, commutative)
        try:
            chosen = lookup(collective, name)
        except KeyError:
            raise self.fail(collective, f"algorithm={name!r} is unknown; choose from {names(collective)}"
                            ) from None
        if chosen.commutative_only and not commutative:
            order_keeping = [a for a in names(collective) if not lookup(collective, a).commutative_only]
            raise self.fail(collective, f"algorithm {name!r} reorders operands and {op!r} is not "
                                        f"commutative; pick one of {order_keeping}")
        return chosen

    def rows(self, collective: str, x: np.ndarray, name: str = "x") -> np.ndarray:
        """`x` with at least one axis (a scalar counts as one row)."""
        return x.reshape(1) if x.ndim == 0 else x

    def divisible(self, collective: str, x: np.ndarray, name: str = "x") -> int:
        """Rows per rank when axis 0 of `x` must split into `size` equal blocks."""
        if x.shape[0] % self.size:
            raise self.fail(collective, f"axis 0 of {name} has length {x.shape[0]}, which does not split "
                                        f"into {self.size} equal blocks")
        return x.shape[0] // self.size

    def counts(self, collective: str, counts: object, total: int, name: str = "send_counts") -> list[int]:
        """Per-rank row counts: `size` non-negative ints adding up to `total`."""
        try:
            values = [operator.index(c) for c in counts]  # type: ignore[union-attr]
        except TypeError:
            raise self.fail(collective, f"{name} must be a sequence of {self.size} ints, got "
                                        f"{counts!r}") from None
        if len(values) != self.size or any(c < 0 for c in values):
            raise self.fail(collective, f"{name}={values} must hold {self.size} non-negative counts")
        if sum(values) != total:
            raise self.fail(collective, f"{name} adds up to {sum(values)} rows but x has {total}")
        return values


def apart_from(x: np.ndarray, work: np.ndarray, own: int | None = None) -> np.ndarray | None:
    """`x`, or None when the output overlaps it (in place): blocks are read after others land, so the
    body sends from a copy. An all_gather's input that is its own block of the output (`own`: the
    rank; torch's all_gather_into_tensor on a chunk of its output) is taken where it lies: every
    all_gather algorithm writes only the other blocks, and numpy's copy of a block onto itself
    moves nothing, where copying it out first would cost a pass over the whole input."""
    if not np.may_share_memory(x, work):
        return x
    if (own is not None and type(x) is np.ndarray and type(work) is np.ndarray   # (device arrays: copied)
            and x.flags.c_contiguous and work.flags.c_contiguous
            and x.__array_interface__["data"][0] == work.__array_interface__["data"][0] + own * x.nbytes):
        return x
    return None


def deliver(result: np.ndarray | None, work: np.ndarray) -> np.ndarray:
    """The call's result: `work`, copied into a strided `out` where one was given."""
    if result is not None and result is not work:
        result[...] = work
        return result
    return work
