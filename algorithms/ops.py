"""Reduction operators: which dtypes each accepts, and how two operands combine in rank order.

Every reduction in `algorithms` combines a lower-ranked operand on the left with a higher-ranked one
on the right (`left ∘ right`), so an algorithm that keeps rank order gives the right answer for a
non-commutative operator, and those that cannot say so (`commutative_only` in the registry).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# numpy dtype kinds: b bool, i signed, u unsigned, f float, c complex, V structured (user ops only)
NUMERIC = frozenset("biufc")
ORDERED = frozenset("biuf")
BITWISE = frozenset("biu")


class Op:
    """A reduction operator: a binary numpy ufunc or a function of two arrays returning a third.

    `Op(np.maximum, commutative=True)` or `Op(lambda a, b: a @ b, commutative=False)`; user
    functions see equal-length 1-D slices of the buffers (use a structured dtype to keep elements
    such as 2x2 matrices whole) and must not modify their inputs.
    """

    def __init__(self, fn: Callable, commutative: bool = False, name: str | None = None,
                 kinds: frozenset[str] | None = None) -> None:
        self.fn = fn
        self.commutative = commutative
        self.name = name or getattr(fn, "__name__", "user_op")
        self.kinds = kinds  # None: any dtype (user ops decide for themselves)
        self.is_ufunc = isinstance(fn, np.ufunc)
        # a plain ufunc op folds without going through `combine` (on every step of every reduction),
        # unless a subclass has its own `combine`
        self.folds_inline = self.is_ufunc and type(self).combine is Op.combine

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.finishes = cls.finish is not Op.finish

    def __repr__(self) -> str:
        return f"colls.{self.name}" if self.kinds is not None else f"colls.Op({self.name})"

    def check(self, dtype: np.dtype) -> None:
        """Raise TypeError if this operator makes no sense on `dtype`."""
        if self.kinds is not None and dtype.kind not in self.kinds:
            raise TypeError(f"{self.name} is not defined on dtype {dtype}")

    def combine(self, left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
        """out = left ∘ right (out may be left or right)."""
        if self.is_ufunc:
            self.fn(left, right, out=out)
        else:
            out[...] = self.fn(left, right)

    def into_left(self, accumulator: np.ndarray, incoming: np.ndarray) -> None:
        """accumulator = accumulator ∘ incoming: the incoming data is from higher ranks."""
        if self.folds_inline:
            self.fn(accumulator, incoming, out=accumulator)
        else:
            self.combine(accumulator, incoming, accumulator)

    def from_source(self, source: np.ndarray,
                    lower: bool = False) -> Callable[[np.ndarray, np.ndarray], None]:
        """A reducer writing `source ∘ incoming` into the receive buffer (`incoming ∘ source` when
        `lower`: the incoming data is from lower ranks).

        Transports hand a receive's data to its reducer once, in order, piece by piece, so the
        reducer keeps its place in `source`: the fused receive-reduce-copy of NCCL's primitives,
        which spares the collective copying its input into the output first.
        """
        position = 0

        def reduce(accumulator: np.ndarray, incoming: np.ndarray) -> None:
            nonlocal position
            start, position = position, position + accumulator.shape[0]
            mine = source[start:position]
            if lower:
                self.combine(incoming, mine, accumulator)
            else:
                self.combine(mine, incoming, accumulator)

        reduce.reads_source = True   # for the simulator: it reads a third buffer (colls plan calibrate)
        return reduce

    def into_right(self, accumulator: np.ndarray, incoming: np.ndarray) -> None:
        """accumulator = incoming ∘ accumulator: the incoming data is from lower ranks."""
        if self.folds_inline:
            self.fn(incoming, accumulator, out=accumulator)
        else:
            self.combine(incoming, accumulator, accumulator)

    finishes = False   # whether `finish` does anything (in a subclass with its own): hot paths skip it if not

    def finish(self, result: np.ndarray, size: int) -> None:
        """Post-processing once every contribution is in (AVG divides); nothing for most ops."""
        return None


class _Average(Op):
    """SUM, then divide by the number of ranks (integers truncate toward zero, as NCCL's ncclAvg)."""

    def finish(self, result: np.ndarray, size: int) -> None:
        if result.dtype.kind in "fc":
            np.divide(result, size, out=result, casting="unsafe")
        else:
            # floor division, then one up where a negative sum left a remainder: truncation toward
            # zero without ever negating (abs(iinfo.min) would overflow)
            round_up = (result < 0) & (result % size != 0)
            np.floor_divide(result, size, out=result)
            np.add(result, round_up, out=result, casting="unsafe")   # + 1 where True (cupy has no where=)


SUM = Op(np.add, True, "SUM", NUMERIC)
PROD = Op(np.multiply, True, "PROD", NUMERIC)
MIN = Op(np.minimum, True, "MIN", ORDERED)
MAX = Op(np.maximum, True, "MAX", ORDERED)
AVG = _Average(np.add, True, "AVG", frozenset("iufc"))
BAND = Op(np.bitwise_and, True, "BAND", BITWISE)
BOR = Op(np.bitwise_or, True, "BOR", BITWISE)
BXOR = Op(np.bitwise_xor, True, "BXOR", BITWISE)

BUILTIN = {op.name: op for op in (SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR)}
