"""Objects between ranks: colls' object collectives, the facade's lowercase (pickle-based) methods,
requests and statuses, and `mpi4py.util.pkl5`, on real ranks (threads; shm processes for the
out-of-band point-to-point frames)."""

from __future__ import annotations

import pickle
import sys
import threading

import numpy as np
import pytest

import colls
from colls.compat import MPI, install, spawn
from colls.compat.objects import MARKER, frames

BIG = 1 << 19   # bytes of the arrays that travel out of band (>= MPI.pickle.THRESHOLD)


def big_array(seed: int) -> np.ndarray:
    return np.arange(BIG // 8, dtype=np.float64) + seed


# -- colls' own object collectives -------------------------------------------------------------------

def object_collectives(comm) -> str:
    rank, size = comm.rank, comm.size
    root = size - 1
    sent = {"rank": root, "a": big_array(root), "small": [1, "two"]} if rank == root else None
    got = comm.broadcast_object(sent, root)
    assert got["rank"] == root and got["small"] == [1, "two"]
    np.testing.assert_array_equal(got["a"], big_array(root))
    assert comm.all_gather_object(("r", rank)) == [("r", r) for r in range(size)]
    gathered = comm.gather_object({rank: "x" * rank}, root=0)
    assert gathered == ([{r: "x" * r} for r in range(size)] if rank == 0 else None)
    mine = comm.scatter_object([f"to {r}" for r in range(size)] if rank == root else None, root)
    assert mine == f"to {rank}"
    assert comm.all_to_all_object([(rank, r) for r in range(size)]) == [(r, rank) for r in range(size)]
    return "ok"


@pytest.mark.parametrize("size", [1, 3])
def test_object_collectives(size: int) -> None:
    assert colls.spawn(object_collectives, size, transport="local", timeout=60) == ["ok"] * size


def test_large_buffers_travel_out_of_band() -> None:
    array = big_array(0)
    parts = frames({"a": array}, MPI.pickle)
    assert len(parts) == 2 and parts[0][:len(MARKER)].tobytes() == MARKER
    assert parts[0].size < 1024 and parts[1].size == array.nbytes
    assert np.shares_memory(parts[1], array)   # sent from the array itself: not copied into a pickle
    small = frames([1, 2, 3], MPI.pickle)
    assert len(small) == 1 and pickle.loads(small[0]) == [1, 2, 3]   # a plain pickle, as mpi4py sends


# -- the facade's lowercase methods ------------------------------------------------------------------

def lowercase_collectives() -> str:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.barrier()
    assert comm.bcast({"k": rank} if rank == 0 else None, root=0) == {"k": 0}
    assert comm.allgather(rank) == list(range(size))
    assert comm.alltoall([rank * 10 + r for r in range(size)]) == [r * 10 + rank for r in range(size)]
    assert comm.scatter(list(range(size)) if rank == 1 else None, root=1) == rank
    assert comm.gather(rank, root=1) == (list(range(size)) if rank == 1 else None)
    assert comm.allreduce(rank) == sum(range(size))
    assert comm.allreduce(rank, op=MPI.MAX) == size - 1
    assert comm.allreduce([rank]) == list(range(size))   # SUM of lists concatenates, in rank order
    assert comm.allreduce((rank, -rank), op=MPI.MINLOC) == (0, 0)
    assert comm.reduce(rank + 1, op=MPI.PROD, root=0) == (np.prod(range(1, size + 1)) if rank == 0 else None)
    assert comm.scan(1) == rank + 1
    assert comm.exscan(1) == (None if rank == 0 else rank)
    with pytest.raises(MPI.Exception) as raised:
        comm.bcast(None, root=size)
    assert raised.value.Get_error_class() == MPI.ERR_ROOT
    return "ok"


def test_lowercase_collectives() -> None:
    assert spawn(lowercase_collectives, 3, transport="local", timeout=60) == ["ok"] * 3


def lowercase_point_to_point() -> str:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    status = MPI.Status()
    assert comm.recv(None, MPI.PROC_NULL, 0, status) is None and status.source == MPI.PROC_NULL
    comm.send("nothing", MPI.PROC_NULL)
    # an object with a large array: header and array as separate messages, received in one piece
    request = comm.isend({"from": rank, "a": big_array(rank)}, right, tag=5)
    got = comm.recv(source=left, tag=5, status=status)
    request.wait()
    assert got["from"] == left and status.source == left and status.tag == 5
    np.testing.assert_array_equal(got["a"], big_array(left))
    # wildcards, irecv's wait returning the object, the lowercase request family
    receive = comm.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    comm.send(("hello", rank), right, tag=7)
    assert receive.wait(status) == ("hello", left) and (status.source, status.tag) == (left, 7)
    requests = [comm.irecv(source=left, tag=t) for t in (1, 2)]
    sends = [comm.isend(f"t{t}", right, tag=t) for t in (2, 1)]
    assert MPI.Request.waitall(requests) == ["t1", "t2"] and not any(requests)
    MPI.Request.waitall(sends)
    # an uppercase Isend of a pickle is an object to recv, as in mpi4py
    pickled = MPI.pickle.dumps([rank, "x"])
    request = comm.Isend([pickled, MPI.BYTE], right, tag=9)
    assert comm.recv(source=left, tag=9) == [left, "x"]
    request.Wait()
    # probes and matched probes
    comm.send(rank, right, tag=11)
    assert comm.probe(left, 11, status) and status.tag == 11
    message = comm.mprobe(left, 11)
    assert message.recv() == left and not message
    assert comm.sendrecv(rank, right, 3, None, left, 3) == left
    comm.barrier()
    return "ok"


@pytest.mark.parametrize("transport", ["local", "shm"])
def test_lowercase_point_to_point(transport: str) -> None:
    assert spawn(lowercase_point_to_point, 3, transport=transport, timeout=60) == ["ok"] * 3


# -- requests, statuses, persistent requests ------------------------------------------------------

def requests_and_statuses() -> str:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    peer = 1 - rank
    received = [np.zeros(4, np.int32) for _ in range(3)]
    receives = [comm.Irecv(buf, peer, tag) for tag, buf in enumerate(received)]
    sends = [comm.Isend(np.full(2 + tag, rank, np.int32), peer, tag) for tag in range(3)]
    statuses: list = []
    MPI.Request.Waitall(receives + sends, statuses)
    assert len(statuses) == 6 and [s.Get_count(MPI.INT) for s in statuses[:3]] == [2, 3, 4]
    assert all(s.source == peer and s.tag == t for t, s in enumerate(statuses[:3]))
    assert MPI.Request.Waitsome(receives) is None and MPI.Request.Testsome(sends) is None
    # persistent requests: each Start posts the buffer's contents at that time
    outgoing, incoming = np.zeros(1, np.int64), np.zeros(1, np.int64)
    send = comm.Send_init(outgoing, peer, tag=20)
    recv = comm.Recv_init(incoming, peer, tag=20)
    for step in range(3):
        outgoing[0] = 10 * rank + step
        MPI.Prequest.Startall([send, recv])
        MPI.Request.Waitall([send, recv])
        assert incoming[0] == 10 * peer + step and send and recv   # inactive, not null
    send.Free()
    recv.Free()
    assert send == MPI.REQUEST_NULL and not recv
    return "ok"


def test_requests_and_statuses() -> None:
    assert spawn(requests_and_statuses, 2, transport="local", timeout=60) == ["ok"] * 2


def test_status_fields() -> None:
    status = MPI.Status()
    assert (status.source, status.tag, status.error, status.count) == (MPI.ANY_SOURCE, MPI.ANY_TAG, 0, 0)
    status.Set_elements(MPI.DOUBLE, 3)
    assert status.Get_count(MPI.DOUBLE) == 3 and status.Get_count(MPI.BYTE) == 24
    memory = status.tomemory()
    memory[0] = 5
    copy = MPI.Status(status)
    assert copy.source == 5 and pickle.loads(pickle.dumps(copy)).count == 24
    with pytest.raises(TypeError):
        MPI.Status(123)
    null = MPI.Request()
    assert not null and null == MPI.REQUEST_NULL and null.test() == (True, None)
    assert MPI.Request.Waitany([null]) == MPI.UNDEFINED


def test_pkl5_is_installed_with_the_facade(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("mpi4py", "mpi4py.MPI", "mpi4py.util", "mpi4py.util.pkl5"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    install()
    from mpi4py.util import pkl5

    data, buffers = pkl5.pickle.dumps_oob(big_array(1))
    np.testing.assert_array_equal(pkl5.pickle.loads_oob(data, buffers), big_array(1))
    assert pkl5.Request() == MPI.REQUEST_NULL and not pkl5.Message()


def objects_from_threads() -> str:
    """Four threads of each rank exchange objects with large arrays at once, two of them on one tag:
    every object arrives whole (its frames are never interleaved with another's)."""
    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    errors: list[str] = []

    def exchange(index: int, tag: int) -> None:
        try:
            for step in range(5):
                request = comm.isend({"index": index, "a": np.full(BIG // 8, rank * 100 + index, np.float64)},
                                     peer, tag)
                got = comm.recv(source=peer, tag=tag)
                request.wait()
                assert np.all(got["a"] == peer * 100 + got["index"]), (index, step)
        except Exception as error:   # noqa: BLE001 - reported by the main thread
            errors.append(repr(error))
    threads = [threading.Thread(target=exchange, args=(index, tag)) for index, tag in enumerate((1, 2, 3, 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return "ok"


def test_objects_from_threads() -> None:
    # processes: on thread ranks (local) MPI.COMM_WORLD is bound per thread, so a thread a rank
    # starts would see a world of its own
    assert spawn(objects_from_threads, 2, transport="shm", timeout=60) == ["ok"] * 2


def posted_object_receives() -> str:
    """irecv posts a real receive, as mpi4py does: a synchronous send to this rank completes on it;
    the buffers of an object never match a user receive (ANY_TAG included); receives waited in the
    reverse order of posting get their own objects; a pickle larger than irecv's buffer is MPI's
    truncation error and leaves the communicator usable."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    request = comm.irecv()
    comm.ssend({"a": big_array(rank)}, dest=rank, tag=3)
    got = request.wait()
    np.testing.assert_array_equal(got["a"], big_array(rank))
    send = comm.issend("sync", dest=rank, tag=4)
    assert not send.Test() and send   # not matched yet: a synchronous send waits for its receive
    assert comm.recv(source=rank, tag=4) == "sync"
    send.wait()
    comm.barrier()   # the irecv() above takes any source: no rank sends to another before here
    # an object's buffers go on colls' own tags: an ANY_TAG receive matches only the next header
    first, second = comm.irecv(source=left, tag=6), comm.irecv(source=left, tag=6)
    sends = [comm.isend({"n": n, "a": big_array(n)}, right, tag=6) for n in range(2)]
    sends.append(comm.isend("after", right, tag=7))
    status = MPI.Status()
    assert comm.recv(source=left, tag=MPI.ANY_TAG, status=status) == "after" and status.tag == 7
    assert not comm.iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)   # the arrays' frames are there, unseen
    for n, request in ((1, second), (0, first)):   # waited for in reverse order
        got = request.wait()
        assert got["n"] == n
        np.testing.assert_array_equal(got["a"], big_array(n))
    MPI.Request.waitall(sends)
    comm.barrier()
    small = comm.irecv(8, source=left, tag=8)
    comm.send("a pickle longer than 8 bytes", right, tag=8)
    with pytest.raises(MPI.Exception) as raised:
        small.wait()
    assert raised.value.Get_error_class() == MPI.ERR_TRUNCATE
    assert comm.sendrecv(rank, right, 9, None, left, 9) == left
    comm.barrier()
    return "ok"


@pytest.mark.parametrize("transport", ["local", "shm"])
def test_posted_object_receives(transport: str) -> None:
    assert spawn(posted_object_receives, 2, transport=transport, timeout=60) == ["ok"] * 2


def test_request_subclass() -> None:
    class MyRequest(MPI.Request):
        def __new__(cls, request=None):
            return super().__new__(cls, request)

        def test(self):   # mpi4py's test_subclass: Test() must not call an overridden test()
            return super().Test()
    request = MyRequest(MPI.REQUEST_NULL)
    assert isinstance(request, MPI.Request) and not request and request.test()
