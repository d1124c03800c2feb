"""gather and scatter: blocks to and from one root, as the other collectives of `Collectives` run
them (describe, then execute: `colls.collectives`)."""

from __future__ import annotations

import numpy as np

from .describe import Result, apart_from, deliver
from .device import module_of


class GatherScatter:
    """Mixin with gather and scatter; `Communicator` supplies what `Collectives` says."""

    def gather(self, x, root: int = 0, out: np.ndarray | None = None, algorithm: str | None = None,
               async_op: bool = False, timeout: float | None = None) -> Result:
        """Concatenate every rank's `x` along axis 0 on `root`.

        Args:
            x: this rank's block (same shape and dtype on every rank).
            root: the rank that gets the result.
            out: where the root's result goes, of shape (size * rows, ...).
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            The gathered array on the root, None on the others (or a `Work` handle).

        Raises:
            InvalidArgument: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("gather", timeout)
        x = check.rows("gather", check.array("gather", x))
        root = check.root("gather", root)
        description = self._describe("gather", x, None, root, algorithm)
        result = work = None
        if self.rank == root:
            result, work = check.result("gather", out, description.out_shape, x.dtype, like=x)
        return self._execute(description, self._run_gather, (x, work, result), async_op, limit)

    def _run_gather(self, channel, description, args):
        x, work, result = args
        description.algorithm.run(channel, x.reshape(-1), None if work is None else work.reshape(-1),
                                  description.root)
        return None if work is None else deliver(result, work)

    def scatter(self, x, root: int = 0, out: np.ndarray | None = None, algorithm: str | None = None,
                async_op: bool = False, timeout: float | None = None) -> Result:
        """Give rank i block i of the root's `x` (axis 0 in size equal blocks).

        Every rank passes an `x` of the root's shape and dtype (only the root's contents are read),
        or an `out` of the block's shape, as MPI ranks describe their receive buffers.

        Args:
            x: the blocks on the root; on the others, an array of its shape, or None with `out`.
            root: the rank whose blocks are sent.
            out: where this rank's block goes.
            algorithm, async_op, timeout: as for `all_reduce`.

        Returns:
            This rank's block (`out` where given), or a `Work` handle.

        Raises:
            InvalidArgument: a bad argument, before any byte moves.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the call could not complete.
        """
        check = self._check
        limit = self.timeout if timeout is None else check.timeout("scatter", timeout)
        if x is None and out is not None and self.rank != root:
            x = module_of(out).empty((self.size * out.shape[0], *out.shape[1:]) if out.ndim else (self.size,),
                                    out.dtype)
        x = check.rows("scatter", check.array("scatter", x))
        root = check.root("scatter", root)
        description = self._describe("scatter", x, None, root, algorithm)
        result, work = check.result("scatter", out, description.out_shape, x.dtype, like=x)
        send = None
        if self.rank == root:
            # the root's blocks are read after its own lands in `out`: an `out` over `x` needs a copy
            send = apart_from(x, work)
            send = x.copy() if send is None and async_op else send
            send = None if send is None else send.reshape(-1)
        return self._execute(description, self._run_scatter, (x, send, work, result), async_op, limit)

    def _run_scatter(self, channel, description, args):
        x, send, work, result = args
        if send is None and channel.rank == description.root:
            send = self._scratch(x)
        description.algorithm.run(channel, send, work.reshape(-1), description.root)
        return deliver(result, work)

