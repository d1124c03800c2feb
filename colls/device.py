"""Device arrays in collectives: which array module a buffer belongs to, and DLPack conversion.

Every collective accepts cupy arrays (and, through DLPack, other CUDA arrays such as torch
tensors) with the same API as numpy ones, on a communicator over the `cuda_ipc` transport. The
algorithms are the same code: they call numpy's functions, which dispatch to cupy for cupy
arrays (NEP 18's `__array_function__` and `__array_ufunc__`), so reductions run as cupy kernels.
cupy is imported only when a non-numpy array is seen, so host-only programs never load it.
"""

from __future__ import annotations

import numpy as np

DLPACK_CUDA = 2   # kDLCUDA, the device type `__dlpack_device__` reports for CUDA memory


def is_cupy(x: object) -> bool:
    """Whether `x` is a cupy ndarray (without importing cupy when it is not)."""
    kind = type(x)
    return kind.__name__ == "ndarray" and kind.__module__.split(".", 1)[0] == "cupy"


def is_cuda_dlpack(x: object) -> bool:
    """Whether `x` is a CUDA array of another library that DLPack can hand to cupy (torch, JAX)."""
    probe = getattr(x, "__dlpack_device__", None)
    if probe is None or type(x) is np.ndarray or is_cupy(x):
        return False
    try:
        return int(probe()[0]) == DLPACK_CUDA
    except Exception:
        return False


def as_cupy(x: object):
    """A cupy view of a CUDA DLPack array (no copy: in-place calls write into `x`)."""
    import cupy

    return cupy.from_dlpack(x)


def module_of(x: object):
    """numpy, or cupy for a cupy array: where a call's buffers are allocated."""
    if type(x) is np.ndarray or not is_cupy(x):
        return np
    import cupy

    return cupy
