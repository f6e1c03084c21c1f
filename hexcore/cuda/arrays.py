"""Argument checks shared by every launcher: dtype, shape, contiguity, device, alignment.

Launchers validate here, in Python, and raise ``HexcoreInvalidArgumentError`` naming
the argument and its actual value; kernels never raise.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..errors import HexcoreInvalidArgumentError


def as_device_array(x, name: str = "array"):
    """A numba device view of ``x``: a device array, a CUDA tensor, or a host numpy array
    (copied to the device; convenient, but not capture-safe)."""
    if isinstance(x, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(x))
    if hasattr(x, "copy_to_host"):  # a numba device array (or the simulator's)
        return x
    if hasattr(x, "__cuda_array_interface__"):  # torch and other exporters
        return cuda.as_cuda_array(x)
    device = getattr(x, "device", None)
    if device is not None:
        raise HexcoreInvalidArgumentError(f"{name}: expected a CUDA array, got one on device {device}")
    raise HexcoreInvalidArgumentError(f"{name}: expected a CUDA or numpy array, got {type(x).__name__}")


def device_only(**arrays) -> None:
    """Raise HexcoreInvalidArgumentError for a host (numpy) array: prepared launches bind
    device buffers once, and a host array would be copied to a new buffer per call."""
    for name, x in arrays.items():
        if isinstance(x, np.ndarray):
            raise HexcoreInvalidArgumentError(
                f"{name}: a prepared launch needs a device array or CUDA tensor, got a host numpy array")


def device_pointer(x) -> int | None:
    """The device address of ``x``'s first element, or None where it has none (simulator)."""
    iface = getattr(x, "__cuda_array_interface__", None)
    return None if iface is None else int(iface["data"][0])


def checked(x, name: str, dtype, shape: tuple, align: int = 16):
    """``x`` as a C-contiguous device array of ``dtype`` and ``shape`` (None = any size).

    Raises HexcoreInvalidArgumentError naming ``name`` and the actual dtype, shape,
    strides or address.
    """
    arr = as_device_array(x, name)
    if np.dtype(arr.dtype) != np.dtype(dtype):
        raise HexcoreInvalidArgumentError(f"{name}: expected dtype {np.dtype(dtype)}, got {np.dtype(arr.dtype)}")
    if len(arr.shape) != len(shape) or any(e is not None and e != a for e, a in zip(shape, arr.shape)):
        want = tuple("*" if e is None else e for e in shape)
        raise HexcoreInvalidArgumentError(f"{name}: expected shape {want}, got {tuple(arr.shape)}")
    if arr.size and not _c_contiguous(arr.shape, arr.strides, np.dtype(arr.dtype).itemsize):
        raise HexcoreInvalidArgumentError(f"{name}: expected C-contiguous strides, got {arr.strides} for shape {arr.shape}")
    ptr = device_pointer(arr)
    if ptr is not None and align > 1 and ptr % align:
        raise HexcoreInvalidArgumentError(f"{name}: expected a {align}-byte aligned address, got {ptr:#x}")
    return arr


def checked_ids(x, name: str, count: int | None, upper: int, lower: int = 0):
    """A device int32 1-D array of ids; host arrays are range-checked before the copy.

    Device arrays are checked for dtype and shape only (reading them back would
    synchronise); kernels skip ids outside ``[lower, upper)``, so nothing is written
    out of bounds.
    """
    if isinstance(x, np.ndarray):
        if x.dtype != np.int32:
            raise HexcoreInvalidArgumentError(f"{name}: expected dtype int32, got {x.dtype}")
        if x.ndim != 1 or (count is not None and x.shape[0] != count):
            raise HexcoreInvalidArgumentError(f"{name}: expected shape ({'*' if count is None else count},), got {x.shape}")
        bad = np.flatnonzero((x < lower) | (x >= upper))
        if bad.size:
            raise HexcoreInvalidArgumentError(
                f"{name}[{bad[0]}] = {x[bad[0]]} is outside [{lower}, {upper})")
    return checked(x, name, np.int32, (count,), align=4)


def _c_contiguous(shape, strides, itemsize: int) -> bool:
    """C order, ignoring the strides of axes of extent 1 (numpy gives those any value)."""
    expected = itemsize
    for extent, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True
