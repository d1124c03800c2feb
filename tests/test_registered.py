"""Registered memory (`colls.alloc`, `transports.registered`): arrays whose big messages the shm
transport's peers copy straight out of a mapping of the sender's memfd. These check the allocator
and that every collective still gives numpy's answer when its buffers are registered on some ranks,
all of them or none, with the mapped path counted so that a test cannot pass without taking it."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import colls
from transports import registered
from transports.shm import ShmOptions, shm_group
from transports.shm.rendezvous import MAPPED_CACHE

BIG = 1 << 20   # bytes per message: above MAPPED_BYTES, so registered sends go mapped


def test_alloc_gives_zeroed_writable_arrays_whose_views_are_registered():
    x = colls.alloc((3, 4), np.int32)
    assert x.shape == (3, 4) and x.dtype == np.int32 and x.flags.writeable and x.flags.c_contiguous
    assert not x.any()
    x[...] = 7
    region = registered.region_of(x.ctypes.data, x.nbytes)
    assert region is not None and region.size >= x.nbytes
    row = x[1]
    assert registered.region_of(row.ctypes.data, row.nbytes) is region
    assert registered.region_of(np.ones(12, np.int32).ctypes.data, 48) is None
    # a range running past the region's end is not registered
    assert registered.region_of(x.ctypes.data, region.size + 1) is None


def test_a_region_leaves_the_registry_and_closes_its_memfd_once_its_last_view_goes():
    x = colls.alloc(1000, np.float64)
    view = x[10:20]
    region = registered.region_of(x.ctypes.data, 8)
    fd = region.fd
    os.fstat(fd)   # open
    del x
    gc.collect()
    assert registered.region_of(view.ctypes.data, 8) is region   # the view keeps it
    address = view.ctypes.data
    del view
    gc.collect()
    assert registered.region_of(address, 8) is None
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("shape,dtype,word", [((-1,), np.float32, "shape"), ((2, 1.5), np.float32, "shape"),
                                              ((3,), object, "dtype")])
def test_alloc_names_the_bad_argument(shape, dtype, word):
    with pytest.raises(colls.InvalidArgument, match=word):
        colls.alloc(shape, dtype)


def _count_mapped(comm) -> list[int]:
    """Count this rank's receives of registered messages (the transport's own method, wrapped)."""
    count = [0]
    memory = comm.transport.peer_memory
    read = memory.read_mapped

    def counted(*args):
        count[0] += 1
        return read(*args)

    memory.read_mapped = counted
    return count


def _every_collective(comm, which: str) -> tuple[list[str], int]:
    """Every collective on 1 MiB messages, with buffers registered on every rank ("all"), on even
    ranks only ("even") or none ("none"); the names of the wrong results, and the mapped receives."""
    mapped = _count_mapped(comm)
    rank, size = comm.rank, comm.size
    mine = which == "all" or (which == "even" and rank % 2 == 0)

    def buffer(count: int, dtype=np.float32) -> np.ndarray:
        return colls.alloc(count, dtype) if mine else np.zeros(count, dtype)

    n = BIG // 4
    wrong = []

    def values(r: int, count: int, dtype=np.float32) -> np.ndarray:
        return ((np.arange(count) * 7 + 3 * r) % 11).astype(dtype)

    x = buffer(n)
    x[:] = values(rank, n)
    out = buffer(n)
    comm.all_reduce(x, out=out)
    if not np.array_equal(out, sum(values(r, n) for r in range(size))):
        wrong.append("all_reduce")
    ints = buffer(n, np.int64)
    ints[:] = values(rank, n, np.int64)
    comm.all_reduce(ints, op="max", out=ints)
    if not np.array_equal(ints, np.max([values(r, n, np.int64) for r in range(size)], axis=0)):
        wrong.append("all_reduce max in place")
    block = n // size
    gathered = buffer(block * size)
    comm.all_gather(x[:block], out=gathered)
    if not np.array_equal(gathered, np.concatenate([values(r, n)[:block] for r in range(size)])):
        wrong.append("all_gather")
    swapped = buffer(block * size)
    comm.all_to_all(x[:block * size], out=swapped)
    if not np.array_equal(swapped, np.concatenate([values(r, n)[rank * block:(rank + 1) * block]
                                                   for r in range(size)])):
        wrong.append("all_to_all")
    user = mapped[0]   # reduce_scatter and reduce may send from the communicator's registered scratch
    part = buffer(block)
    comm.reduce_scatter(x[:block * size], out=part)
    if not np.array_equal(part, sum(values(r, n)[:block * size] for r in range(size))[rank * block:][:block]):
        wrong.append("reduce_scatter")
    shared = buffer(n)
    if rank == 1 % size:
        shared[:] = values(99, n)
    comm.broadcast(shared, root=1 % size, out=shared)
    if not np.array_equal(shared, values(99, n)):
        wrong.append("broadcast")
    total = comm.reduce(x, root=0)
    if rank == 0 and not np.array_equal(total, sum(values(r, n) for r in range(size))):
        wrong.append("reduce")
    before_p2p = mapped[0]
    if size > 1:   # point to point: a ring of sends
        incoming = buffer(n)
        sent = comm.send(x, (rank + 1) % size, async_op=True)
        comm.recv(incoming, (rank - 1) % size)
        sent.wait()
        if not np.array_equal(incoming, values((rank - 1) % size, n)):
            wrong.append("sendrecv")
    return wrong, user + mapped[0] - before_p2p


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("which", ["all", "even", "none"])
def test_every_collective_gives_numpys_answer_from_registered_memory(size, which):
    results = colls.spawn(_every_collective, size, transport="shm", args=(which,), timeout=90)
    for rank, (wrong, _) in enumerate(results):
        assert not wrong, (rank, wrong)
    mapped = sum(count for _, count in results)   # (of the user's buffers, not colls' scratch)
    assert (mapped > 0) == (which != "none"), mapped


def _folding_calls(comm, calls: int) -> tuple[list[str], int, int, bool]:
    """reduce_scatter by `ring` and reduce by `binomial` (schedules that fold into a copy of their
    input) on plain 1 MiB arrays, `calls` times: wrong results, mapped receives, how many scratch
    buffers the communicator made, and whether its scratch is registered."""
    mapped = _count_mapped(comm)
    rank, size = comm.rank, comm.size
    n = BIG // 4 // size * size
    wrong, made, last = [], 0, None
    for call in range(calls):
        inputs = [((np.arange(n) * 5 + r + call) % 13).astype(np.float32) for r in range(size)]
        part = comm.reduce_scatter(inputs[rank], algorithm="ring")
        if not np.array_equal(part, sum(inputs).reshape(size, -1)[rank]):
            wrong.append(f"reduce_scatter {call}")
        total = comm.reduce(inputs[rank], root=0, algorithm="binomial")
        if rank == 0 and not np.array_equal(total, sum(inputs)):
            wrong.append(f"reduce {call}")
        if comm._scratch_bytes is not last:
            made, last = made + 1, comm._scratch_bytes
    region = registered.region_of(last.ctypes.data, last.nbytes)
    return wrong, mapped[0], made, region is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_folding_schedules_work_in_one_registered_scratch_from_call_to_call(size):
    results = colls.spawn(_folding_calls, size, transport="shm", args=(5,), timeout=90)
    for rank, (wrong, _, made, is_registered) in enumerate(results):
        assert not wrong, (rank, wrong)
        assert made == 1, (rank, made)   # made on the first call, kept after
        assert is_registered, rank
    assert sum(mapped for _, mapped, _, _ in results) > 0


def _churn(comm, regions: int) -> tuple[bool, int]:
    """Broadcast from a fresh registered array each time (new regions, freed ones) and say whether
    every result was right and how many peer regions this rank held mapped at most."""
    ok, held = True, 0
    for i in range(regions):
        x = colls.alloc(BIG // 8, np.float64)
        if comm.rank == 0:
            x[:] = np.arange(x.size) + i
        comm.broadcast(x, root=0, out=x)
        ok = ok and np.array_equal(x, np.arange(x.size) + i)
        held = max(held, max(len(cache) for cache in comm.transport.peer_memory.regions))
        del x
    return ok, held


@pytest.mark.timeout(120)
def test_regions_made_and_freed_in_turn_stay_right_and_the_peers_mappings_stay_bounded():
    results = colls.spawn(_churn, 2, transport="shm", args=(3 * MAPPED_CACHE,), timeout=90)
    for rank, (ok, held) in enumerate(results):
        assert ok, rank
        assert held <= MAPPED_CACHE, (rank, held)
    assert results[1][1] > 0   # rank 1 mapped rank 0's regions


def _mappable_and_right(comm, map_registered: bool) -> tuple[bool, bool]:
    transport = shm_group(comm.rank, range(comm.size), comm._exchange,
                          options=ShmOptions(map_registered=map_registered))
    group = colls.Communicator(transport)
    try:
        x = colls.alloc(BIG // 4, np.float32)
        x[:] = comm.rank + 1
        out = group.all_reduce(x)
        right = bool(np.all(out == sum(range(1, comm.size + 1))))
        return transport.capabilities.maps_registered_memory, right
    finally:
        group.close()


@pytest.mark.timeout(60)
def test_map_registered_false_turns_the_mapped_path_off():
    for mapped in (False, True):
        results = colls.spawn(_mappable_and_right, 2, transport="shm", args=(mapped,), timeout=30)
        assert results == [(mapped, True)] * 2
