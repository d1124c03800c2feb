"""Derived datatypes, reduction operations and foreign buffers of the mpi4py facade (`colls.compat`).

Packing is checked against numpy's own indexing of the same memory (an independent reference);
point-to-point and collectives run on thread ranks (`colls.compat.spawn`) with results compared to
numpy on every rank.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from colls.compat import MPI, spawn
from colls.compat import buffers as compat_buffers


def packed(datatype, buf: np.ndarray, count: int = 1) -> np.ndarray:
    """The bytes `count` elements of `datatype` at the start of `buf` pack into (a send's payload)."""
    return compat_buffers.simple([buf, count, datatype], writable=False).data().copy()


def test_typemaps_pack_like_numpy_indexing() -> None:
    a = np.arange(60, dtype="d").reshape(6, 10)
    column = MPI.DOUBLE.Create_vector(6, 1, 10)
    assert packed(column, a).view("d").tolist() == a[:, 0].tolist()
    assert packed(column.Create_resized(0, 8), a, 3).view("d").tolist() == a[:, :3].T.ravel().tolist()
    block = MPI.DOUBLE.Create_subarray([6, 10], [2, 3], [1, 4])
    assert packed(block, a).view("d").tolist() == a[1:3, 4:7].ravel().tolist()
    fortran = MPI.DOUBLE.Create_subarray([10, 6], [3, 2], [4, 1], order=MPI.ORDER_FORTRAN)
    assert packed(fortran, a).view("d").tolist() == a[1:3, 4:7].ravel().tolist()
    picks = MPI.DOUBLE.Create_indexed([2, 1, 3], [7, 0, 20])
    assert packed(picks, a).view("d").tolist() == [7, 8, 0, 20, 21, 22]
    hpicks = MPI.DOUBLE.Create_hindexed_block(2, [80, 16])
    assert packed(hpicks, a).view("d").tolist() == [10, 11, 2, 3]
    assert (column.size, column.extent, block.extent) == (48, (5 * 10 + 1) * 8, 480)


def test_struct_and_resized_bounds_follow_mpi() -> None:
    pair = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.DOUBLE, MPI.INT])
    assert (pair.size, pair.extent, pair.true_extent) == (12, 16, 12)   # padded to double alignment
    records = np.zeros(3, np.dtype([("x", "d"), ("n", "i")], align=True))
    records["x"], records["n"] = [1.5, 2.5, 3.5], [7, 8, 9]
    payload = packed(pair, records.view(np.uint8), 3)
    assert payload.size == 36 and payload[24:32].view("d")[0] == 3.5 and payload[32:36].view("i")[0] == 9
    shifted = MPI.INT.Create_resized(-4, 12)
    assert (shifted.lb, shifted.ub, shifted.extent, shifted.true_lb, shifted.true_extent) == (-4, 8, 12, 0, 4)
    with pytest.raises(ValueError, match="3 datatypes"):
        MPI.Datatype.Create_struct([1], [0], [MPI.INT, MPI.FLOAT, MPI.INT])
    with pytest.raises(ValueError, match="need 48 bytes"):
        compat_buffers.simple([np.zeros(5, "d"), 1, MPI.DOUBLE.Create_vector(2, 1, 5)], True)


def test_decode_and_pickle_rebuild_the_type() -> None:
    vector = MPI.INT.Create_vector(2, 1, 3).Commit()
    assert vector.Get_envelope() == (0, 0, 3, 1, MPI.COMBINER_VECTOR)
    old, combiner, params = vector.decode()
    assert old == MPI.INT and combiner == "VECTOR" and params == {"count": 2, "blocklength": 1, "stride": 3}
    again = pickle.loads(pickle.dumps(vector))
    assert again != vector and again.decode()[2] == params and again.extent == vector.extent
    assert pickle.loads(pickle.dumps(MPI.DOUBLE)) is MPI.DOUBLE
    copy = MPI.Datatype(MPI.DOUBLE)
    assert copy == MPI.DOUBLE and copy is not MPI.DOUBLE and MPI.Datatype() == MPI.DATATYPE_NULL
    vector.Free()
    assert vector == MPI.DATATYPE_NULL and old == MPI.INT   # Free nulls that handle only


def test_ops_are_handles_with_mpi4py_semantics() -> None:
    assert MPI.Op() == MPI.OP_NULL and pickle.loads(pickle.dumps(MPI.MAX)) is MPI.MAX
    x, i, y, j = [1], [2], [2], [1]
    assert MPI.MINLOC([x, i], [y, j])[0] is x and MPI.MAXLOC([x, i], [y, j])[1] is j
    with pytest.raises(ValueError):
        MPI.OP_NULL(1, 2)
    ops = [MPI.Op.Create(lambda a, b, t: None) for _ in range(32)]
    with pytest.raises(RuntimeError, match="too many"):
        MPI.Op.Create(lambda a, b, t: None)
    for op in ops:
        op.Free()
    MPI.Op.Create(lambda a, b, t: None).Free()


class HostArray:
    """Host memory exported only through __cuda_array_interface__ (as mpi4py's FakeGPUArray)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.__cuda_array_interface__ = {"version": 0, "data": (array.ctypes.data, False),
                                         "typestr": array.dtype.str, "shape": array.shape}


def derived_program() -> bool:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    peer = (rank + 1) % size
    grid = np.arange(20, dtype="d").reshape(4, 5) + 100 * rank
    second, fourth = (MPI.DOUBLE.Create_indexed_block(1, [c + 5 * k for k in range(4)]).Commit()
                      for c in (1, 3))
    got = np.full((4, 5), -1.0)
    comm.Sendrecv([grid, 1, second], peer, 7, [got, 1, fourth], (rank - 1) % size, 7)
    expected = np.full((4, 5), -1.0)
    expected[:, 3] = np.arange(20).reshape(4, 5)[:, 1] + 100 * ((rank - 1) % size)
    assert np.array_equal(got, expected)
    evens = MPI.INT.Create_indexed_block(1, [0, 2, 4, 6]).Commit()
    buf = np.arange(8, dtype="i") if rank == 0 else np.full(8, -1, "i")
    comm.Bcast([buf, 1, evens], root=0)
    assert buf.tolist() == ([0, 1, 2, 3, 4, 5, 6, 7] if rank == 0 else [0, -1, 2, -1, 4, -1, 6, -1])
    pairs = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()   # doubles 0 and 2 of each 3 (extent 24 bytes)
    values = np.arange(8.0) * (rank + 1)
    total = np.zeros(8)
    comm.Allreduce([values, 2, pairs], [total, 2, pairs], op=MPI.SUM)
    scale = size * (size + 1) / 2
    assert total.tolist() == [v * scale if k in (0, 2, 3, 5) else 0.0 for k, v in enumerate(np.arange(8.0))]
    send, recv = np.full((size, 2), rank, "i"), np.full((size, 2), -1, "i")
    saddr, raddr = MPI.Get_address(send), MPI.Get_address(recv)
    stypes = [MPI.Datatype.Create_struct([2], [saddr + 8 * r], [MPI.INT]).Commit() for r in range(size)]
    rtypes = [MPI.Datatype.Create_struct([2], [raddr + 8 * r], [MPI.INT]).Commit() for r in range(size)]
    ones, zeros = [1] * size, [0] * size
    comm.Alltoallw((MPI.BOTTOM, (ones, zeros), stypes), (MPI.BOTTOM, (ones, zeros), rtypes))
    assert recv.tolist() == [[r, r] for r in range(size)]
    host = np.full(3, rank + 1.0)
    out = HostArray(np.zeros(3))
    comm.Allreduce(HostArray(host), out, op=MPI.SUM)
    assert out.array.tolist() == [scale] * 3
    return True


def test_derived_datatypes_in_point_to_point_and_collectives() -> None:
    assert spawn(derived_program, 3, transport="local", timeout=60) == [True, True, True]
