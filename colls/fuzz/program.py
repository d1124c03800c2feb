"""Collective programs: what the fuzzer generates, runs, shrinks and prints.

A `Program` is a group size, a data seed and a list of `Step`s: collectives (with algorithm or auto,
dtype, rows, shape, operator, root, output mode, async), point-to-point shifts (`p2p`: every rank
sends to rank + k and receives from rank - k, on a user tag, send or receive posted first),
deliberately invalid calls (`invalid`: every rank makes the same bad call, which must fail at once
with an error naming the argument and the rank, moving no byte and leaving the communicator usable),
`split`s that add a sub-communicator, and `wait`s that finish pending async handles in a random
order. It is plain data, serialisable to a short token (`colls fuzz --replay TOKEN`), and hypothesis
draws it so that a failure shrinks.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from algorithms import lookup, names

from .oracle import DTYPES, dtype_of, valid_ops

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
               "all_to_all_v", "gather", "scatter", "barrier")
KINDS = (*COLLECTIVES, "p2p", "invalid", "split", "wait")
# the bad calls of an `invalid` step: what is wrong -> the argument its error must name
INVALID = {"root": "root", "op_dtype": "BAND", "out_shape": "out", "send_counts": "send_counts",
           "negative_counts": "send_counts", "algorithm": "algorithm", "dst": "dst", "src": "src",
           "tag": "tag", "blocks": "axis 0", "object": "object", "recv_readonly": "writable"}
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
BLOCKED = ("reduce_scatter", "all_to_all", "scatter")      # rows are per block: size x rows in all
MODES = {"all_reduce": ("new", "out", "inplace"), "broadcast": ("new", "out", "inplace"),
         "reduce": ("new", "out", "inplace"), "all_gather": ("new", "out", "inplace"),
         "reduce_scatter": ("new", "out"), "all_to_all": ("new", "out", "inplace"),
         "all_to_all_v": ("new",), "gather": ("new", "out"), "scatter": ("new", "out"), "barrier": ("new",)}
# how a split picks each rank's color (None: the rank joins no group)
COLORINGS = ("halves", "parity", "one", "thirds", "drop_last", "singletons")
TAILS = ((), (3,), (2, 5), (1,), (17,))
MAX_SPLITS = 3
MAX_BYTES = 4 << 20
TOKEN_PREFIX = "c1."


@dataclass(frozen=True)
class Step:
    """One step of a program; which fields matter depends on `kind`."""

    kind: str
    comm: int = 0                  # 0: the program's group; k: the k-th split's sub-communicator
    algorithm: str | None = None   # None: let the library choose
    dtype: str = "int32"
    rows: int = 1                  # rows per rank (per block for reduce_scatter, all_to_all, scatter)
    tail: tuple[int, ...] = ()     # the shape after axis 0
    op: str | None = None
    root: int = 0                  # taken modulo the group's size
    # new: out=None; out: a preallocated out; inplace: out=x (an all_gather's x: its block of out)
    mode: str = "new"
    async_op: bool = False
    wait: int = 0                  # async handles are waited in increasing (wait, step)
    coloring: str = "halves"       # split only
    reverse: bool = False          # split only: key = -rank, reversing the order in each group
    tag: int = 0                   # p2p only: the user tag
    bad: str = ""                  # invalid only: which bad call (a key of INVALID)

    def label(self) -> str:
        """`reduce(binomial, 7 x int32, SUM, root 1, out, async) on comm 1`, for messages."""
        if self.kind == "split":
            return f"split({self.coloring}{', reversed' if self.reverse else ''}) of comm {self.comm}"
        if self.kind == "wait":
            return "wait for pending async calls"
        if self.kind == "invalid":
            return f"invalid call ({self.bad}){f' on comm {self.comm}' if self.comm else ''}"
        if self.kind == "p2p":
            shape = "x".join(str(d) for d in (self.rows, *self.tail))
            order = "recv first" if self.mode == "out" else "send first"
            where = f" on comm {self.comm}" if self.comm else ""
            return (f"p2p(shift {self.root}, {shape} x {self.dtype}, tag {self.tag}, {order}"
                    f"{', async' if self.async_op else ''}){where}")
        parts = [self.algorithm or "auto"]
        if self.kind != "barrier":
            shape = "x".join(str(d) for d in (self.rows, *self.tail))
            parts.append(f"{shape} {'per block ' if self.kind in BLOCKED else ''}x {self.dtype}")
        parts += [self.op] if self.op else []
        parts += [f"root {self.root}"] if self.kind in ROOTED else []
        parts += [self.mode] if self.mode != "new" else []
        parts += ["async"] if self.async_op else []
        where = f" on comm {self.comm}" if self.comm else ""
        return f"{self.kind}({', '.join(parts)}){where}"


@dataclass(frozen=True)
class Program:
    """A group size, a data seed and the steps every rank runs in order."""

    size: int
    seed: int
    steps: tuple[Step, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        """Compact JSON, leaving out fields at their defaults."""
        defaults = {f.name: f.default for f in fields(Step)}
        steps = [{k: v for k, v in asdict(s).items() if k == "kind" or v != defaults[k]} for s in self.steps]
        return json.dumps({"size": self.size, "seed": self.seed, "steps": steps}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Program:
        """The program `to_json` wrote."""
        data = json.loads(text)
        steps = tuple(Step(**{**s, "tail": tuple(s.get("tail", ()))}) for s in data["steps"])
        return cls(int(data["size"]), int(data["seed"]), steps)

    def token(self) -> str:
        """The program as one short word: what `colls fuzz --replay` takes."""
        packed = zlib.compress(self.to_json().encode(), 9)
        return TOKEN_PREFIX + base64.urlsafe_b64encode(packed).decode().rstrip("=")

    @classmethod
    def from_token(cls, token: str) -> Program:
        """The program a `token()` encodes; ValueError for anything else."""
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX):
            raise ValueError(f"a replay seed starts with {TOKEN_PREFIX!r} (as printed by a failing run)")
        body = token[len(TOKEN_PREFIX):]
        try:
            return cls.from_json(zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))
        except (ValueError, TypeError, KeyError, zlib.error) as error:
            raise ValueError(f"not a replay seed: {error}") from None

    def collective_steps(self) -> int:
        """How many steps are calls into the library (not `wait`)."""
        return sum(s.kind != "wait" for s in self.steps)


# -- what a step means on a given group --------------------------------------------------------------

def step_rows(step: Step, size: int, max_bytes: int = MAX_BYTES) -> int:
    """`step.rows`, capped so that no buffer of a group of `size` exceeds `max_bytes`."""
    row_bytes = dtype_of(step.dtype).itemsize * int(np.prod(step.tail, dtype=np.int64))
    factor = size if step.kind in (*BLOCKED, "all_gather", "gather") else 1
    factor *= 2 if step.kind == "all_to_all_v" else 1   # a rank sends up to twice the nominal rows
    return max(0, min(step.rows, max_bytes // max(1, row_bytes * factor)))


def split_colors(coloring: str, reverse: bool, size: int) -> list[tuple[int | None, int | None]]:
    """(color, key) of each rank of a group of `size` for a split step."""
    def color(rank: int) -> int | None:
        if coloring == "halves":
            return int(rank >= size // 2)
        if coloring == "parity":
            return rank % 2
        if coloring == "thirds":
            return rank * 3 // size
        if coloring == "drop_last":
            return None if rank == size - 1 else 0
        if coloring == "singletons":
            return rank
        return 0
    return [(color(rank), -rank if reverse else None) for rank in range(size)]


def split_groups(coloring: str, reverse: bool, size: int) -> list[list[int] | None]:
    """For each rank of the parent group, the parent ranks of its new group in new-rank order."""
    table = split_colors(coloring, reverse, size)
    groups: list[list[int] | None] = []
    for rank in range(size):
        colour = table[rank][0]
        if colour is None:
            groups.append(None)
            continue
        members = [r for r in range(size) if table[r][0] == colour]
        groups.append(sorted(members, key=lambda r: (table[r][1] if table[r][1] is not None else r, r)))
    return groups


def normalize(program: Program, max_bytes: int = MAX_BYTES) -> Program:
    """Make every reference valid (comm indices exist, at most MAX_SPLITS splits, roots in range)
    and cap rows so that no buffer exceeds `max_bytes`."""
    steps, splits = [], 0
    for step in program.steps:
        if step.kind == "split" and splits >= MAX_SPLITS:
            continue
        root = step.root if step.kind in ("p2p", "invalid") else step.root % program.size
        step = replace(step, comm=step.comm % (splits + 1), root=root)
        steps.append(replace(step, rows=step_rows(step, program.size, max_bytes)))
        splits += step.kind == "split"
    return replace(program, steps=tuple(steps))


# -- hypothesis strategies ---------------------------------------------------------------------------

EDGE_ROWS = (0, 1, 2, 3, 5, 7, 11, 13, 31, 61, 63, 64, 65, 127, 128, 129, 251, 255, 256, 257, 509,
             1021, 1023, 1024, 1025)
BIG_ROWS = tuple(sorted({(1 << k) + d for k in range(12, 21) for d in (-1, 0, 1)} | {65521, 262139, 1048573}))


# how often each kind of row count is drawn: mostly tiny and edge cases, MiB-sized one time in 16
SIZE_CLASSES = ("tiny",) * 8 + ("edge",) * 4 + ("relative",) * 3 + ("big",)


@dataclass(frozen=True)
class Space:
    """What the fuzzer may draw: group sizes, steps per program, collectives, algorithms, sizes."""

    min_ranks: int = 2
    max_ranks: int = 8
    max_steps: int = 50
    collectives: tuple[str, ...] = COLLECTIVES
    algorithms: tuple[str, ...] | None = None   # None: every registered one, plus auto
    splits: bool = True
    p2p: bool = True                            # point-to-point shifts
    invalid: bool = True                        # deliberately invalid calls
    max_bytes: int = MAX_BYTES
    skip: tuple[str, ...] = ()                  # "collective:mode" pairs never drawn

    def choices(self, collective: str, commutative: bool) -> list[str | None]:
        """The algorithms a step may force (None first: auto)."""
        allowed = [name for name in names(collective)
                   if (self.algorithms is None or name in self.algorithms)
                   and (commutative or not lookup(collective, name).commutative_only)]
        return [None, *allowed] if self.algorithms is None or "auto" in self.algorithms else allowed or [None]


def programs(space: Space):
    """A hypothesis strategy of normalised programs drawn from `space`."""
    from hypothesis import strategies as st

    kinds = [k for k in space.collectives for _ in range(3)]
    kinds += ["split"] * space.splits + ["wait"] + ["p2p"] * 3 * space.p2p + ["invalid"] * space.invalid

    @st.composite
    def rows(draw, size: int) -> int:
        size_class = draw(st.sampled_from(SIZE_CLASSES))
        if size_class == "tiny":
            return draw(st.integers(0, 8))
        if size_class == "edge":
            return draw(st.sampled_from(EDGE_ROWS))
        if size_class == "relative":   # n - 1, n, n + 1, 2n - 1, ... of the program's group
            return draw(st.sampled_from((1, 2))) * size + draw(st.sampled_from((0, -1, 1)))
        return draw(st.sampled_from(BIG_ROWS))

    @st.composite
    def step(draw, size: int) -> Step:
        kind = draw(st.sampled_from(kinds))
        comm = draw(st.integers(0, MAX_SPLITS))
        if kind == "split":
            return Step("split", comm, coloring=draw(st.sampled_from(COLORINGS)), reverse=draw(st.booleans()))
        if kind == "wait":
            return Step("wait")
        if kind == "invalid":
            return Step("invalid", comm, bad=draw(st.sampled_from(sorted(INVALID))),
                        root=draw(st.integers(0, 15)))
        if kind == "p2p":
            async_op = draw(st.booleans())
            return Step("p2p", comm, None, draw(st.sampled_from(DTYPES)), draw(rows(size)),
                        draw(st.sampled_from(TAILS)), root=draw(st.integers(1, 15)),
                        mode=draw(st.sampled_from(("new", "out"))), async_op=async_op,
                        wait=draw(st.integers(0, 7)) if async_op else 0, tag=draw(st.integers(0, 3)))
        if kind == "barrier":
            async_op = draw(st.booleans())
            return Step("barrier", comm, draw(st.sampled_from(space.choices(kind, True))),
                        async_op=async_op, wait=draw(st.integers(0, 7)) if async_op else 0)
        dtype = draw(st.sampled_from(DTYPES))
        op = draw(st.sampled_from(valid_ops(dtype))) if kind in REDUCING else None
        algorithm = draw(st.sampled_from(space.choices(kind, op != "MATMUL")))
        modes = [m for m in MODES[kind] if f"{kind}:{m}" not in space.skip] or ["new"]
        async_op = draw(st.booleans())
        return Step(kind, comm, algorithm, dtype, draw(rows(size)), draw(st.sampled_from(TAILS)), op,
                    draw(st.integers(0, 15)) if kind in ROOTED else 0, draw(st.sampled_from(modes)),
                    async_op, draw(st.integers(0, 7)) if async_op else 0)

    @st.composite
    def program(draw) -> Program:
        size = draw(st.integers(space.min_ranks, space.max_ranks))
        seed = draw(st.integers(0, 2**31 - 1))
        steps = draw(st.lists(step(size), min_size=1, max_size=space.max_steps))
        return normalize(Program(size, seed, tuple(steps)), space.max_bytes)

    return program()
