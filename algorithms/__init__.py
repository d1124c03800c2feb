"""What moves when: every collective's schedules, written once over `transports.base.Channel`."""

from . import allgather, allreduce, alltoall, barrier, broadcast, gather, hierarchical, reduce, reduce_scatter
from .ops import AVG, BAND, BOR, BUILTIN, BXOR, MAX, MIN, PROD, SUM, Op
from .registry import CATALOGUE, Algorithm, algorithm, lookup, names, register

__all__ = [
    "allgather", "allreduce", "alltoall", "barrier", "broadcast", "gather", "hierarchical", "reduce",
    "reduce_scatter",
    "AVG", "BAND", "BOR", "BUILTIN", "BXOR", "MAX", "MIN", "PROD", "SUM", "Op",
    "CATALOGUE", "Algorithm", "algorithm", "lookup", "names", "register",
]

# The algorithm each collective uses when none is asked for (selection by cost comes later).
DEFAULTS = {
    "all_reduce": "ring", "broadcast": "binomial", "reduce": "binomial", "all_gather": "ring",
    "reduce_scatter": "ring", "all_to_all": "pairwise", "all_to_all_v": "pairwise",
    "gather": "direct", "scatter": "direct", "barrier": "dissemination",
}
