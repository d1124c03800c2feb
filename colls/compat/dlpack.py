"""Foreign buffers: DLPack (`__dlpack__`) and CUDA array interface (`__cuda_array_interface__`)
exporters, read the way mpi4py reads them.

Host memory is used as it is (numpy views of the exporter's memory). A `__cuda_array_interface__`
pointer is host memory unless the CUDA driver says it is device memory: where no CUDA driver can be
loaded, or it has no context in this process, no pointer can be device memory. Device memory is
refused with a clear error (colls' transports move host memory).

mpi4py (asdlpack.pxi) takes the capsule's tensor pointer and keeps the capsule alive as the owner,
without consuming it; `numpy.from_dlpack` consumes it instead and later calls the producer's deleter,
which some producers (mpi4py's own test helper among them) do not expect. So this module reads the
DLTensor with ctypes and keeps the capsule referenced from the array it returns.
"""

from __future__ import annotations

import ctypes

import numpy as np

CPU = 1
READ_ONLY_FLAG = 1
_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}   # DLDataTypeCode -> numpy kind


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def host_array(obj: object) -> np.ndarray:
    """A 1-D numpy view of a CPU DLPack tensor's elements (read-only if the producer says so)."""
    device_type, _ = obj.__dlpack_device__()   # type: ignore[attr-defined]
    if device_type != CPU:
        raise NotImplementedError("device (GPU) DLPack buffers are not supported by the colls mpi4py facade")
    try:
        capsule, name = obj.__dlpack__(max_version=(1, 0), copy=False), b"dltensor_versioned"  # type: ignore
    except TypeError:
        capsule, name = obj.__dlpack__(), b"dltensor"   # type: ignore[attr-defined]
    if not _is_valid(capsule, name):
        raise BufferError("dlpack: invalid capsule object")
    address = _get_pointer(capsule, name)
    if name == b"dltensor_versioned":
        managed = _ManagedVersioned.from_address(address)
        readonly = bool(managed.flags & READ_ONLY_FLAG)
    else:
        managed, readonly = _Managed.from_address(address), False
    tensor = managed.dl_tensor
    kind, lanes, bits = _KINDS.get(tensor.dtype.code), tensor.dtype.lanes, tensor.dtype.bits
    if kind == "f" and lanes == 2:   # complex long double travels as two lanes of long double
        kind, lanes, bits = "c", 1, 2 * bits
    if kind is None or lanes != 1:
        raise BufferError(f"dlpack: unsupported element type (code {tensor.dtype.code}, {lanes} lanes)")
    dtype = np.dtype("?") if kind == "b" else np.dtype(f"{kind}{bits // 8}")
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    count = int(np.prod(shape, dtype=np.int64))
    if tensor.strides and count > 1:
        expected = 1
        for axis in reversed(range(tensor.ndim)):
            if shape[axis] > 1 and tensor.strides[axis] != expected:
                raise BufferError("dlpack: the buffer is not C-contiguous")
            expected *= shape[axis]
    if count == 0:
        return np.empty(0, dtype)
    holder = (ctypes.c_char * (count * dtype.itemsize)).from_address(tensor.data + tensor.byte_offset)
    holder._capsule = capsule   # the capsule owns the memory: keep it as long as the array lives
    array = np.frombuffer(holder, dtype)
    if readonly:
        array.flags.writeable = False
    return array


CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_UNIFIED = 2, 3, 4
_driver: list = []   # [the CUDA driver library or None], loaded on first use


def _cuda_driver() -> ctypes.CDLL | None:
    if not _driver:
        try:
            _driver.append(ctypes.CDLL("libcuda.so.1"))
        except OSError:
            _driver.append(None)
    return _driver[0]


def is_device_pointer(address: int) -> bool:
    """Whether `address` is CUDA device (or array) memory of this process, by the CUDA driver."""
    driver = _cuda_driver()
    if driver is None:
        return False
    kind = ctypes.c_uint(0)
    status = driver.cuPointerGetAttribute(ctypes.byref(kind), CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                          ctypes.c_uint64(address))
    return status == 0 and kind.value in (CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY)


def cuda_array(obj: object) -> np.ndarray:
    """A 1-D numpy view of the host memory an object exports through `__cuda_array_interface__`.

    Args:
        obj: the exporter (mpi4py's FakeGPUArray backends, CuPy/Numba arrays of host memory).

    Returns:
        The elements, read-only where the interface says so.

    Raises:
        BufferError: not C-contiguous, or a masked array.
        NotImplementedError: the pointer is device memory.
    """
    interface = obj.__cuda_array_interface__   # type: ignore[attr-defined]
    address, readonly = interface["data"]
    dtype = np.dtype(interface["typestr"])
    shape = tuple(int(n) for n in interface["shape"])
    if interface.get("mask") is not None:
        raise BufferError("__cuda_array_interface__: masked arrays are not supported")
    count = int(np.prod(shape, dtype=np.int64))
    strides = interface.get("strides")
    if strides is not None and count > 1:
        expected = dtype.itemsize
        for axis in reversed(range(len(shape))):
            if shape[axis] > 1 and strides[axis] != expected:
                raise BufferError("__cuda_array_interface__: the buffer is not C-contiguous")
            expected *= shape[axis]
    if count == 0:
        return np.empty(0, dtype)
    if not address:
        raise BufferError(f"__cuda_array_interface__: a null data pointer for {count} elements")
    if is_device_pointer(address):
        raise NotImplementedError("device (GPU) memory behind __cuda_array_interface__ is not supported by "
                                  "the colls mpi4py facade: colls moves host memory (copy to the host first)")
    holder = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    holder._exporter = obj   # keep the exporter (the memory's owner) alive as long as the array
    array = np.frombuffer(holder, dtype)
    if readonly:
        array.flags.writeable = False
    return array


def address_of(obj: object) -> int:
    """The address of the first byte of a buffer, DLPack or `__cuda_array_interface__` object
    (0 for None and MPI.BOTTOM).

    Raises:
        TypeError: `obj` exposes no memory.
    """
    from .buffers import BOTTOM

    if obj is None or obj is BOTTOM:   # MPI_BOTTOM is address 0
        return 0
    if hasattr(obj, "__cuda_array_interface__"):
        return int(obj.__cuda_array_interface__["data"][0])   # type: ignore[attr-defined]
    if isinstance(obj, np.ndarray):
        return int(obj.__array_interface__["data"][0])
    try:
        view = memoryview(obj)   # type: ignore[arg-type]
    except TypeError:
        if hasattr(obj, "__dlpack__"):
            array = host_array(obj)
            return int(array.__array_interface__["data"][0]) if array.size else 0
        raise TypeError(f"Get_address: expecting a buffer, got {type(obj).__name__}") from None
    if view.nbytes == 0:
        return 0
    return int(np.frombuffer(view.cast("B") if view.c_contiguous else view, np.uint8)
               .__array_interface__["data"][0])
