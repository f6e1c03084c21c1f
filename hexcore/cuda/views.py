"""Device views made once per array: a step that asks for the same view step after step gets
the same object.

numba-cuda makes every slice, reshape and dtype view of a device array as a new
``DeviceNDArray`` in Python: its dummy-array layout, a ``MemoryPointer`` view and, for a
slice, a check of the current context (``cudadrv/devicearray.py``). A launch then types and
marshals the new object from scratch, since numba caches an array's numba type and argument
shim per object (``_numba_type_``, ``_strided_memory_view_shim``). On the H200 an INT2-aged
step made about 70 such objects and set about 23 launch arguments (64 us per ``set_array``
under cProfile, 2026-12-02). The eager step makes the same views every step (a layer of the
step's buffers, an array at the same offset of an upload buffer, the same scratch), so they
are kept here:

    memo(array, key, make)         # make(array), once per (array, key)
    sliced(array, start, stop)     # array[start:stop]
    layer_of(array, i)             # array[i]
    flat(array)                    # array.reshape(array.size)

A view is kept on its array object (an attribute: numba caches its own per-object
properties the same way), so it lives as long as the array does and never outlives it. An
array's memory, shape and dtype never change, so a kept view never goes stale; a buffer
that is reallocated is a new object with no views yet. Up to :data:`MAX_VIEWS` per array,
then they are made afresh (a serving loop's shapes drift: table widths grow).
"""

from __future__ import annotations

from .._checks import as_int
from ..errors import HexcoreInvalidArgumentError

ATTR = "_hexcore_views"  # the attribute of a device array holding its views: {key: view}
MAX_VIEWS = 256  # views kept per array; past it the array's views are dropped and made anew
KEEP = True  # False: every view made afresh, as before this module (``benchmarks.host_step --fresh-views``)


def memo(array, key, make):
    """``make(array)``, made once per (``array``, ``key``) and kept on ``array``; made each
    time for an object that cannot hold attributes (no ``__dict__``), or when not :data:`KEEP`."""
    if not KEEP:
        return make(array)
    try:
        views = vars(array).get(ATTR)
    except TypeError:
        return make(array)
    if views is None:
        views = {}
        setattr(array, ATTR, views)
    else:
        view = views.get(key)
        if view is not None:
            return view
    if len(views) >= MAX_VIEWS:
        views.clear()
    view = views[key] = make(array)
    return view


def sliced(array, start: int, stop: int | None = None):
    """``array[start:stop]`` (along the first axis), kept. ``start``, ``stop``: ints (or
    ``stop`` None); anything else, or an ``array`` that cannot be sliced, raises
    HexcoreInvalidArgumentError."""
    if type(start) is not int or not (stop is None or type(stop) is int):  # (ints: no check on the hot path)
        start, stop = as_int("start", start), None if stop is None else as_int("stop", stop)
    try:
        return memo(array, ("slice", start, stop), lambda a: a[start:stop])
    except (TypeError, IndexError, AttributeError, ValueError):
        raise HexcoreInvalidArgumentError(f"array: cannot take [{start}:{stop}] of {_described(array)}") from None


def layer_of(array, index: int):
    """``array[index]``: the sub-array at ``index`` of the first axis, kept. ``index``: an
    int within that axis (HexcoreInvalidArgumentError otherwise)."""
    if type(index) is not int:
        index = as_int("index", index)
    try:
        return memo(array, ("index", index), lambda a: a[index])
    except IndexError:
        raise HexcoreInvalidArgumentError(f"index: {index} is outside the first axis of {_described(array)}") from None
    except (TypeError, AttributeError, ValueError):
        raise HexcoreInvalidArgumentError(f"array: cannot take [{index}] of {_described(array)}") from None


def flat(array):
    """``array.reshape(array.size)`` (a C-contiguous array), kept; HexcoreInvalidArgumentError
    for anything else."""
    try:
        return memo(array, ("flat",), lambda a: a.reshape(a.size))
    except (TypeError, AttributeError, ValueError, NotImplementedError):
        raise HexcoreInvalidArgumentError(f"array: expected a C-contiguous device array, got "
                                          f"{_described(array)}") from None


def _described(array) -> str:
    shape = getattr(array, "shape", None)
    return type(array).__name__ + ("" if shape is None else f" of shape {tuple(shape)}")
