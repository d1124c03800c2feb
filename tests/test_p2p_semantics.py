"""MPI's point-to-point semantics on the transports that implement them (local, shm, mpi).

Wildcard receives (ANY_SOURCE, ANY_TAG, both) and what a completed receive tells (source, tag,
count); a message shorter than its buffer; a longer one (MessageTruncated on the receiver only, the
sender done, the next message and collective unaffected); non-overtaking order with wildcard and
specific receives mixed, at sizes from 0 B to over 1 MiB (shm sends those by address); ANY_TAG never
matching a collective's message; iprobe/improbe/mrecv; several threads on one transport and two
communicators at once; the communicator's API over all of it; colls' reserved tags (never matched by
ANY_TAG) and synchronous sends (done only once their receive is posted; a probe does not do it).

Each transport runs every check in one launch of 3 ranks (threads, forked processes, mpiexec).
Every check runs on a communicator of its own (a split), so a failing one leaves no message behind
for the next, and aborts it so that its peers do not wait to their deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import pytest

import colls
from transports.base import ANY_SOURCE, ANY_TAG, RESERVED_TAG_BASE
from transports.errors import CollectiveTimeout, InvalidArgument, MessageTruncated

SIZE = 3
STEP_S = 10.0          # the deadline of every wait inside a check, and its communicator's timeout
WORLD_S = 120.0        # the world's timeout: a launch whose checks all fail still reports each
BIG = (1 << 20) + 12   # over 1 MiB: shm sends it by address


def _deadline() -> float:
    return time.monotonic() + STEP_S


def _pattern(nbytes: int, seed: int) -> np.ndarray:
    """`nbytes` bytes that tell one message from another."""
    return ((np.arange(nbytes, dtype=np.int64) * 7 + seed) % 251).astype(np.uint8)


def _wait(transport, requests) -> None:
    transport.wait_all(requests, _deadline())


def _send(transport, nbytes: int, peer: int, tag: int, seed: int) -> None:
    data = _pattern(nbytes, seed)
    _wait(transport, [transport.isend(data, peer, tag)])


def _poll(probe, *args):
    """Call `probe(*args)` until it returns an envelope (the message is on its way)."""
    deadline = _deadline()
    while time.monotonic() < deadline:
        found = probe(*args)
        if found is not None:
            return found
        time.sleep(0.001)
    raise AssertionError(f"no message for {probe.__name__}{args} within {STEP_S} s")


def _received(request, buf: np.ndarray, source: int, tag: int, nbytes: int, seed: int) -> None:
    """The receive completed with this status, and the bytes past the message are untouched."""
    assert (request.source, request.received_tag, request.count) == (source, tag, nbytes), \
        (request.source, request.received_tag, request.count, source, tag, nbytes)
    assert (buf[:nbytes] == _pattern(nbytes, seed)).all()
    assert (buf[nbytes:] == 0xEE).all()


def _buffer(nbytes: int) -> np.ndarray:
    return np.full(nbytes, 0xEE, np.uint8)


# -- wildcards and status --------------------------------------------------------------------------

def check_any_source(comm) -> None:
    t = comm.transport
    if comm.rank == 0:
        bufs = [_buffer(64) for _ in range(2)]
        requests = [t.irecv(buf, ANY_SOURCE, 5) for buf in bufs]
        _wait(t, requests)
        assert sorted(r.source for r in requests) == [1, 2]
        for request, buf in zip(requests, bufs, strict=True):
            _received(request, buf, request.source, 5, 16 * request.source, request.source)
    else:
        _send(t, 16 * comm.rank, 0, 5, comm.rank)


def check_any_tag(comm) -> None:
    """From one sender, ANY_TAG takes its messages in the order sent; another sender's stays."""
    t = comm.transport
    sent = [(3, 8), (9, 100), (3, BIG)]
    if comm.rank == 0:
        bufs = [_buffer(BIG + 64) for _ in sent]
        requests = [t.irecv(buf, 1, ANY_TAG) for buf in bufs]
        _wait(t, requests)
        for seed, ((tag, nbytes), request, buf) in enumerate(zip(sent, requests, bufs, strict=True)):
            _received(request, buf, 1, tag, nbytes, seed)
        other = _buffer(8)
        request = t.irecv(other, 2, 4)
        _wait(t, [request])
        _received(request, other, 2, 4, 8, 40)
    elif comm.rank == 1:
        data = [_pattern(nbytes, seed) for seed, (_, nbytes) in enumerate(sent)]
        _wait(t, [t.isend(d, 0, tag) for d, (tag, _) in zip(data, sent, strict=True)])
    else:
        _send(t, 8, 0, 4, 40)


def check_any_source_any_tag(comm) -> None:
    t = comm.transport
    if comm.rank == 0:
        bufs = [_buffer(2048) for _ in range(2)]
        requests = [t.irecv(buf, ANY_SOURCE, ANY_TAG) for buf in bufs]
        _wait(t, requests)
        assert sorted(r.source for r in requests) == [1, 2]
        for request, buf in zip(requests, bufs, strict=True):
            _received(request, buf, request.source, 10 + request.source, 1000 + request.source,
                      request.source)
    else:
        _send(t, 1000 + comm.rank, 0, 10 + comm.rank, comm.rank)


def check_shorter_message(comm) -> None:
    """A message shorter than the buffer: count says how much came, the rest is untouched."""
    t = comm.transport
    cases = [(1, 0, 8), (2, 12, 40), (3, BIG, BIG + 4096), (4, 5000, BIG)]   # tag, sent, buffer
    if comm.rank == 0:
        bufs = [_buffer(room) for _, _, room in cases]
        requests = [t.irecv(buf, 1, tag) for buf, (tag, _, _) in zip(bufs, cases, strict=True)]
        _wait(t, requests)
        for request, buf, (tag, nbytes, _) in zip(requests, bufs, cases, strict=True):
            _received(request, buf, 1, tag, nbytes, tag)
    elif comm.rank == 1:
        data = [_pattern(nbytes, tag) for tag, nbytes, _ in cases]
        _wait(t, [t.isend(d, 0, tag) for d, (tag, _, _) in zip(data, cases, strict=True)])


def check_truncation(comm) -> None:
    """A longer message raises MessageTruncated naming both sizes, on the receiver only and only
    for the request it was given; the sender completes; the next message and collectives work."""
    t = comm.transport
    if comm.rank == 0:
        small = t.irecv(_buffer(8), 1, 1)
        big = t.irecv(_buffer(1 << 20), ANY_SOURCE, 2)
        fine_buf = _buffer(8)
        fine = t.irecv(fine_buf, 1, 3)
        _wait(t, [fine])
        _received(fine, fine_buf, 1, 3, 8, 3)
        for request, sent, room in ((small, 16, 8), (big, BIG, 1 << 20)):
            with pytest.raises(MessageTruncated) as raised:
                _wait(t, [request])
            text = str(raised.value)
            assert f"{room} B" in text and "rank 1" in text, text
            if t.name != "mpi":   # MPI does not tell the size of a message it truncated
                assert f"{sent} B" in text, text
    elif comm.rank == 1:
        data = [_pattern(16, 1), _pattern(BIG, 2), _pattern(8, 3)]
        _wait(t, [t.isend(d, 0, tag) for d, tag in zip(data, (1, 2, 3), strict=True)])
    total = comm.all_reduce(np.arange(6, dtype=np.int64) + comm.rank, timeout=STEP_S)
    assert total.tolist() == (3 * np.arange(6) + 3).tolist()
    comm.barrier(timeout=STEP_S)
    if comm.rank == 0:
        buf = _buffer(8)
        request = t.irecv(buf, 1, 1)
        _wait(t, [request])
        _received(request, buf, 1, 1, 8, 9)
    elif comm.rank == 1:
        _send(t, 8, 0, 1, 9)
    comm.barrier(timeout=STEP_S)


# -- order -----------------------------------------------------------------------------------------

# rank 1's messages to rank 0 (tag, size), and rank 0's receives (source, tag), in posting order
MESSAGES = [(1, 8), (2, 100), (1, BIG), (3, 5000), (2, 70000), (1, 0), (3, 8), (2, BIG + 1000),
            (1, 300), (3, 65544)]
RECEIVES = [(1, ANY_TAG), (1, 2), (ANY_SOURCE, 1), (ANY_SOURCE, ANY_TAG), (1, 3), (1, 2),
            (ANY_SOURCE, ANY_TAG), (1, 1), (ANY_SOURCE, 3), (1, ANY_TAG)]


def _matches(receive: tuple[int, int], tag: int) -> bool:
    source, wanted = receive
    return source in (1, ANY_SOURCE) and wanted in (tag, ANY_TAG)


def _expected_posted_first() -> list[int]:
    """Receives all posted before any message: each message, in the order sent, goes to the
    earliest-posted receive still open that matches it. Returns the message of each receive."""
    taken: dict[int, int] = {}
    for index, (tag, _) in enumerate(MESSAGES):
        receive = next(r for r in range(len(RECEIVES)) if r not in taken and _matches(RECEIVES[r], tag))
        taken[receive] = index
    return [taken[r] for r in range(len(RECEIVES))]


def _expected_sent_first() -> list[int]:
    """Messages all sent before each receive is posted in turn: each takes the earliest-sent one
    still unmatched that matches it."""
    used: set[int] = set()
    chosen = []
    for receive in RECEIVES:
        index = next(m for m, (tag, _) in enumerate(MESSAGES) if m not in used and _matches(receive, tag))
        used.add(index)
        chosen.append(index)
    return chosen


def _check_order(comm, posted_first: bool) -> None:
    t = comm.transport
    if comm.rank == 1:
        data = [_pattern(nbytes, seed) for seed, (_, nbytes) in enumerate(MESSAGES)]
        if posted_first:
            comm.barrier(timeout=STEP_S)
        sends = [t.isend(d, 0, tag) for d, (tag, _) in zip(data, MESSAGES, strict=True)]
        if not posted_first:
            comm.barrier(timeout=STEP_S)
        _wait(t, sends)
    elif comm.rank == 0:
        bufs = [_buffer(BIG + 1024) for _ in RECEIVES]
        if posted_first:
            requests = [t.irecv(buf, source, tag) for buf, (source, tag) in zip(bufs, RECEIVES, strict=True)]
            comm.barrier(timeout=STEP_S)   # a collective while wildcard receives are posted
            _wait(t, requests)
            expected = _expected_posted_first()
        else:
            comm.barrier(timeout=STEP_S)
            requests = []
            for buf, (source, tag) in zip(bufs, RECEIVES, strict=True):
                requests.append(t.irecv(buf, source, tag))
                _wait(t, requests[-1:])
            expected = _expected_sent_first()
        for request, buf, index in zip(requests, bufs, expected, strict=True):
            tag, nbytes = MESSAGES[index]
            _received(request, buf, 1, tag, nbytes, index)
    else:
        comm.barrier(timeout=STEP_S)
    comm.barrier(timeout=STEP_S)


def check_order_receives_posted_first(comm) -> None:
    _check_order(comm, posted_first=True)


def check_order_messages_sent_first(comm) -> None:
    _check_order(comm, posted_first=False)


def check_any_tag_skips_collectives(comm) -> None:
    """A wildcard receive posted across collectives is matched by none of their messages."""
    t = comm.transport
    buf = _buffer(64)
    waiting = t.irecv(buf, ANY_SOURCE, ANY_TAG) if comm.rank < 2 else None
    for count in (4, 3000, 140000):
        total = comm.all_reduce(np.arange(count, dtype=np.float64) * (comm.rank + 1), timeout=STEP_S)
        assert (total == 6 * np.arange(count)).all()
    sent = comm.broadcast(np.arange(100, dtype=np.int32) if comm.rank == 2 else np.zeros(100, np.int32),
                          root=2, timeout=STEP_S)
    assert (sent == np.arange(100)).all()
    if waiting is not None:   # (rank 2 sends only once past the barrier, which needs this rank)
        assert not waiting.done, f"rank {comm.rank}: ANY_TAG took tag {waiting.received_tag}"
    comm.barrier(timeout=STEP_S)
    if waiting is not None:
        _wait(t, [waiting])
        _received(waiting, buf, 2, 4 + comm.rank, 8, comm.rank)
    else:
        _send(t, 8, 0, 4, 0)
        _send(t, 8, 1, 5, 1)
    comm.barrier(timeout=STEP_S)


# -- probes ----------------------------------------------------------------------------------------

def check_probes(comm) -> None:
    t = comm.transport
    if comm.rank == 0:
        assert t.iprobe(2, ANY_TAG) is None   # rank 2 sends nothing
        found = _poll(t.iprobe, 1, 8)
        assert (found.source, found.tag, found.nbytes) == (1, 8, BIG)
        for _ in range(2):   # the earliest from rank 1, left in place
            first = t.iprobe(ANY_SOURCE, ANY_TAG)
            assert (first.source, first.tag, first.nbytes) == (1, 7, 24)
        claimed = t.improbe(1, ANY_TAG)
        assert (claimed.source, claimed.tag, claimed.nbytes) == (1, 7, 24)
        following = t.iprobe(1, ANY_TAG)   # a claimed message is no longer visible
        assert (following.tag, following.nbytes) == (8, BIG)
        buf = _buffer(32)
        request = t.mrecv(buf, claimed)
        _wait(t, [request])
        _received(request, buf, 1, 7, 24, 0)
        claimed_big = t.improbe(ANY_SOURCE, 8)
        assert (claimed_big.source, claimed_big.nbytes) == (1, BIG)
        claimed_long = _poll(t.improbe, 1, 7)
        assert claimed_long.nbytes == 16
        late_buf = _buffer(64)
        late = t.irecv(late_buf, 1, ANY_TAG)   # matches neither claimed message
        big_buf = _buffer(BIG + 8)
        request = t.mrecv(big_buf, claimed_big)
        _wait(t, [request])
        _received(request, big_buf, 1, 8, BIG, 1)
        with pytest.raises(MessageTruncated):
            _wait(t, [t.mrecv(_buffer(8), claimed_long)])
        assert not late.done
        comm.barrier(timeout=STEP_S)
        _wait(t, [late])
        _received(late, late_buf, 1, 9, 8, 3)
        assert t.iprobe(ANY_SOURCE, ANY_TAG) is None
    elif comm.rank == 1:
        data = [_pattern(24, 0), _pattern(BIG, 1), _pattern(16, 2)]
        _wait(t, [t.isend(d, 0, tag) for d, tag in zip(data, (7, 8, 7), strict=True)])
        comm.barrier(timeout=STEP_S)
        _send(t, 8, 0, 9, 3)
    else:
        comm.barrier(timeout=STEP_S)
    comm.barrier(timeout=STEP_S)


# -- threads ---------------------------------------------------------------------------------------

THREAD_SIZES = [8, 5000, 70000, 8, BIG]
ROUNDS = 10


def _in_threads(targets) -> None:
    """Run each callable in a thread of its own; re-raise the first error."""
    errors: list[str] = []

    def run(target) -> None:
        try:
            target()
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3 * STEP_S)
    assert not any(thread.is_alive() for thread in threads), "a thread is still running"
    assert not errors, "\n".join(errors)


def check_threads_on_one_transport(comm) -> None:
    """Two threads per peer on every rank, each with tags of its own: one swaps by sendrecv, the
    other ping-pongs with ANY_SOURCE receives."""
    t = comm.transport

    def lane(peer: int, kind: int) -> None:
        low, high = sorted((comm.rank, peer))
        tag = 1000 + 100 * (low * SIZE + high) + 10 * kind
        for i in range(ROUNDS):
            nbytes = THREAD_SIZES[i % len(THREAD_SIZES)]
            mine = _pattern(nbytes, comm.rank + i)
            got = _buffer(nbytes)
            if kind == 0:
                t.sendrecv(mine, peer, got, peer, tag, _deadline())
                assert (got == _pattern(nbytes, peer + i)).all()
                continue
            if comm.rank == low:
                _wait(t, [t.isend(mine, peer, tag)])
                request = t.irecv(got, ANY_SOURCE, tag + 1)
            else:
                request = t.irecv(got, ANY_SOURCE, tag)
            _wait(t, [request])
            if comm.rank != low:
                _wait(t, [t.isend(mine, peer, tag + 1)])
            _received(request, got, peer, tag + 1 if comm.rank == low else tag, nbytes, peer + i)

    _in_threads([lambda p=peer, k=kind: lane(p, k) for peer in range(SIZE) if peer != comm.rank
                 for kind in (0, 1)])


def check_two_communicators_at_once(comm) -> None:
    """Two communicators used from two threads at once: collectives and a ring of wildcard receives."""
    first, second = comm.split(0), comm.split(0)
    try:
        def work(c, k: int) -> None:
            t = c.transport
            right, left = (c.rank + 1) % c.size, (c.rank - 1) % c.size
            for i in range(ROUNDS):
                count = (3, 5000, 150000)[i % 3]
                total = c.all_reduce(np.full(count, c.rank + k, np.int64), timeout=STEP_S)
                assert (total == 3 + 3 * k).all()
                got = _buffer(64)
                send = t.isend(_pattern(8 * (k + 1), c.rank), right, 7)
                request = t.irecv(got, ANY_SOURCE, ANY_TAG)
                _wait(t, [send, request])
                _received(request, got, left, 7, 8 * (k + 1), left)
        _in_threads([lambda: work(first, 0), lambda: work(second, 1)])
    finally:
        first.close()
        second.close()


# -- reserved tags and synchronous sends ----------------------------------------------------------

def check_reserved_tags(comm) -> None:
    """A message on one of colls' own tags, sent first, is seen by no ANY_TAG probe or receive; a
    receive naming its tag takes it (shorter fits, longer is truncated) through the communicator."""
    t, reserved = comm.transport, RESERVED_TAG_BASE + 5
    if comm.rank == 0:
        comm.barrier(timeout=STEP_S)
        found = _poll(t.iprobe, 1, reserved)
        assert (found.source, found.tag, found.nbytes) == (1, reserved, 24)
        user = _poll(t.iprobe, ANY_SOURCE, ANY_TAG)
        assert (user.source, user.tag) == (1, 3), user
        buf = _buffer(64)
        request = t.irecv(buf, ANY_SOURCE, ANY_TAG)
        _wait(t, [request])
        _received(request, buf, 1, 3, 8, 1)
        assert t.iprobe(ANY_SOURCE, ANY_TAG) is None
        got = np.zeros(5, np.int64)
        work = comm.recv(got, 1, reserved, async_op=True)
        work.wait()
        assert (work.status.tag, work.status.nbytes) == (reserved, 24) and got.tolist() == [7, 8, 9, 0, 0]
        with pytest.raises(MessageTruncated):
            comm.recv(np.zeros(1, np.int64), 1, reserved + 1)
    elif comm.rank == 1:
        comm.send(np.array([7, 8, 9], np.int64), 0, tag=reserved)
        _send(t, 8, 0, 3, 1)
        comm.send(np.zeros(2, np.int64), 0, tag=reserved + 1)
        comm.barrier(timeout=STEP_S)
    else:
        comm.barrier(timeout=STEP_S)
    comm.barrier(timeout=STEP_S)


def _still_pending(transport, requests) -> None:
    with pytest.raises(CollectiveTimeout):
        transport.wait_all(requests, time.monotonic() + 0.3)
    assert not any(request.done for request in requests)


def check_synchronous_sends(comm) -> None:
    """Synchronous sends of 8 B, over 1 MiB and 0 B complete only once rank 0 posts their receives
    (not when it probes them or claims one for mrecv, nor when it receives a later message first);
    one to self."""
    t = comm.transport
    sizes = {11: 8, 12: BIG, 13: 0, 15: 8}
    if comm.rank == 0:
        buf = _buffer(16)
        request = t.irecv(buf, 1, 16)   # sent after tag 15's synchronous message, received first
        _wait(t, [request])
        _received(request, buf, 1, 16, 8, 16)
        for tag in (11, 12):
            found = _poll(t.iprobe, 1, tag)
            assert (found.tag, found.nbytes) == (tag, sizes[tag])
        claimed = _poll(t.improbe, 1, 13)   # (its send completes at the mrecv, as in MPICH)
        comm.barrier(timeout=STEP_S)
        comm.barrier(timeout=STEP_S)   # rank 1 has seen its sends pending
        requests = [(tag, _buffer(sizes[tag] + 8)) for tag in (11, 12, 15)]
        posted = [t.irecv(got, 1, tag) for tag, got in requests] + [t.mrecv(_buffer(8), claimed)]
        _wait(t, posted)
        for (tag, got), request in zip(requests, posted, strict=False):
            _received(request, got, 1, tag, sizes[tag], tag)
    elif comm.rank == 1:
        sends = {tag: t.issend(_pattern(n, tag), 0, tag) for tag, n in sizes.items()}
        _wait(t, [t.isend(_pattern(8, 16), 0, 16)])
        comm.barrier(timeout=STEP_S)
        _still_pending(t, list(sends.values()))
        comm.barrier(timeout=STEP_S)
        _wait(t, list(sends.values()))
    else:
        mine = t.issend(_pattern(8, 2), 2, 14)
        _still_pending(t, [mine])
        buf = _buffer(8)
        request = t.irecv(buf, 2, 14)
        _wait(t, [request, mine])
        _received(request, buf, 2, 14, 8, 2)
        comm.barrier(timeout=STEP_S)
        comm.barrier(timeout=STEP_S)
    comm.barrier(timeout=STEP_S)


def check_synchronous_sends_race_for_one_receive(comm) -> None:
    """Ranks 1 and 2 each send synchronously to rank 0's one ANY_SOURCE receive: exactly one send
    completes (the one matched), the other once rank 0 posts a second receive."""
    t = comm.transport
    send = first = None
    if comm.rank == 0:
        first = t.irecv(_buffer(8), ANY_SOURCE, 17)
    elif comm.rank in (1, 2):
        send = t.issend(_pattern(8, comm.rank), 0, 17)
    comm.barrier(timeout=STEP_S)   # both sends are posted
    if first is not None:
        _wait(t, [first])
    comm.barrier(timeout=STEP_S)   # rank 0 has matched one of them
    done = -1
    if send is not None:
        with contextlib.suppress(CollectiveTimeout):
            t.wait_all([send], time.monotonic() + 0.3)
        done = int(send.done)
    flags = comm.all_gather(np.array([done], np.int64))
    assert sorted(flags[1:3].tolist()) == [0, 1], f"completed synchronous sends: {flags.tolist()}"
    if first is not None:
        second = t.irecv(_buffer(8), 3 - first.source, 17)
        _wait(t, [second])
    elif send is not None:
        _wait(t, [send])
    comm.barrier(timeout=STEP_S)


# -- the communicator's API ------------------------------------------------------------------------

def check_communicator_api(comm) -> None:
    """recv with wildcards into a bigger buffer and its status, the probes, a truncated receive
    that leaves the communicator usable, and bad arguments named."""
    assert (colls.ANY_SOURCE, colls.ANY_TAG) == (ANY_SOURCE, ANY_TAG)
    if comm.rank == 0:
        got = np.full(10, -1, np.int64)
        work = comm.recv(got, colls.ANY_SOURCE, 6, async_op=True)
        assert work.wait() is got
        status = work.status
        assert (status.source, status.tag, status.nbytes) == (1, 6, 24)
        assert got.tolist() == [1, 2, 3] + [-1] * 7
        found = comm.probe(2, timeout=STEP_S)
        assert (found.source, found.tag, found.nbytes) == (2, 8, 16)
        assert comm.iprobe() is not None
        message = comm.mprobe(colls.ANY_SOURCE, 8, timeout=STEP_S)
        assert comm.improbe(2, 8) is None
        got = np.zeros(2, np.int64)
        assert comm.mrecv(got, message) is got
        assert got.tolist() == [20, 21]
        with pytest.raises(MessageTruncated):
            comm.recv(np.zeros(1, np.int64), 1, colls.ANY_TAG)
        for bad, name in (({"src": 3}, "src"), ({"src": -5}, "src"), ({"src": 1, "tag": -7}, "tag")):
            with pytest.raises(InvalidArgument) as raised:
                comm.recv(np.zeros(1), **bad)
            assert name in str(raised.value) and "rank 0" in str(raised.value), str(raised.value)
    elif comm.rank == 1:
        comm.send(np.array([1, 2, 3], np.int64), 0, tag=6)
        comm.send(np.arange(4, dtype=np.int64), 0, tag=9)
    else:
        comm.send(np.array([20, 21], np.int64), 0, tag=8)
    comm.barrier(timeout=STEP_S)
    total = comm.all_reduce(np.ones(3, np.int64), timeout=STEP_S)
    assert total.tolist() == [3, 3, 3]


def check_communicator_threads(comm) -> None:
    """One thread runs collectives while another sends and receives around a ring, on one communicator."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size

    def collectives() -> None:
        for i in range(ROUNDS):
            total = comm.all_reduce(np.full((4, 40000)[i % 2], i, np.int64), timeout=STEP_S)
            assert (total == 3 * i).all()

    def ring() -> None:
        for i in range(ROUNDS):
            got = np.zeros(8, np.int32)
            work = comm.recv(got, colls.ANY_SOURCE, 3, async_op=True)
            comm.send(np.full(4, 10 * comm.rank + i, np.int32), right, tag=3, timeout=STEP_S)
            work.wait()
            assert work.status.source == left and work.status.nbytes == 16
            assert got[:4].tolist() == [10 * left + i] * 4

    def crossed(lane: int) -> None:
        """Ranks 0 and 1, two threads each: on both ranks one thread waits in a receive while the
        other must send (rank 0's second thread) or receive and then send (rank 1's) for it to end."""
        plan = {(0, 0): [("recv", 20), ("send", 23)], (0, 1): [("send", 22)],
                (1, 0): [("recv", 23)], (1, 1): [("recv", 22), ("send", 20)]}
        peer = 1 - comm.rank
        for verb, tag in plan.get((comm.rank, lane), []):
            if verb == "send":
                comm.send(np.full(BIG // 8, tag, np.int64), peer, tag, timeout=STEP_S)
            else:
                got = comm.recv(np.zeros(BIG // 8, np.int64), peer, tag, timeout=STEP_S)
                assert (got == tag).all()

    _in_threads([collectives, ring, lambda: crossed(0), lambda: crossed(1)])


CHECKS = [check_any_source, check_any_tag, check_any_source_any_tag, check_shorter_message,
          check_truncation, check_order_receives_posted_first, check_order_messages_sent_first,
          check_any_tag_skips_collectives, check_probes, check_threads_on_one_transport,
          check_two_communicators_at_once, check_communicator_api, check_communicator_threads,
          check_reserved_tags, check_synchronous_sends, check_synchronous_sends_race_for_one_receive]


def run_checks(world) -> dict[str, str]:
    """Every check on a communicator of its own: its name -> "ok" or the traceback."""
    results = {}
    for check in CHECKS:
        comm = world.split(0)
        comm.timeout = STEP_S
        try:
            check(comm)
            results[check.__name__] = "ok"
        except BaseException:
            results[check.__name__] = traceback.format_exc()
            comm.abort(f"{check.__name__} failed")
        finally:
            try:
                comm.close()
            except Exception:
                pass
    return results


# -- launches --------------------------------------------------------------------------------------

_launched: dict[str, object] = {}


def _mpiexec() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")


def _launch(transport: str, tmp_path_factory) -> list[dict[str, str]]:
    if transport != "mpi":
        return colls.spawn(run_checks, SIZE, transport=transport, timeout=WORLD_S)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLS_", "PMI_", "OMPI_"))}
    folder = tmp_path_factory.mktemp("p2p")
    command = [_mpiexec(), "-n", str(SIZE), sys.executable, os.path.abspath(__file__), str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    files = [folder / f"rank{rank}.json" for rank in range(SIZE)]
    assert done.returncode == 0 and all(file.exists() for file in files), \
        f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    return [json.loads(file.read_text()) for file in files]


def _results(transport: str, tmp_path_factory) -> list[dict[str, str]]:
    if transport == "mpi":
        pytest.importorskip("mpi4py")
        if _mpiexec() is None:
            pytest.skip("mpiexec not found")
    if transport not in _launched:
        try:
            _launched[transport] = _launch(transport, tmp_path_factory)
        except Exception as error:   # every check of this transport reports it
            _launched[transport] = error
    found = _launched[transport]
    if isinstance(found, Exception):
        raise found
    return found


@pytest.mark.timeout(180)
@pytest.mark.parametrize("check", [check.__name__ for check in CHECKS])
@pytest.mark.parametrize("transport", ["local", "shm", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_p2p_semantics(transport, check, tmp_path_factory):
    failures = {rank: results[check] for rank, results in enumerate(_results(transport, tmp_path_factory))
                if results[check] != "ok"}
    assert not failures, "\n".join(f"--- rank {rank} ---\n{text}" for rank, text in failures.items())


if __name__ == "__main__":
    # the mpi job: mpiexec -n 3 python tests/test_p2p_semantics.py FOLDER (writes rank<N>.json there)
    world = colls.init(timeout=WORLD_S)
    found = run_checks(world)
    with open(os.path.join(sys.argv[1], f"rank{world.rank}.json"), "w") as out:
        json.dump(found, out)
    world.close()
