"""The collectives of `Communicator`: describe, then execute, one path for every kind of call.

Each collective checks its buffers, gets the call's `Description` (checked and compiled once per
signature: `Communicator._describe`), and hands it with its buffers and one of the bodies below to
`Communicator._execute`, which runs blocking, `async_op=True` and persistent (`*_init`) calls
alike. Buffers handed to algorithms are flat views, so nothing is copied twice.

An input is read where it lies unless the algorithm writes into it or the output overlaps it: then
a blocking or persistent call reads a copy in the communicator's scratch (made when the body runs),
and an `async_op=True` call a copy made at issue (its caller may change `x` before the body runs).
"""

from __future__ import annotations

import numpy as np

from algorithms import SUM, Op, lookup
from algorithms.blocks import offsets, run_schedule

from .describe import Result, apart_from, deliver
from .device import module_of
from .gather_scatter import GatherScatter
from .persistent import Persistent

__all__ = ["Collectives", "Result"]


class Collectives(GatherScatter):
    """Mixin with every collective (gather and scatter in `GatherScatter`); `Communicator` supplies
    `_check`, `_describe`, `_execute`, `_scratch`, `rank` and `size`."""

    # -- all_reduce ------------------------------------------------------------------------------

    def all_reduce(self, x, op: Op | str = SUM, out: np.ndarray | None = None, algorithm: str | None = None,
                   async_op: bool = False, timeout: float | None = None) -> Result:
        """Reduce `x` over all ranks with `op`; every rank gets the same result.

        Args:
            x: this rank's contribution (numpy array; cupy over cuda_ipc); any shape.
            op: colls.SUM, MAX, ... or a name ("sum") or a colls.Op.
            out: where the result goes (same shape and dtype as `x`; `out=x` reduces in place).
            algorithm: a name from `colls.algorithms("all_reduce")`; None lets colls choose.
            async_op: return a `Work` handle at once instead of the result.
            timeout: seconds this call may wait (default: the communicator's).

        Returns:
            The reduced array (`out` where given), or a `Work` whose `wait()` returns it.

        Raises:
            InvalidArgument: a bad argument (named, with this rank), before any byte moves.
            TypeError: an op that is not defined on the dtype.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        return self._all_reduce(x, op, out, algorithm, async_op, timeout, False)

    def all_reduce_init(self, x, op: Op | str = SUM, out: np.ndarray | None = None,
                        algorithm: str | None = None, timeout: float | None = None) -> Persistent:
        """A persistent all_reduce of `x` into `out` (MPI_Allreduce_init): checked once, run by
        `start()`/`wait()` or by calling it, as often as wanted; `x` is read at each start.

        Args:
            x, op, out, algorithm, timeout: as for `all_reduce` (`out` None: a fresh array, kept).

        Returns:
            A `colls.Persistent` handle.

        Raises:
            InvalidArgument, TypeError: as `all_reduce` would, now rather than at each start.
        """
        return self._all_reduce(x, op, out, algorithm, False, timeout, True)

    def _all_reduce(self, x, op, out, algorithm, async_op, timeout, persistent):
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("all_reduce", timeout)
        if type(x) is not np.ndarray or not x.flags.c_contiguous:   # (else nothing to convert: no call)
            x = check.array("all_reduce", x)
        description = self._describe("all_reduce", x, op, None, algorithm)
        if type(x) is not np.ndarray:
            result, work = check.result("all_reduce", out, x.shape, x.dtype, like=x)
        elif out is None:
            result = work = np.empty(x.shape, x.dtype)
        elif out is x and x.flags.writeable or (type(out) is np.ndarray and out.shape == x.shape
                                                and out.dtype is x.dtype and out.flags.c_contiguous
                                                and out.flags.writeable):   # (else: `check.result`)
            result = work = out   # (what `check.result` concludes for a usable out, without the call)
        else:
            result, work = check.result("all_reduce", out, x.shape, x.dtype, like=x)
        source = None
        if work is not x:
            # a schedule that reads the input itself is spared the copy, unless the call returns
            # before it runs (async: the input may change) or the output overlaps the input
            if description.algorithm.takes_source and description.schedule is None and not async_op \
                    and (out is None or not np.may_share_memory(x, work)):
                source = x.reshape(-1)
            elif async_op:
                work[...] = x
                x = work
        args = (x, work, result, source)
        if persistent:
            return Persistent(self, description, self._run_all_reduce, args, limit)
        return self._execute(description, self._run_all_reduce, args, async_op, limit)

    def _run_all_reduce(self, channel, description, args) -> np.ndarray:
        x, work, result, source = args
        flat = work if work.ndim == 1 else work.reshape(-1)
        op = description.op
        if source is not None:
            description.algorithm.run(channel, flat, op, source)
        else:
            if work is not x:
                work[...] = x
            if description.schedule is not None:
                run_schedule(channel, flat, flat, description.schedule, description.exchanges)
            else:
                description.algorithm.run(channel, flat, op)
        if op.finishes:
            op.finish(flat, channel.size)
        return work if result is work else deliver(result, work)

    # -- broadcast -------------------------------------------------------------------------------

    def broadcast(self, x, root: int = 0, out: np.ndarray | None = None, algorithm: str | None = None,
                  async_op: bool = False, timeout: float | None = None) -> Result:
        """Copy the root's `x` to every rank.

        Args:
            x: the data on the root; on the others an array of the same shape and dtype.
            root: the rank whose `x` is sent.
            out: where the result goes (`out=x`: in place); default a fresh array.
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            The root's data (`out` where given), or a `Work` handle.

        Raises:
            InvalidArgument: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        return self._broadcast(x, root, out, algorithm, async_op, timeout, False)

    def broadcast_init(self, x, root: int = 0, out: np.ndarray | None = None, algorithm: str | None = None,
                       timeout: float | None = None) -> Persistent:
        """A persistent broadcast (MPI_Bcast_init); arguments and errors as `broadcast`'s.

        Returns:
            A `colls.Persistent` handle; the root's `x` is read at each start.
        """
        return self._broadcast(x, root, out, algorithm, False, timeout, True)

    def _broadcast(self, x, root, out, algorithm, async_op, timeout, persistent):
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("broadcast", timeout)
        x = check.array("broadcast", x)
        root = check.root("broadcast", root)
        description = self._describe("broadcast", x, None, root, algorithm)
        result, work = check.result("broadcast", out, x.shape, x.dtype, like=x)
        if async_op and work is not x and self.rank == root:
            work[...] = x
            x = work
        args = (x, work, result)
        if persistent:
            return Persistent(self, description, self._run_broadcast, args, limit)
        return self._execute(description, self._run_broadcast, args, async_op, limit)

    def _run_broadcast(self, channel, description, args) -> np.ndarray:
        x, work, result = args
        if work is not x and channel.rank == description.root:
            work[...] = x
        description.algorithm.run(channel, work if work.ndim == 1 else work.reshape(-1), description.root)
        return work if result is work else deliver(result, work)

    # -- reduce ----------------------------------------------------------------------------------

    def reduce(self, x, root: int = 0, op: Op | str = SUM, out: np.ndarray | None = None,
               algorithm: str | None = None, async_op: bool = False, timeout: float | None = None) -> Result:
        """Reduce `x` over all ranks onto `root`.

        Args:
            x: this rank's contribution.
            root: the rank that gets the result.
            op, algorithm, async_op, timeout: as for `all_reduce`.
            out: where the root's result goes (ignored on the other ranks).

        Returns:
            The reduction on the root, None on the others (or a `Work` handle).

        Raises:
            InvalidArgument, TypeError: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("reduce", timeout)
        x = check.array("reduce", x)
        root = check.root("reduce", root)
        description = self._describe("reduce", x, op, root, algorithm)
        # every rank's buffer is scratch for the tree: the root's is its result, the others' a copy
        result = work = send = None
        if self.rank == root:
            result, work = check.result("reduce", out, x.shape, x.dtype, like=x)
            if async_op:
                work[...] = x
                x = work
        elif async_op:
            send = x.copy().reshape(-1)
        return self._execute(description, self._run_reduce, (x, work, result, send), async_op, limit)

    def _run_reduce(self, channel, description, args):
        x, work, result, send = args
        op = description.op
        if work is None:   # not the root: the tree folds into a copy of my input
            description.algorithm.run(channel, self._scratch(x) if send is None else send, op,
                                      description.root)
            return None
        if work is not x:
            work[...] = x
        flat = work.reshape(-1)
        description.algorithm.run(channel, flat, op, description.root)
        op.finish(flat, channel.size)
        return deliver(result, work)

    # -- all_gather ------------------------------------------------------------------------------

    def all_gather(self, x, out: np.ndarray | None = None, algorithm: str | None = None,
                   async_op: bool = False, timeout: float | None = None) -> Result:
        """Concatenate every rank's `x` along axis 0, in rank order, on every rank.

        Args:
            x: this rank's block (same shape and dtype on every rank; a scalar counts as one row).
            out: where the result goes, of shape (size * rows, ...); may hold `x` as its block.
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            The gathered array (`out` where given), or a `Work` handle.

        Raises:
            InvalidArgument: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        return self._blocks("all_gather", x, out, algorithm, async_op, timeout, False)

    def all_gather_init(self, x, out: np.ndarray | None = None, algorithm: str | None = None,
                        timeout: float | None = None) -> Persistent:
        """A persistent all_gather (MPI_Allgather_init); arguments and errors as `all_gather`'s.

        Returns:
            A `colls.Persistent` handle; `x` is read at each start.
        """
        return self._blocks("all_gather", x, out, algorithm, False, timeout, True)

    def all_to_all(self, x, out: np.ndarray | None = None, algorithm: str | None = None,
                   async_op: bool = False, timeout: float | None = None) -> Result:
        """Send block i of axis 0 to rank i; block j of the result came from rank j.

        Args:
            x: `size` equal blocks along axis 0.
            out: where the result goes (same shape and dtype as `x`).
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            The exchanged array (`out` where given), or a `Work` handle.

        Raises:
            InvalidArgument: a bad argument (axis 0 not divisible by size...), before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        return self._blocks("all_to_all", x, out, algorithm, async_op, timeout, False)

    def all_to_all_init(self, x, out: np.ndarray | None = None, algorithm: str | None = None,
                        timeout: float | None = None) -> Persistent:
        """A persistent all_to_all (MPI_Alltoall_init); arguments and errors as `all_to_all`'s.

        Returns:
            A `colls.Persistent` handle; `x` is read at each start.
        """
        return self._blocks("all_to_all", x, out, algorithm, False, timeout, True)

    def _blocks(self, collective, x, out, algorithm, async_op, timeout, persistent):
        """all_gather and all_to_all: every rank sends blocks of `x` and receives blocks of `out`."""
        check = self._check
        limit = self.timeout if timeout is None else check.timeout(collective, timeout)
        if type(x) is not np.ndarray or not x.flags.c_contiguous or not x.ndim:
            x = check.rows(collective, check.array(collective, x))
        description = self._describe(collective, x, None, None, algorithm)
        result, work = check.result(collective, out, description.out_shape, x.dtype, like=x)
        # blocks are read after others land: an `out` over `x` needs a copy of `x` (but see `apart_from`)
        send = x if out is None else apart_from(x, work, self.rank if collective == "all_gather" else None)
        send = None if send is None else send.reshape(-1)
        if send is None and async_op:
            send = x.copy().reshape(-1)
        args = (x, send, work, result)
        if persistent:
            return Persistent(self, description, self._run_blocks, args, limit)
        return self._execute(description, self._run_blocks, args, async_op, limit)

    def _run_blocks(self, channel, description, args) -> np.ndarray:
        x, send, work, result = args
        if send is None:
            send = self._scratch(x)
        flat = work if work.ndim == 1 else work.reshape(-1)
        if description.schedule is not None:
            run_schedule(channel, send, flat, description.schedule, description.exchanges)
        else:
            description.algorithm.run(channel, send, flat)
        return work if result is work else deliver(result, work)

    # -- reduce_scatter --------------------------------------------------------------------------

    def reduce_scatter(self, x, op: Op | str = SUM, out: np.ndarray | None = None,
                       algorithm: str | None = None, async_op: bool = False,
                       timeout: float | None = None) -> Result:
        """Reduce `x` over all ranks and give rank i block i of axis 0.

        Args:
            x: `size` equal blocks along axis 0.
            op, algorithm, async_op, timeout: as for `all_reduce`.
            out: where this rank's block goes, of shape (rows / size, ...).

        Returns:
            This rank's reduced block (`out` where given), or a `Work` handle.

        Raises:
            InvalidArgument, TypeError: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        return self._reduce_scatter(x, op, out, algorithm, async_op, timeout, False)

    def reduce_scatter_init(self, x, op: Op | str = SUM, out: np.ndarray | None = None,
                            algorithm: str | None = None, timeout: float | None = None) -> Persistent:
        """A persistent reduce_scatter (MPI_Reduce_scatter_block_init); arguments and errors as
        `reduce_scatter`'s.

        Returns:
            A `colls.Persistent` handle; `x` is read at each start.
        """
        return self._reduce_scatter(x, op, out, algorithm, False, timeout, True)

    def _reduce_scatter(self, x, op, out, algorithm, async_op, timeout, persistent):
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("reduce_scatter", timeout)
        x = check.rows("reduce_scatter", check.array("reduce_scatter", x))
        description = self._describe("reduce_scatter", x, op, None, algorithm)
        result, work = check.result("reduce_scatter", out, description.out_shape, x.dtype, like=x)
        # most schedules fold partial sums into their input, so they work on a copy; one that only
        # reads it is given `x` itself (unless the output overlaps it)
        send = None
        if description.algorithm.reads_input_only and (out is None or not np.shares_memory(x, work)):
            send = x.reshape(-1)
        elif async_op:
            send = x.copy().reshape(-1)
        args = (x, send, work, result)
        if persistent:
            return Persistent(self, description, self._run_reduce_scatter, args, limit)
        return self._execute(description, self._run_reduce_scatter, args, async_op, limit)

    def _run_reduce_scatter(self, channel, description, args) -> np.ndarray:
        x, send, work, result = args
        flat = work if work.ndim == 1 else work.reshape(-1)
        op = description.op
        description.algorithm.run(channel, self._scratch(x) if send is None else send, flat, op)
        op.finish(flat, channel.size)
        return work if result is work else deliver(result, work)

    # -- the rest --------------------------------------------------------------------------------

    def all_to_all_v(self, x, send_counts, algorithm: str | None = None, async_op: bool = False,
                     timeout: float | None = None) -> Result:
        """Send `send_counts[i]` rows of axis 0 to rank i.

        Args:
            x: the rows to send, grouped by destination rank.
            send_counts: how many rows go to each rank (`size` ints adding up to len(x)).
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            (the rows received, in rank order; the list of counts received from each rank), or a
            `Work` handle.

        Raises:
            InvalidArgument: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("all_to_all_v", timeout)
        x = check.rows("all_to_all_v", check.array("all_to_all_v", x))
        counts = check.counts("all_to_all_v", send_counts, x.shape[0])
        description = self._describe("all_to_all_v", x, None, None, algorithm)
        return self._execute(description, self._run_all_to_all_v, (x, counts), async_op, limit)

    def _run_all_to_all_v(self, channel, description, args):
        x, counts = args
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        send_elements = [c * row for c in counts]
        # first the counts (one int64 per peer, pairwise), then the rows themselves
        mine = np.asarray(counts, np.int64)
        theirs = np.empty(self.size, np.int64)
        lookup("all_to_all", "pairwise").run(channel, mine, theirs)
        recv_counts = theirs.tolist()
        out = module_of(x).empty((sum(recv_counts), *x.shape[1:]), x.dtype)
        recv_elements = [c * row for c in recv_counts]
        description.algorithm.run(channel, x.reshape(-1), send_elements, offsets(send_elements),
                                  out.reshape(-1), recv_elements, offsets(recv_elements))
        return out, recv_counts

    def barrier(self, algorithm: str | None = None, async_op: bool = False,
                timeout: float | None = None) -> Result:
        """Return only once every rank of the group has entered the barrier.

        Args:
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            None, or a `Work` handle.

        Raises:
            InvalidArgument: a bad argument.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        limit = self.timeout if timeout is None else self._check.timeout("barrier", timeout)
        description = self._describe("barrier", None, None, None, algorithm)
        return self._execute(description, _run_barrier, (), async_op, limit)


def _run_barrier(channel, description, args) -> None:
    description.algorithm.run(channel)
