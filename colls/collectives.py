"""The collectives of `Communicator`: each checks its arguments, prepares buffers, then runs one
algorithm over a `Channel`. Buffers handed to algorithms are flat views, so nothing is copied twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from algorithms import SUM, Op, lookup
from algorithms.blocks import offsets

from .describe import PLAN_BYTES, Plan
from .device import module_of

if TYPE_CHECKING:
    from .communicator import Communicator

Result = Any  # the array (or None), or a Work handle when async_op=True
NOTHING = object()   # a planned call that returns None (a reduce's non-root rank)


class Collectives:
    """Mixin with every collective; `Communicator` supplies `_check`, `_run` and the transport."""

    def all_reduce(self: Communicator, x, op: Op | str = SUM, out: np.ndarray | None = None,
                   algorithm: str | None = None, async_op: bool = False,
                   timeout: float | None = None) -> Result:
        """Reduce `x` over all ranks with `op`; every rank gets the same result (`out=x`: in place)."""
        check = self._check
        if (algorithm is None or type(algorithm) is str) and not async_op and type(x) is np.ndarray:
            try:   # a small call seen before (with the algorithm chosen or forced alike): see `Plan`
                plan = check.plans.get((op, x.dtype, x.shape, algorithm))
            except TypeError:   # an unhashable op: the checks below name it
                plan = None
            # the planned path, inline (each frame costs): the buffers pass as the planned call's
            # did (else the full checks), nothing is queued before it, no tracing, open
            if plan is not None and x.flags.c_contiguous:
                if out is None:
                    planned = np.empty(plan.shape, x.dtype)
                elif out is x:
                    planned = x if x.flags.writeable else None   # read-only: the full checks say so
                elif (type(out) is np.ndarray and out.shape == plan.shape and out.dtype == x.dtype
                      and out.flags.c_contiguous and out.flags.writeable):
                    planned = out
                else:
                    planned = None
                if (planned is not None and not self._executor.pending and not self._tracer.active
                        and not self.closed):
                    return self._run_planned(plan, x, planned, timeout)
        x = check.array("all_reduce", x)
        signature = (op, x.dtype, x.shape, algorithm)
        op, algo = check.reduction("all_reduce", op, x.dtype, algorithm, x.nbytes)
        result, work = check.result("all_reduce", out, x.shape, x.dtype, like=x)
        if x.nbytes <= PLAN_BYTES and algo.name != "hierarchical":
            exchanges = algo.exchanges and algo.exchanges(self.rank, self.size, op)
            if exchanges:   # each made persistent, its copies worked out once (`persistent_exchange`)
                exchanges = tuple((peer, self._channel.persistent_exchange(x.dtype, x.size, peer, fold))
                                  for peer, fold in exchanges)
            check.keep_plan(signature, Plan("all_reduce", op, algo, x.shape, x.dtype, self.name, exchanges))
        source = None
        if work is not x:
            # a schedule that reads the input itself is spared the copy, unless the call returns
            # before it runs (async: the input may change) or the output overlaps the input
            if algo.takes_source and not async_op and not np.may_share_memory(x, work):
                source = x.reshape(-1)
            else:
                np.copyto(work, x)
        flat = work if work.ndim == 1 else work.reshape(-1)

        def body(channel):
            if source is None:
                algo.run(channel, flat, op)
            else:
                algo.run(channel, flat, op, source)
            if op.finishes:
                op.finish(flat, self.size)
            return _deliver(result, work)

        return self._run("all_reduce", algo.name, x, body, async_op, timeout, op=op)

    def broadcast(self: Communicator, x, root: int = 0, out: np.ndarray | None = None,
                  algorithm: str | None = None, async_op: bool = False,
                  timeout: float | None = None) -> Result:
        """Copy the root's `x` to every rank; all ranks pass arrays of the same shape and dtype."""
        planned = self._run_planned_broadcast(x, root, out, algorithm, async_op, timeout)
        if planned is not None:   # a signature seen before: see `Plan`
            return planned
        check = self._check
        x = check.array("broadcast", x)
        root = check.root("broadcast", root)
        algo = check.algorithm("broadcast", algorithm, None, x.nbytes)
        result, work = check.result("broadcast", out, x.shape, x.dtype, like=x)
        if algo.name != "hierarchical" and (x.dtype, x.shape, root, algorithm) not in check.broadcast_plans:
            # later calls of this signature: planned
            check.keep_block_plan(Plan("broadcast", None, algo, x.shape, x.dtype, self.name, root=root),
                                  algorithm)
        if self.rank == root and work is not x:
            np.copyto(work, x)
        flat = work.reshape(-1)

        def body(channel):
            algo.run(channel, flat, root)
            return _deliver(result, work)

        return self._run("broadcast", algo.name, x, body, async_op, timeout, root=root)

    def reduce(self: Communicator, x, root: int = 0, op: Op | str = SUM, out: np.ndarray | None = None,
               algorithm: str | None = None, async_op: bool = False,
               timeout: float | None = None) -> Result:
        """Reduce `x` over all ranks onto `root`; the root gets the result, the others None."""
        check = self._check
        planned = self._run_planned_reduce(x, root, op, out, algorithm, async_op, timeout)
        if planned is not None:   # a signature seen before: see `Plan`
            return None if planned is NOTHING else planned
        as_given = op
        x = check.array("reduce", x)
        root = check.root("reduce", root)
        op, algo = check.reduction("reduce", op, x.dtype, algorithm, x.nbytes)
        given = check.output("reduce", out, x.shape, x.dtype, like=x) if self.rank == root else None
        if algo.name != "hierarchical" and type(x) is np.ndarray:
            check.keep_reduction_plan(("reduce", as_given, x.dtype, x.shape, root, algorithm),
                                      Plan("reduce", op, algo, x.shape, x.dtype, self.name, root=root))
        # every rank's buffer is scratch for the tree: the root's is its result (its `out`, filled
        # when the call runs, or a fresh copy); the others' the communicator's scratch
        if self.rank != root:
            work = None
        elif type(given) is np.ndarray and given.flags.c_contiguous:
            work = given   # the root reduces straight into its out: no copy of x made
            if async_op:
                np.copyto(given, x)   # now: the caller may change x before the body runs
        else:
            work = x.copy()
        source = None if work is not None else self._source(x, None, async_op)

        def body(channel):
            if given is not None and work is given and not async_op:
                np.copyto(given, x)   # (in the body: a call refused before it runs leaves out alone)
            flat = source() if work is None else work.reshape(-1)
            algo.run(channel, flat, op, root)
            if self.rank != root:
                return None
            op.finish(flat, self.size)
            if given is not None and given is not work:
                given[...] = work
            return work if given is None else given

        return self._run("reduce", algo.name, x, body, async_op, timeout, root=root, op=op)

    def all_gather(self: Communicator, x, out: np.ndarray | None = None, algorithm: str | None = None,
                   async_op: bool = False, timeout: float | None = None) -> Result:
        """Concatenate every rank's `x` along axis 0, in rank order, on every rank."""
        check = self._check
        planned = self._run_planned_blocks("all_gather", x, out, algorithm, async_op, timeout)
        if planned is not None:   # a signature seen before: see `Plan`
            return planned
        x = check.rows("all_gather", check.array("all_gather", x))
        algo = check.algorithm("all_gather", algorithm, None, self.size * x.nbytes)
        shape = (self.size * x.shape[0], *x.shape[1:])
        result, work = check.result("all_gather", out, shape, x.dtype, like=x)
        self._keep_block_plan("all_gather", x, algorithm, algo, shape)

        source = self._source(x, apart_from(x, work, self.rank), async_op)

        def body(channel):
            algo.run(channel, source(), work.reshape(-1))
            return _deliver(result, work)

        return self._run("all_gather", algo.name, x, body, async_op, timeout)

    def reduce_scatter(self: Communicator, x, op: Op | str = SUM, out: np.ndarray | None = None,
                       algorithm: str | None = None, async_op: bool = False,
                       timeout: float | None = None) -> Result:
        """Reduce `x` over all ranks and give rank i block i of axis 0 (size equal blocks)."""
        check = self._check
        planned = self._run_planned_reduce_scatter(x, op, out, algorithm, async_op, timeout)
        if planned is not None:   # a signature seen before: see `Plan`
            return planned
        given = op
        x = check.rows("reduce_scatter", check.array("reduce_scatter", x))
        rows = check.divisible("reduce_scatter", x)
        op, algo = check.reduction("reduce_scatter", op, x.dtype, algorithm, x.nbytes)
        shape = (rows, *x.shape[1:])
        result, work = check.result("reduce_scatter", out, shape, x.dtype, like=x)
        if algo.name != "hierarchical" and type(x) is np.ndarray:
            check.keep_reduction_plan(("reduce_scatter", given, x.dtype, x.shape, algorithm),
                                      Plan("reduce_scatter", op, algo, x.shape, x.dtype, self.name,
                                           out_shape=shape))
        # most schedules fold partial sums into their input buffer, so they work on a copy (in the
        # communicator's scratch, made in the body); one that only reads it is given `x` itself
        # (unless the output overlaps it)
        source = self._source(x, x if algo.reads_input_only and not np.shares_memory(x, work) else None,
                              async_op)

        def body(channel):
            flat = work.reshape(-1)
            algo.run(channel, source(), flat, op)
            op.finish(flat, self.size)
            return _deliver(result, work)

        return self._run("reduce_scatter", algo.name, x, body, async_op, timeout, op=op)

    def all_to_all(self: Communicator, x, out: np.ndarray | None = None, algorithm: str | None = None,
                   async_op: bool = False, timeout: float | None = None) -> Result:
        """Send block i of axis 0 to rank i; block j of the result came from rank j."""
        check = self._check
        planned = self._run_planned_blocks("all_to_all", x, out, algorithm, async_op, timeout)
        if planned is not None:   # a signature seen before: see `Plan`
            return planned
        x = check.rows("all_to_all", check.array("all_to_all", x))
        check.divisible("all_to_all", x)
        algo = check.algorithm("all_to_all", algorithm, None, x.nbytes)
        result, work = check.result("all_to_all", out, x.shape, x.dtype, like=x)
        self._keep_block_plan("all_to_all", x, algorithm, algo, x.shape)
        source = self._source(x, apart_from(x, work), async_op)

        def body(channel):
            algo.run(channel, source(), work.reshape(-1))
            return _deliver(result, work)

        return self._run("all_to_all", algo.name, x, body, async_op, timeout)

    def all_to_all_v(self: Communicator, x, send_counts, algorithm: str | None = None,
                     async_op: bool = False, timeout: float | None = None) -> Result:
        """Send `send_counts[i]` rows of axis 0 to rank i; returns (rows received, recv_counts)."""
        check = self._check
        x = check.rows("all_to_all_v", check.array("all_to_all_v", x))
        counts = check.counts("all_to_all_v", send_counts, x.shape[0])
        algo = check.algorithm("all_to_all_v", algorithm)
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        send_elements = [c * row for c in counts]

        def body(channel):
            # first the counts (one int64 per peer, pairwise), then the rows themselves
            mine = np.asarray(counts, np.int64)
            theirs = np.empty(self.size, np.int64)
            lookup("all_to_all", "pairwise").run(channel, mine, theirs)
            recv_counts = theirs.tolist()
            out = module_of(x).empty((sum(recv_counts), *x.shape[1:]), x.dtype)
            recv_elements = [c * row for c in recv_counts]
            algo.run(channel, x.reshape(-1), send_elements, offsets(send_elements), out.reshape(-1),
                     recv_elements, offsets(recv_elements))
            return out, recv_counts

        return self._run("all_to_all_v", algo.name, x, body, async_op, timeout)

    def gather(self: Communicator, x, root: int = 0, out: np.ndarray | None = None,
               algorithm: str | None = None, async_op: bool = False,
               timeout: float | None = None) -> Result:
        """Concatenate every rank's `x` along axis 0 on `root`; None on the other ranks."""
        check = self._check
        x = check.rows("gather", check.array("gather", x))
        root = check.root("gather", root)
        algo = check.algorithm("gather", algorithm, None, self.size * x.nbytes)
        shape = (self.size * x.shape[0], *x.shape[1:])
        result = work = None
        if self.rank == root:
            result, work = check.result("gather", out, shape, x.dtype, like=x)

        def body(channel):
            algo.run(channel, x.reshape(-1), None if work is None else work.reshape(-1), root)
            return None if work is None else _deliver(result, work)

        return self._run("gather", algo.name, x, body, async_op, timeout, root=root)

    def scatter(self: Communicator, x, root: int = 0, out: np.ndarray | None = None,
                algorithm: str | None = None, async_op: bool = False,
                timeout: float | None = None) -> Result:
        """Give rank i block i of the root's `x` (axis 0 in size equal blocks).

        Every rank passes an `x` of the root's shape and dtype (only the root's contents are read),
        or an `out` of the block's shape, as MPI ranks describe their receive buffers.
        """
        check = self._check
        if x is None and out is not None and self.rank != root:
            x = module_of(out).empty((self.size * out.shape[0], *out.shape[1:]) if out.ndim else (self.size,),
                                    out.dtype)
        x = check.rows("scatter", check.array("scatter", x))
        root = check.root("scatter", root)
        rows = check.divisible("scatter", x)
        algo = check.algorithm("scatter", algorithm, None, x.nbytes)
        shape = (rows, *x.shape[1:])
        result, work = check.result("scatter", out, shape, x.dtype, like=x)
        # the root's blocks are read after its own lands in `out`: an `out` over `x` needs a copy
        source = self._source(x, apart_from(x, work), async_op) if self.rank == root else None

        def body(channel):
            algo.run(channel, None if source is None else source(), work.reshape(-1), root)
            return _deliver(result, work)

        return self._run("scatter", algo.name, x, body, async_op, timeout, root=root)

    def barrier(self: Communicator, algorithm: str | None = None, async_op: bool = False,
                timeout: float | None = None) -> Result:
        """Return only once every rank of the group has entered the barrier."""
        algo = self._check.algorithm("barrier", algorithm)
        return self._run("barrier", algo.name, None, algo.run, async_op, timeout)


def apart_from(x: np.ndarray, work: np.ndarray, own: int | None = None) -> np.ndarray | None:
    """`x`, or None when the output overlaps it (in place): blocks are read after others land, so the
    body sends from a copy (`Communicator._source`). An all_gather's
    input that is its own block of the output (`own`: the rank; torch's all_gather_into_tensor on a
    chunk of its output) is taken where it lies: every all_gather algorithm writes only the other
    blocks, and numpy's copy of a block onto itself moves nothing. (Copying it instead cost 360 us
    against MPI's 55 for a 2-rank in-place 1 MiB all_gather, 2026-12-05.)"""
    if not np.may_share_memory(x, work):
        return x
    if (own is not None and type(x) is np.ndarray and type(work) is np.ndarray   # (device arrays: copied)
            and x.flags.c_contiguous and work.flags.c_contiguous
            and x.__array_interface__["data"][0] == work.__array_interface__["data"][0] + own * x.nbytes):
        return x
    return None


def _deliver(result: np.ndarray | None, work: np.ndarray) -> np.ndarray:
    if result is not None and result is not work:
        result[...] = work
        return result
    return work
