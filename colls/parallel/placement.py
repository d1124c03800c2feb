"""Where a training run's arrays live: numpy on the host, or cupy on a GPU (`colls train --device cuda`).

Only the places that make arrays need to know: parameters and batches are drawn on the host (so every
device gets the same numbers) and moved once; everything computed from them stays where they are,
since numpy's functions dispatch to cupy for cupy arrays.
"""

from __future__ import annotations

import numpy as np

from colls.device import is_cupy, module_of

DEVICES = ("cpu", "cuda")


def array_module(device: str):
    """numpy for "cpu", cupy for "cuda"."""
    if device == "cuda":
        import cupy

        return cupy
    if device != "cpu":
        raise ValueError(f"device {device!r}: choose one of {DEVICES}")
    return np


def to_device(array: np.ndarray, device: str):
    """`array` on `device` (a copy to the GPU for "cuda"; unchanged for "cpu")."""
    return array if device == "cpu" else array_module(device).asarray(array)


def to_host(array) -> np.ndarray:
    """A numpy copy of a cupy array (a numpy array unchanged): for reports and comparisons."""
    return array.get() if is_cupy(array) else array


def like(reference, array: np.ndarray):
    """Host `array` where `reference` lives (a copy to the GPU when `reference` is a cupy array)."""
    return array if module_of(reference) is np else module_of(reference).asarray(array)


def contiguous(array, dtype=None):
    """`array` as a C-contiguous array of `dtype` where it lives (numpy's ascontiguousarray would
    try to bring a cupy array to the host)."""
    return module_of(array).ascontiguousarray(array, dtype)


def scatter_add(target, indices, values) -> None:
    """target[indices] += values, adding repeated indices up (numpy's and cupy's add.at; before
    cupy 13, cupyx.scatter_add)."""
    at = getattr(module_of(target).add, "at", None)
    if at is not None:
        at(target, indices, values)
    else:
        import cupyx

        cupyx.scatter_add(target, indices, values)
