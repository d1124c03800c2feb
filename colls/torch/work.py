"""Asynchronous work for the colls process group: one worker thread per group runs its calls in
issue order (as Gloo's work queue does), and each call's `Work` completes a torch `Future`.

torch calls a process group's methods and gets a `Work` back at once; a blocking
`dist.all_reduce` then waits on it, and DDP's reducer chains its bucket's next step on
`get_future()`. So every call is queued and run by the worker, which sets the future's result
(the output tensors, as torch's own backends do) or its exception; `wait()` re-raises that
exception, which names the call and the peer colls waited for.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from transports.errors import CollectiveTimeout

SLACK_S = 10.0   # what a `wait()` allows beyond the deadlines of the calls queued before its own
EXIT_WAIT_S = 10.0   # how long interpreter exit lets a group's queued calls finish
EXIT_HANDOFF_S = 0.01   # how long interpreter exit leaves the GIL to torch's threads (`_close_at_exit`)


class CollsWork(dist.distributed_c10d.Work):
    """The handle of one call: `wait()` blocks until it ran (re-raising its error), `get_future()`
    gives a torch Future completed with its output tensors."""

    def __init__(self, label: str, outputs: list[torch.Tensor], deadline: float,
                 ran: threading.Condition | None = None) -> None:
        super().__init__()
        self.label = label
        self.outputs = outputs
        self.deadline = deadline   # by then the call has run, or failed with its own timeout
        self.ran = ran             # notified once a queued call has run (None: not queued)
        self.future: Future = Future()
        self.error: BaseException | None = None
        self.done = False
        self.waiter: Callable[[float], None] | None = None   # a point-to-point request to finish on wait
        self.source = -1   # a completed receive's sender

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call has run; re-raise its error.

        Args:
            timeout: wait at most this long (torch's `timedelta(0)` or None: until the call's deadline).

        Returns:
            True.

        Raises:
            CollectiveTimeout, PeerLost, CommunicatorAborted, InvalidArgument, TypeError: what the
                call raised; TimeoutError past `timeout` or the deadline.
        """
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        deadline = self.deadline if not seconds else min(self.deadline, time.monotonic() + seconds)
        if not self.done and self.ran is not None:
            with self.ran:
                self.ran.wait_for(lambda: self.done, max(0.0, deadline - time.monotonic()))
        if not self.done:
            raise CollectiveTimeout(f"{self.label} has not finished after waiting "
                                    f"{seconds or self.deadline - time.monotonic():.1f} s", ())
        if self.waiter is not None and self.error is None:
            try:
                self.waiter(deadline)
            except BaseException as error:  # noqa: BLE001 - handed to the future and re-raised
                self._fail(error)
            else:
                self.waiter = None
                self.future.set_result(self.outputs)
        if self.error is not None:
            raise self.error
        return True

    def get_future(self) -> Future:
        """A torch Future that completes with the output tensors (or the call's error)."""
        return self.future

    def is_completed(self) -> bool:
        """Whether the call has run (successfully or not)."""
        return self.done and self.waiter is None

    def is_success(self) -> bool:
        """Whether the call ran without an error."""
        return self.is_completed() and self.error is None

    def exception(self) -> BaseException | None:
        """The call's error, if it failed."""
        return self.error

    def result(self) -> list[torch.Tensor]:
        """The output tensors."""
        return self.outputs

    def _source_rank(self) -> int:
        """The rank a completed receive's message came from (`dist.recv` without `src` asks; torch's
        C++ `Work::sourceRank` is not reachable from Python, so this name is the one it calls)."""
        if self.source < 0:
            raise RuntimeError(f"{self.label}: only a receive, once waited, knows its source rank")
        return self.source

    def synchronize(self) -> None:
        """Nothing to do on the CPU (torch calls it for device streams)."""

    def _finish(self) -> None:
        self.done = True   # (a queued call's waiters are woken when the worker notifies `ran`)
        if self.waiter is None:
            self.future.set_result(self.outputs)   # runs the callbacks chained on it, here

    def _fail(self, error: BaseException) -> None:
        self.error = error
        self.done = True
        if not self.future.done():
            self.future.set_exception(error)


class Stream:
    """A worker thread that runs one group's calls one at a time, in issue order."""

    def __init__(self, name: str, limit: float) -> None:
        self.name = name
        self.limit = limit   # the longest one call may take (the group's timeout)
        self._queue: deque[tuple[Callable[[], None], CollsWork]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, label: str, outputs: list[torch.Tensor], job: Callable[[], None]) -> CollsWork:
        """Queue `job` behind every call issued before it; returns its handle."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{label}: the process group {self.name} is shut down")
            queued = len(self._queue) + 1
            work = CollsWork(label, outputs, time.monotonic() + queued * self.limit + SLACK_S, self._cond)
            self._queue.append((job, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"colls-torch-{self.name}",
                                                daemon=True)
                self._thread.start()
                _STARTED.add(self)
            self._cond.notify()
        return work

    def run_now(self, label: str, outputs: list[torch.Tensor], job: Callable[[], None]) -> CollsWork:
        """Run `job` in this thread if nothing is queued (a caller that waits at once gains nothing
        from the hand-off), else queue it behind what is; returns its (completed) handle."""
        with self._cond:
            busy = bool(self._queue) or self._closed
        if busy:
            return self.submit(label, outputs, job)
        work = CollsWork(label, outputs, time.monotonic() + self.limit + SLACK_S)
        try:
            work.waiter = job()
        except BaseException as error:  # noqa: BLE001 - re-raised by wait(), as for queued work
            work._fail(error)
        else:
            work._finish()
        return work

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                job, work = self._queue[0]
            try:
                waiter = job()
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the work
                work._fail(error)
            else:
                work.waiter = waiter
                work._finish()
            with self._cond:
                self._queue.popleft()
                self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until every queued call has run; false on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue, timeout)

    def close(self, timeout: float) -> None:
        """Run what is queued (at most `timeout` seconds), then end the worker and wait for it to
        be gone, so that no call's objects are released on it while the interpreter exits."""
        self.drain(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)


_STARTED: weakref.WeakSet[Stream] = weakref.WeakSet()   # streams whose worker was started


@atexit.register
def _close_at_exit() -> None:
    """End every group's worker before the interpreter stops its threads (atexit runs first), also
    where `destroy_process_group` was not called: a daemon worker still inside a torch call (a
    future's callbacks, a tensor op: torch releases the GIL there) when Python finalizes is killed
    as it takes the GIL back, and that unwind through torch's C++ aborts the process
    ("terminate called without an active exception"). Then the GIL is left free for a moment:
    torch's C++ threads take it to release the Python tensors of their last call (a Gloo group's
    worker frees its last work's inputs after `wait()` has returned), and one still waiting for it
    when the interpreter finalizes dies in the same abort (torch PR #179291). A program with a Gloo
    group beside a colls one, 4 ranks on 2 cores, aborted so at exit in 11 of 16 runs without this
    pause and in none of 10 with it."""
    for stream in list(_STARTED):
        stream.close(EXIT_WAIT_S)
    time.sleep(EXIT_HANDOFF_S)


def completed(outputs: list[Any]) -> CollsWork:
    """A handle that is already complete (a call with nothing to move)."""
    work = CollsWork("nothing to do", outputs, time.monotonic())
    work._finish()
    return work
