"""Argument checks shared by every launcher: store, layer, dtype, shape, contiguity,
device, alignment, writability and overlap.

Launchers validate here, in Python, and raise ``HexcoreInvalidArgumentError`` naming
the argument and its actual value; kernels never raise. One function per kind of
argument, so every launcher (``write.py``, ``blocks.py``, ``attention/launcher.py``,
``steps/``) gives the same message for the same mistake:

- :func:`checked_store`: a :class:`~hexcore.cuda.DeviceKVStore` (not None, not a config);
- :func:`checked_layer`: a layer index (the integer rule of ``hexcore._checks.as_int``);
- :func:`checked`: a C-contiguous device array of a dtype and shape (host numpy arrays
  are copied to the device; an *output* must already be a writable device array);
- :func:`checked_ids`: an int32 id vector, range-checked when it is a host array;
- :func:`check_distinct`, :func:`check_disjoint`, :func:`check_distinct_pairs`: ids
  that one launch writes must not repeat, nor be read by the same launch (a race on a
  GPU); :func:`check_outside_store`: an input must not be a view of the store the
  launch writes; :func:`check_separate`: an output must not overlap another array of
  the launch; :func:`check_writes`: both for a launch's outputs.

What is not checked, because it would need a device-to-host copy (a synchronisation):
the values of device id arrays, repeats and overlaps among device id arrays, and the
device an array lives on when several GPUs are in use. The append, seal, copy and
dequantize kernels skip ids out of range, so nothing is written outside the store (a
wrong id gives a wrong result). The decode kernel clamps each ``seq_lens`` entry to its
table row and to the ``max_seq_len`` its grid and workspace were sized for, and skips
block ids and tail slots out of range (``attention/kernel.py``), so it never reads
outside its arrays or the store either.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._checks import as_int, shown
from ..errors import HexcoreInvalidArgumentError
from .device import SIMULATOR
from .views import memo

OUTPUTS = frozenset({"out"})  # argument names `checked` treats as outputs (written by the launch)


def checked_store(store, name: str = "store"):
    """``store`` if it is a DeviceKVStore, else HexcoreInvalidArgumentError naming ``name``."""
    from .store import DeviceKVStore  # store.py imports this module

    if not isinstance(store, DeviceKVStore):
        raise HexcoreInvalidArgumentError(f"{name}: expected a DeviceKVStore, got {type(store).__name__}")
    return store


def checked_layer(layer, num_layers: int, allow_all: bool = False) -> tuple[int, int]:
    """(first layer, layer count) for ``layer``: an int in ``[0, num_layers)`` (numpy
    integers accepted, bools refused), or None for all layers when ``allow_all``."""
    if layer is None and allow_all:
        return 0, num_layers
    try:
        return as_int("layer", layer, 0, num_layers - 1), 1
    except HexcoreInvalidArgumentError:
        tail = " or None" if allow_all else ""
        raise HexcoreInvalidArgumentError(
            f"layer: expected an int in [0, {num_layers}){tail}, got {shown(layer, 80)}") from None


def is_numba_array(x) -> bool:
    """True for a numba device array (or the simulator's), not for other CUDA exporters."""
    return hasattr(type(x), "copy_to_host") and hasattr(x, "dtype")


def as_device_array(x, name: str = "array", output: bool = False):
    """A numba device view of ``x``: a device array, a CUDA tensor, or a host numpy array
    (copied to the device; convenient, but not capture-safe).

    With ``output`` (the launch writes ``x``) a host array is refused, since the launch
    would write a copy and leave ``x`` untouched, and so is an exporter that marks its
    memory read-only.
    """
    if isinstance(x, np.ndarray):
        if output:
            raise HexcoreInvalidArgumentError(
                f"{name}: an output must be a device array or CUDA tensor, got a host numpy array "
                f"({'read-only, ' if not x.flags.writeable else ''}it would not be written)")
        if x.dtype.kind not in "biufc":
            raise HexcoreInvalidArgumentError(f"{name}: expected a numeric array, got dtype {x.dtype}")
        try:
            return cuda.to_device(np.ascontiguousarray(x))
        except MemoryError:
            from ..errors import HexcoreOOMError

            raise HexcoreOOMError(f"{name}: no device memory for a copy of {x.nbytes} bytes") from None
    if is_numba_array(x):
        return x
    iface = _interface(x, name)
    if iface is not None:
        if output and _read_only(iface):
            raise HexcoreInvalidArgumentError(f"{name}: an output must be writable, got a read-only "
                                              f"{type(x).__name__}")
        try:
            return cuda.as_cuda_array(x)
        except Exception as exc:
            raise HexcoreInvalidArgumentError(f"{name}: cannot use {type(x).__name__} as a CUDA array "
                                              f"({exc})") from None
    device = getattr(x, "device", None)
    if device is not None and not callable(device):
        raise HexcoreInvalidArgumentError(f"{name}: expected a CUDA array, got one on device {device}")
    raise HexcoreInvalidArgumentError(f"{name}: expected a CUDA or numpy array, got {type(x).__name__}")


def _read_only(iface) -> bool:
    data = iface.get("data") if isinstance(iface, dict) else None
    return isinstance(data, tuple) and len(data) == 2 and bool(data[1])


def device_only(**arrays) -> None:
    """Raise HexcoreInvalidArgumentError for a host (numpy) array: prepared launches bind
    device buffers once, and a host array would be copied to a new buffer per call."""
    for name, x in arrays.items():
        if isinstance(x, np.ndarray):
            raise HexcoreInvalidArgumentError(
                f"{name}: a prepared launch needs a device array or CUDA tensor, got a host numpy array")


def device_pointer(x) -> int | None:
    """The device address of ``x``'s first element, or None where it has none (simulator).
    A numba array's is kept on it (``views.memo``; its interface is rebuilt per call: a
    context-free but Python-heavy dict, asked for by every check of every launch)."""
    if is_numba_array(x) and not SIMULATOR:
        return memo(x, ("pointer",), _pointer)
    return _pointer(x)


def _pointer(x) -> int | None:
    iface = getattr(x, "__cuda_array_interface__", None)
    return None if iface is None else int(iface["data"][0])


def checked(x, name: str, dtype, shape: tuple, align: int = 16, output: bool | None = None, view: bool = True):
    """``x`` as a C-contiguous device array of ``dtype`` and ``shape`` (None = any size).

    ``output``: the launch writes ``x`` (default: ``name`` is in :data:`OUTPUTS`), so it
    must be a writable device array (see :func:`as_device_array`). Host arrays are
    checked for dtype and shape before they are copied. ``view=False``: a CUDA tensor (any
    exporter other than a numba array) is checked from its ``__cuda_array_interface__``
    and returned as it is, for a caller that hands it to torch only (a numba view cost
    about 0.1 ms of host time per call under cProfile on the H200 machine). Raises
    HexcoreInvalidArgumentError naming ``name`` and the actual dtype, shape, strides,
    address or device.
    """
    if output is None:
        output = name in OUTPUTS
    if isinstance(x, np.ndarray) and not output:
        check_dtype_shape(name, x.dtype, x.shape, dtype, shape)  # before a copy of the wrong array
    if not view and not isinstance(x, np.ndarray) and not is_numba_array(x):
        iface = _interface(x, name)
        if iface is not None:
            return _checked_export(x, iface, name, dtype, shape, align, output)
    arr = as_device_array(x, name, output)
    _check_layout(name, arr.dtype, arr.shape, arr.strides, device_pointer(arr), dtype, shape, align)
    return arr


def _check_layout(name, have_dtype, have_shape, strides, ptr, dtype, shape, align) -> None:
    """dtype and shape, C-contiguous ``strides`` (None: C order), ``ptr`` a multiple of
    ``align`` (None: no address, the simulator)."""
    check_dtype_shape(name, have_dtype, have_shape, dtype, shape)
    if strides is not None and int(np.prod(have_shape)) and \
            not _c_contiguous(have_shape, strides, np.dtype(have_dtype).itemsize):
        raise HexcoreInvalidArgumentError(f"{name}: expected C-contiguous strides, got {strides} for shape "
                                          f"{tuple(have_shape)}")
    if ptr is not None and align > 1 and ptr % align:
        raise HexcoreInvalidArgumentError(f"{name}: expected a {align}-byte aligned address, got {ptr:#x}")


def _interface(x, name: str):
    try:
        return getattr(x, "__cuda_array_interface__", None)
    except Exception as exc:  # torch raises for a tensor that requires grad
        raise HexcoreInvalidArgumentError(f"{name}: cannot export {type(x).__name__} to CUDA ({exc})") from None


def _checked_export(x, iface, name, dtype, shape, align, output):
    """``checked`` of a CUDA-array exporter from its interface dict (``x`` returned)."""
    if output and _read_only(iface):
        raise HexcoreInvalidArgumentError(f"{name}: an output must be writable, got a read-only {type(x).__name__}")
    try:
        have = np.dtype(iface["typestr"])
        have_shape = tuple(int(n) for n in iface["shape"])
        ptr = int(iface["data"][0])
    except Exception as exc:
        raise HexcoreInvalidArgumentError(f"{name}: cannot use {type(x).__name__} as a CUDA array ({exc})") from None
    _check_layout(name, have, have_shape, iface.get("strides"), ptr, dtype, shape, align)
    return x


def check_dtype_shape(name, have_dtype, have_shape, dtype, shape) -> None:
    """Raise HexcoreInvalidArgumentError naming ``name`` unless ``have_dtype`` is ``dtype`` and
    ``have_shape`` matches ``shape`` (None: any size on that axis)."""
    try:
        have = np.dtype(have_dtype)
    except TypeError:
        raise HexcoreInvalidArgumentError(f"{name}: expected dtype {np.dtype(dtype)}, got {have_dtype!r}") from None
    if have != np.dtype(dtype):
        raise HexcoreInvalidArgumentError(f"{name}: expected dtype {np.dtype(dtype)}, got {have}")
    have_shape = tuple(have_shape)
    if len(have_shape) != len(shape) or any(e is not None and e != a for e, a in zip(shape, have_shape)):
        want = tuple("*" if e is None else e for e in shape)
        raise HexcoreInvalidArgumentError(f"{name}: expected shape {want}, got {have_shape}")


def checked_ids(x, name: str, count: int | None, upper: int, lower: int = 0):
    """A device int32 1-D array of ids; host arrays are range-checked before the copy.

    Device arrays are checked for dtype and shape only (reading them back would
    synchronise); the write and copy kernels skip ids outside ``[lower, upper)``, so
    nothing is written out of bounds (the decode kernel: see the module docstring).
    """
    if isinstance(x, np.ndarray):
        check_id_range(x, name, count, upper, lower)
    return checked(x, name, np.int32, (count,), align=4, output=False)


def check_id_range(x: np.ndarray, name: str, count: int | None, upper: int, lower: int = 0) -> None:
    """Raise unless host ``x`` is int32 ``[count]`` (None: any length) with values in
    ``[lower, upper)``, naming the first bad entry."""
    if x.dtype != np.int32:
        raise HexcoreInvalidArgumentError(f"{name}: expected dtype int32, got {x.dtype}")
    if x.ndim != 1 or (count is not None and x.shape[0] != count):
        raise HexcoreInvalidArgumentError(f"{name}: expected shape ({'*' if count is None else count},), got {x.shape}")
    bad = np.flatnonzero((x < lower) | (x >= upper))
    if bad.size:
        raise HexcoreInvalidArgumentError(f"{name}[{bad[0]}] = {x[bad[0]]} is outside [{lower}, {upper})")


def check_distinct(x, name: str) -> None:
    """Raise when the host id array ``x`` repeats an id (a launch that writes each id
    once would race on it). Device arrays are not read back, so not checked."""
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.size > 1:
        ids, counts = np.unique(x, return_counts=True)
        if (counts > 1).any():
            raise HexcoreInvalidArgumentError(
                f"{name}: expected distinct ids, got {_ids(ids[counts > 1])} more than once")


def check_disjoint(src, dst, src_name: str, dst_name: str) -> None:
    """Raise when an id is both read (``src``) and written (``dst``) by one launch: the
    order of a GPU's reads and writes is not defined, so the copy would race. Host
    arrays only (device arrays are not read back)."""
    if isinstance(src, np.ndarray) and isinstance(dst, np.ndarray) and src.ndim == 1 and dst.ndim == 1:
        both = np.intersect1d(src, dst)
        if both.size:
            raise HexcoreInvalidArgumentError(
                f"{dst_name}: ids {_ids(both)} are also in {src_name}: one launch would read and write them "
                f"(a race); copy in two launches")


def check_distinct_pairs(a, b, name: str) -> None:
    """Raise when host arrays ``a`` and ``b`` hold the same (a[i], b[i]) pair twice:
    one launch would write one place twice (a race)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == b.ndim == 1 \
            and a.shape == b.shape and a.size > 1:
        pairs = a.astype(np.int64) << 32 | (b.astype(np.int64) & 0xFFFFFFFF)
        values, index, counts = np.unique(pairs, return_index=True, return_counts=True)
        if (counts > 1).any():
            first = int(index[np.argmax(counts > 1)])
            raise HexcoreInvalidArgumentError(
                f"{name}: entry {first} ({a[first]}, {b[first]}) appears more than once: one launch would write "
                f"the same place twice")


def check_outside_store(store, **arrays) -> None:
    """Raise when a device array lives inside ``store``'s memory while the launch writes
    one of the two: an input read by a launch that writes the store (for instance ``k``
    given as a view of the tails), or an output written by a launch that reads it
    (decode's ``out``), is a race. Checked from addresses, nothing is read back."""
    for name, x in arrays.items():
        if isinstance(x, np.ndarray) or x is None:
            continue  # a host array is copied to a fresh buffer
        if shares_memory(x, store.pool):
            raise HexcoreInvalidArgumentError(
                f"{name}: lies inside the store's memory, which this launch also uses (a race); pass a "
                f"separate array")


def check_separate(outputs: dict, inputs: dict | None = None) -> None:
    """Raise when a device array a launch writes (``outputs``: name -> array) shares memory
    with another of them or with one it reads (``inputs``): one launch would write one
    place twice, or read what it writes (a race). The message names the output first (of two
    outputs, the later one). None, host and empty arrays are skipped
    (a host array is copied to a fresh buffer). Checked from addresses, nothing is read back."""
    written = [(n, x) for n, x in outputs.items() if _on_device(x)]
    others = written + [(n, x) for n, x in (inputs or {}).items() if _on_device(x)]
    for i, (name, x) in enumerate(written):
        for other, y in others[i + 1:]:
            if shares_memory(x, y):  # named first: the later of two outputs, or the output over an input
                bad, good = (other, name) if other in outputs else (name, other)
                raise HexcoreInvalidArgumentError(f"{bad}: shares memory with {good}; pass separate arrays")


def check_writes(store, outputs: dict, inputs: dict | None = None) -> None:
    """What one launch writes (``outputs``: name -> device array) outside ``store``'s memory
    (:func:`check_outside_store`) and apart from each other and from what it reads
    (``inputs``; :func:`check_separate`), in that order."""
    check_outside_store(store, **outputs)
    check_separate(outputs, inputs)


def _on_device(x) -> bool:
    return x is not None and not isinstance(x, np.ndarray) and _nbytes(x) > 0


def shares_memory(x, y) -> bool:
    """Whether the device arrays ``x`` and ``y`` overlap: from the numpy arrays the
    simulator's device arrays wrap, else from their addresses and sizes (False where
    either has no address). Nothing is read back."""
    a, b = getattr(x, "_ary", None), getattr(y, "_ary", None)
    if a is not None and b is not None:
        return bool(np.may_share_memory(a, b))
    start, other = device_pointer(x), device_pointer(y)
    if start is None or other is None:
        return False
    return start < other + max(_nbytes(y), 1) and other < start + max(_nbytes(x), 1)


def _nbytes(x) -> int:
    return int(getattr(x, "nbytes", 0) or 0)


def _ids(values) -> str:
    shown = ", ".join(str(int(v)) for v in values[:8])
    return f"[{shown}{', ...' if len(values) > 8 else ''}]"


def _c_contiguous(shape, strides, itemsize: int) -> bool:
    """C order, ignoring the strides of axes of extent 1 (numpy gives those any value)."""
    expected = itemsize
    for extent, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True
