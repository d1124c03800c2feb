"""Latency-bandwidth cost models of the algorithms, for selection and for `colls plan`.

The models of Thakur, Rabenseifner & Gropp (2005): a message of m bytes costs α + m·β, and reducing
m bytes costs m·γ. `S` is the collective's buffer in bytes as the nccl-tests count it: the input of
all_reduce, broadcast and reduce; the *output* of all_gather and gather; the *input* of
reduce_scatter, scatter and all_to_all. Pipelined algorithms also pay per piece.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .blocks import PIPELINE_CHUNK_BYTES, segment_bytes
from .registry import CATALOGUE


@dataclass(frozen=True)
class Machine:
    """α: seconds per message; β: seconds per byte moved; γ: seconds per byte reduced."""

    alpha: float
    beta: float
    gamma: float


Model = Callable[[int, float, Machine], float]
MODELS: dict[tuple[str, str], Model] = {}


def model(collective: str, *names: str):
    """Decorator: the cost model of `collective`'s algorithms `names`."""

    def add(fn: Model) -> Model:
        for name in names:
            MODELS[(collective, name)] = fn
        return fn

    return add


def predict(collective: str, name: str, size: int, nbytes: float, machine: Machine) -> float:
    """Predicted seconds for one call, or inf when the algorithm has no model.

    An all_reduce whose schedule works in place first copies its input into the output (one copy,
    β/2 a byte, where a message costs a copy out and one in); one that reads its input where it
    lies (`takes_source`: the ring) does not. Likewise a reduce_scatter that folds into its input
    works on a copy of it (`Communicator._scratch`), and one that only reads it (`reads_input_only`:
    pairwise) does not. Their messages cost alike, so the model now takes pairwise wherever it took
    ring, at any group size (a tune file may still choose ring where it measured it faster). At 2
    ranks they make the same one exchange, and the ring's extra copy is all that differs.
    """
    fn = MODELS.get((collective, name))
    if fn is None:
        return math.inf
    if size == 1:
        return 0.0
    seconds = fn(size, float(nbytes), machine)
    algorithm = CATALOGUE.get(collective, {}).get(name)
    if algorithm is not None and ((collective == "all_reduce" and not algorithm.takes_source)
                                  or (collective == "reduce_scatter" and not algorithm.reads_input_only)):
        seconds += nbytes * machine.beta / 2
    return seconds


def _log2(n: int) -> int:
    return max(0, math.ceil(math.log2(n)))


def _fold(n: int, nbytes: float, m: Machine) -> float:
    """Extra cost of MPICH's fold to a power of two: a message in and one out, one reduction."""
    return 0.0 if n & (n - 1) == 0 else 2 * (m.alpha + nbytes * m.beta) + nbytes * m.gamma


def _pipeline(stages: int, nbytes: float, m: Machine, piece: float = PIPELINE_CHUNK_BYTES) -> float:
    """A chain of `stages` hops moving `nbytes` in pieces: (stages - 1 + pieces) piece-times."""
    pieces = max(1, math.ceil(nbytes / piece))
    per = min(piece, nbytes)
    return (stages - 1 + pieces) * (m.alpha + per * m.beta)


# -- all_reduce --------------------------------------------------------------------------------

@model("all_reduce", "ring")
def _ring_all_reduce(n: int, s: float, m: Machine) -> float:
    return 2 * (n - 1) * m.alpha + 2 * (n - 1) / n * s * m.beta + (n - 1) / n * s * m.gamma


@model("all_reduce", "ring_segmented")
def _ring_segmented(n: int, s: float, m: Machine) -> float:
    segment = segment_bytes(n)
    whole, rest = divmod(s, segment)
    return whole * _ring_all_reduce(n, segment, m) + (_ring_all_reduce(n, rest, m) if rest else 0.0)


@model("all_reduce", "recursive_doubling")
def _recursive_doubling(n: int, s: float, m: Machine) -> float:
    p = 1 << (n.bit_length() - 1)
    return _log2(p) * (m.alpha + s * m.beta + s * m.gamma) + _fold(n, s, m)


@model("all_reduce", "rabenseifner")
def _rabenseifner(n: int, s: float, m: Machine) -> float:
    p = 1 << (n.bit_length() - 1)
    return (2 * _log2(p) * m.alpha + 2 * (p - 1) / p * s * m.beta + (p - 1) / p * s * m.gamma
            + _fold(n, s, m))


@model("all_reduce", "tree")
def _tree(n: int, s: float, m: Machine) -> float:
    depth = _log2(n + 1)
    # each of the two trees carries half; up and down; an interior rank feeds two children
    return 2 * _pipeline(depth, s / 2, m) * 2 + s / 2 * m.gamma


@model("all_reduce", "ps")
def _parameter_server(n: int, s: float, m: Machine) -> float:
    return 2 * (n - 1) * (m.alpha + s * m.beta) + (n - 1) * s * m.gamma


@model("all_reduce", "ps_sharded")
def _parameter_server_sharded(n: int, s: float, m: Machine) -> float:
    return 2 * (n - 1) * m.alpha + 2 * (n - 1) / n * s * m.beta + (n - 1) / n * s * m.gamma


# -- broadcast and reduce ----------------------------------------------------------------------

@model("broadcast", "binomial")
def _binomial_broadcast(n: int, s: float, m: Machine) -> float:
    return _log2(n) * (m.alpha + s * m.beta)


@model("broadcast", "pipeline")
def _pipeline_broadcast(n: int, s: float, m: Machine) -> float:
    return _pipeline(n - 1, s, m)


@model("broadcast", "scatter_allgather")
def _scatter_allgather(n: int, s: float, m: Machine) -> float:
    return n * m.alpha + (n - 1) / n * s * m.beta + (n - 1) * m.alpha + (n - 1) / n * s * m.beta


@model("broadcast", "direct")
def _direct_broadcast(n: int, s: float, m: Machine) -> float:
    return (n - 1) * (m.alpha + s * m.beta)


@model("reduce", "binomial")
def _binomial_reduce(n: int, s: float, m: Machine) -> float:
    return _log2(n) * (m.alpha + s * m.beta + s * m.gamma)


@model("reduce", "direct")
def _direct_reduce(n: int, s: float, m: Machine) -> float:
    return (n - 1) * (m.alpha + s * m.beta + s * m.gamma)


@model("reduce", "ring")
def _ring_reduce(n: int, s: float, m: Machine) -> float:
    return 2 * (n - 1) * m.alpha + 2 * (n - 1) / n * s * m.beta + (n - 1) / n * s * m.gamma


# -- all_gather, reduce_scatter, all_to_all, gather, scatter, barrier ---------------------------

@model("all_gather", "ring")
def _ring_all_gather(n: int, s: float, m: Machine) -> float:
    return (n - 1) * m.alpha + (n - 1) / n * s * m.beta


@model("all_gather", "recursive_doubling")
def _log_all_gather(n: int, s: float, m: Machine) -> float:
    return _log2(n) * m.alpha + (n - 1) / n * s * m.beta + (0 if n & (n - 1) == 0 else s * m.beta)


@model("all_gather", "bruck")
def _bruck_all_gather(n: int, s: float, m: Machine) -> float:
    # as many messages as recursive doubling and no folding, but it gathers into a temporary and
    # rotates it into place: one more pass over the whole output (charged at γ, a memory pass)
    return _log2(n) * m.alpha + (n - 1) / n * s * m.beta + s * m.gamma


@model("reduce_scatter", "ring", "pairwise")
def _linear_reduce_scatter(n: int, s: float, m: Machine) -> float:
    return (n - 1) * m.alpha + (n - 1) / n * s * (m.beta + m.gamma)


@model("reduce_scatter", "recursive_halving")
def _halving_reduce_scatter(n: int, s: float, m: Machine) -> float:
    return _log2(n) * m.alpha + (n - 1) / n * s * (m.beta + m.gamma) + _fold(n, s, m)


@model("all_to_all", "pairwise")
@model("all_to_all_v", "pairwise")
def _pairwise_all_to_all(n: int, s: float, m: Machine) -> float:
    return (n - 1) * (m.alpha + s / n * m.beta)


@model("all_to_all", "direct")
@model("all_to_all_v", "direct")
def _direct_all_to_all(n: int, s: float, m: Machine) -> float:
    return (n - 1) * m.alpha + (n - 1) / n * s * m.beta * 1.1   # everything in flight contends


# A numpy call of bruck's packing (a gather or scatter of blocks by index, the working copy, the
# final gather) costs its software whatever the network: about this much a call, as `colls bench`
# measures bruck against pairwise on small blocks (bench/RESULTS.md).
PACKING_CALL_SECONDS = 1.8e-6


@model("all_to_all", "bruck")
@model("all_to_all_v", "bruck")
def _bruck_all_to_all(n: int, s: float, m: Machine) -> float:
    """Each step sends half the blocks and packs and unpacks them (s·β in copies); the packing's
    2 calls a step and the 2 around the steps cost software: with shm's default constants,
    pairwise up to 6 ranks, bruck for small blocks from 7 (MPICH takes it for blocks up to 256 B
    from 8 ranks)."""
    steps = _log2(n)
    return steps * (m.alpha + s / 2 * m.beta + s * m.beta) + (2 * steps + 2) * PACKING_CALL_SECONDS


@model("gather", "binomial")
@model("scatter", "binomial")
def _binomial_gather(n: int, s: float, m: Machine) -> float:
    return _log2(n) * m.alpha + (n - 1) / n * s * m.beta * 1.5   # the subtree copies


@model("gather", "direct")
@model("scatter", "direct")
def _direct_gather(n: int, s: float, m: Machine) -> float:
    return (n - 1) * m.alpha + (n - 1) / n * s * m.beta


@model("barrier", "dissemination")
def _dissemination(n: int, s: float, m: Machine) -> float:
    return _log2(n) * m.alpha
