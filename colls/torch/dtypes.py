"""Tensors as numpy arrays, and torch's reduce ops as colls ops (bfloat16 included).

A CPU tensor reaches colls as a numpy view of its own storage: no copy. A non-contiguous tensor
is made contiguous once, and the result written back into it after the call (`Buffer`).

numpy has no bfloat16, so a bfloat16 tensor travels as its raw 16-bit patterns (uint16) and is
reduced by the ops below, which do what torch's CPU code (and so Gloo, through `c10::BFloat16`)
does for each pair of elements: widen both to float32 (exact), combine in float32, round the result
back to bfloat16 to the nearest even (`c10::round_to_nearest_even`; NaN becomes 0x7FC0). float16
needs nothing of ours: numpy's float16 loops also widen to float32 and round back once per
operation, as `c10::Half` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from algorithms import AVG, BAND, BOR, BXOR, MAX, MIN, PROD, SUM, Op
from transports.errors import InvalidArgument

RedOpType = dist.ReduceOp.RedOpType

# torch's op -> colls' op, for every dtype numpy has
OPS = {
    RedOpType.SUM: SUM, RedOpType.AVG: AVG, RedOpType.PRODUCT: PROD, RedOpType.MIN: MIN,
    RedOpType.MAX: MAX, RedOpType.BAND: BAND, RedOpType.BOR: BOR, RedOpType.BXOR: BXOR,
    RedOpType.PREMUL_SUM: SUM,   # the factor is applied to the input first (`premul_factor`)
}


def widen(bits: np.ndarray) -> np.ndarray:
    """bfloat16 patterns (uint16) -> float32 values (exact: a bfloat16 is a float32's top half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def narrow(values: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 patterns, rounded to the nearest even as c10's
    `round_to_nearest_even`; every NaN becomes the quiet NaN 0x7FC0."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounding_bias = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((bits + rounding_bias) >> 16).astype(np.uint16)   # uint32 wraps only for NaNs
    rounded[np.isnan(values.reshape(rounded.shape))] = 0x7FC0
    return rounded


class Bfloat16Op(Op):
    """A colls op on bfloat16 patterns: both operands widened to float32, combined by the float32
    ufunc, rounded back (one rounding per pair, as `c10::BFloat16`'s operators)."""

    def __init__(self, ufunc: np.ufunc, name: str) -> None:
        super().__init__(self._pair, commutative=True, name=f"{name}(bfloat16)")
        self.ufunc = ufunc

    def _pair(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):   # overflow to inf and NaNs are results, as in torch
            return narrow(self.ufunc(widen(left), widen(right)))

    def check(self, dtype: np.dtype) -> None:
        """Only bfloat16 patterns (uint16) reach these ops."""
        if dtype != np.uint16:
            raise TypeError(f"{self.name} reduces bfloat16 patterns (uint16), got {dtype}")


class Bfloat16Average(Bfloat16Op):
    """bfloat16 AVG: the bfloat16 SUM, then divided by the group's size in float32 and rounded."""

    def finish(self, result: np.ndarray, size: int) -> None:
        with np.errstate(all="ignore"):
            result[...] = narrow(widen(result) / np.float32(size))


BFLOAT16_OPS = {
    RedOpType.SUM: Bfloat16Op(np.add, "SUM"), RedOpType.PRODUCT: Bfloat16Op(np.multiply, "PRODUCT"),
    RedOpType.MIN: Bfloat16Op(np.minimum, "MIN"), RedOpType.MAX: Bfloat16Op(np.maximum, "MAX"),
    RedOpType.AVG: Bfloat16Average(np.add, "AVG"),
}
BFLOAT16_OPS[RedOpType.PREMUL_SUM] = BFLOAT16_OPS[RedOpType.SUM]


_CHOSEN: dict = {}   # (RedOpType, torch dtype) -> the checked colls op, made on first use


def colls_op(op: dist.ReduceOp, dtype: torch.dtype, rank: int, what: str) -> Op:
    """The colls op that does torch's `op` on tensors of `dtype`.

    Args:
        op: the `ReduceOp` torch passed in the call's options.
        dtype: the tensors' dtype.
        rank, what: this rank and the call, for the error message.

    Returns:
        A colls `Op` (one of ours for bfloat16).

    Raises:
        TypeError: the op is not defined on the dtype (a bitwise op on floats, ...).
    """
    kind = getattr(op, "op", op)   # a ReduceOp object (what torch passes) or its RedOpType
    try:
        return _CHOSEN[kind, dtype]
    except KeyError:
        pass
    table = BFLOAT16_OPS if dtype == torch.bfloat16 else OPS
    chosen = table.get(kind)
    if chosen is None:
        raise TypeError(f"rank {rank}: {what}: colls has no ReduceOp.{kind.name} on {dtype}")
    if dtype != torch.bfloat16:
        try:
            chosen.check(np.dtype(_NUMPY.get(dtype, np.uint8)))
        except TypeError as error:
            raise TypeError(f"rank {rank}: {what}: ReduceOp.{kind.name} is not defined on {dtype} "
                            f"({error})") from None
    _CHOSEN[kind, dtype] = chosen
    return chosen


def premul_factor(op: dist.ReduceOp) -> float | torch.Tensor | None:
    """PREMUL_SUM's factor (a number or a one-element tensor), None for every other op."""
    if getattr(op, "op", op) == RedOpType.PREMUL_SUM:
        return op.factor
    return None


_NUMPY = {
    torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


@dataclass
class Buffer:
    """A tensor's data as a flat numpy view: `array` is the storage of `contiguous`, which is the
    tensor itself unless that was not contiguous; `write_back` puts a result back into it."""

    tensor: torch.Tensor
    contiguous: torch.Tensor
    array: np.ndarray

    def write_back(self) -> None:
        """Copy the result into the caller's tensor (only a non-contiguous one needs it)."""
        if self.contiguous is not self.tensor:
            self.tensor.copy_(self.contiguous)


def as_buffer(tensor: torch.Tensor, rank: int, what: str, name: str = "tensor") -> Buffer:
    """`tensor` as a flat numpy view of its storage (made contiguous once if it is not).

    Args:
        tensor: a CPU tensor of a dtype torch trains in.
        rank, what, name: this rank, the call and the argument, for the error message.

    Returns:
        A `Buffer`.

    Raises:
        InvalidArgument: not a tensor, not on the CPU, or a dtype colls cannot move.
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(f"rank {rank}: {what}: {name} must be a torch.Tensor, "
                              f"got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise InvalidArgument(f"rank {rank}: {what}: {name} is on {tensor.device}; the colls backend "
                              f"moves CPU tensors (give GPU tensors a group of their own: "
                              f"dist.new_group(backend='nccl'))")
    contiguous = tensor if tensor.is_contiguous() else tensor.contiguous()
    data = contiguous.detach() if contiguous.requires_grad else contiguous
    if tensor.dtype == torch.bfloat16:
        array = data.view(torch.uint16).numpy()
    elif tensor.dtype in _NUMPY:
        array = data.numpy()
    else:
        movable = sorted(map(str, [*_NUMPY, torch.bfloat16]))
        raise InvalidArgument(f"rank {rank}: {what}: {name} has dtype {tensor.dtype}, which the colls "
                              f"backend does not move; use one of {movable}")
    return Buffer(tensor, contiguous, array.reshape(-1))
