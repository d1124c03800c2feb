"""Ordering of a communicator's calls: blocking ones inline, `async_op=True` ones and persistent
requests' starts on a worker.

Every rank issues a communicator's collectives in the same order, and each transport matches
messages in posting order, so the calls must also *run* in issue order. A blocking call on an idle
communicator runs straight in the caller's thread (no hand-off cost for small messages); one issued
while asynchronous work is queued goes behind it. The worker is one thread per communicator, like
one CUDA stream per NCCL communicator.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from transports.base import Envelope
from transports.errors import CollectiveTimeout


class Work:
    """Handle of an asynchronous call: `wait()` returns its result or raises its error."""

    def __init__(self, description: object) -> None:
        self.description = description
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def is_completed(self) -> bool:
        """Whether the call has finished (successfully or not)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the call finishes and return its result; the call's own deadline bounds this."""
        if not self._event.wait(timeout):
            label = getattr(self.description, "label", None)
            raise TimeoutError(f"{label() if label else self.description} has not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._event.set()


class RequestWork(Work):
    """Handle of a posted point-to-point request: `wait()` drives the transport until it is done."""

    def __init__(self, description: str, transport, request, deadline: float, result: Any,
                 turn: threading.Lock | None = None, traffic=None) -> None:
        super().__init__(description)
        self._transport = transport
        self._request = request
        self._deadline = deadline
        self._result = result
        self._turn = turn          # held while waiting, where the transport takes one thread at a time
        self._traffic = traffic    # a receive's counters, added to once it has completed

    def is_completed(self) -> bool:
        """Whether the request has completed (without driving progress)."""
        return bool(self._request.done)

    @property
    def status(self) -> Envelope | None:
        """What a completed receive got: an `Envelope` (source, tag, nbytes received); None before
        the request completes."""
        request = self._request
        if not request.done:
            return None
        return Envelope(request.source, request.received_tag, request.count)

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the request (at most its deadline, or `timeout` seconds) and return the result.

        Raises:
            CollectiveTimeout: the request did not complete in time.
            MessageTruncated: a receive's message was longer than its buffer.
        """
        request = self._request
        if not request.done:
            deadline = self._deadline if timeout is None else min(self._deadline, time.monotonic() + timeout)
            try:
                if self._turn is None:
                    self._transport.wait_all([request], deadline)
                else:
                    with self._turn:
                        self._transport.wait_all([request], deadline)
            except CollectiveTimeout as error:
                raise CollectiveTimeout(f"{self.description}: {error}", error.peers) from None
            except Exception:
                if not request.done:
                    raise
        traffic, self._traffic = self._traffic, None
        if traffic is not None and request.kind == "recv":   # counted once, now its source is known
            traffic.messages_received[request.source] += 1
            traffic.bytes_received[request.source] += request.count
        if request.error is not None:
            raise request.error
        return self._result


class Executor:
    """Runs a communicator's jobs one at a time in issue order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._running = threading.Lock()   # held while a job runs, inline or on the worker
        self.lock = self._running          # the same, for callers that take it without a call (hot paths)
        self._cond = threading.Condition()
        self._queue: deque[tuple[Callable[[], Any], Work]] = deque()
        self.pending = 0   # jobs queued or running on the worker; none: a blocking call runs in line
        self._worker: threading.Thread | None = None

    def run(self, description: object, async_op: bool, job: Callable[..., Any], *args: Any) -> Any:
        """Run `job(*args)` now (blocking) or on the worker (async), keeping issue order either way."""
        if not async_op:
            # reading an int needs no lock: work this thread queued keeps it non-zero until done,
            # and calls made at once from several threads have no order to keep anyway
            if self.pending == 0:
                with self._running:
                    return job(*args)   # no closure, no hand-off (collectives make this step themselves)
            return self.submit(partial(job, *args), description).wait()
        return self.submit(partial(job, *args), description)

    def submit(self, job: Callable[[], Any], description: object) -> Work:
        """Queue `job` behind everything issued before it; returns its handle."""
        work = Work(description)
        with self._cond:
            self._queue.append((job, work))
            self.pending += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name=f"colls-{self.name}", daemon=True)
                self._worker.start()
            self._cond.notify()
        return work

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                job, work = self._queue.popleft()
            try:
                with self._running:
                    result = job()
            except BaseException as error:  # handed to whoever waits on the work
                work._finish(error=error)
            else:
                work._finish(result)
            with self._cond:
                self.pending -= 1
                self._cond.notify_all()

    def exclusive(self) -> threading.Lock:
        """The lock that keeps the transport to one user at a time (held while any job runs)."""
        return self._running

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no asynchronous job is queued or running; false on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.pending == 0, timeout)
