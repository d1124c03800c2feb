"""Persistent collectives, MPI-4 style: a call checked once, then started as often as wanted.

    h = comm.all_reduce_init(x, out=y)
    for step in range(steps):
        ...            # write x
        h.start()      # posted behind earlier calls; runs while this rank does other work
        ...
        h.wait()       # y holds the sum

`h()` is `h.start(); h.wait()` in one blocking step. Every rank starts its handles in the same
order as its other calls, as with any collective. The handle binds its buffers: `x` is read at each
start, the result lands in the same `out` each time.
"""

from __future__ import annotations

from typing import Any

from transports.errors import InvalidArgument


class Persistent:
    """A persistent collective request (MPI_Allreduce_init and friends); made by `Communicator`'s
    `*_init` methods, not directly."""

    def __init__(self, comm: Any, description: Any, body: Any, args: tuple, limit: float) -> None:
        self._comm = comm
        self.description = description
        self._body = body
        self._args = args
        self._limit = limit
        self._work: Any = None   # the running start's handle, until `wait`

    def __repr__(self) -> str:
        return f"<colls.Persistent {self.description.group} {self.description.label(-1)}>"

    def start(self) -> None:
        """Post one run of the call, behind every call this rank issued before it.

        Raises:
            InvalidArgument: the handle was started and not yet waited for, or the communicator
                is closed.
        """
        if self._work is not None:
            raise InvalidArgument(f"rank {self._comm.rank}: {self.description.collective}: this persistent "
                                  f"request was started and not waited for; call wait() first")
        self._work = self._comm._execute(self.description, self._body, self._args, True, self._limit)

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the run `start` posted and return its result (the same `out` every time).

        Args:
            timeout: wait at most this long (the call's own deadline bounds it anyway).

        Returns:
            The call's result, as the blocking collective returns it.

        Raises:
            InvalidArgument: the handle was not started.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the run could not complete.
        """
        work = self._work
        if work is None:
            raise InvalidArgument(f"rank {self._comm.rank}: {self.description.collective}: wait() on a "
                                  f"persistent request that was not started")
        try:
            return work.wait(timeout)
        finally:
            if work.is_completed():
                self._work = None

    def is_completed(self) -> bool:
        """Whether the last start has finished (True when none is running)."""
        return self._work is None or self._work.is_completed()

    def __call__(self) -> Any:
        """Run the call once and wait for it (`start(); wait()`, blocking in this thread).

        Returns:
            The call's result.

        Raises:
            InvalidArgument: the handle is started and not waited for, or the communicator is closed.
            CollectiveTimeout, PeerLost, CommunicatorAborted: the run could not complete.
        """
        if self._work is not None:
            raise InvalidArgument(f"rank {self._comm.rank}: {self.description.collective}: this persistent "
                                  f"request was started and not waited for; call wait() first")
        return self._comm._execute(self.description, self._body, self._args, False, self._limit)
