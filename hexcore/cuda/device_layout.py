"""The layout functions of ``hexcore/layout.py`` compiled as CUDA device functions, once.

Kernels import the offsets from here, so the host and every kernel compute a byte
offset with the very same function (``layout_check.py`` tests that they agree).
"""

from __future__ import annotations

from numba import cuda

from .. import layout

code_offset = cuda.jit(device=True)(layout.code_offset)
key_meta_offset = cuda.jit(device=True)(layout.key_meta_offset)
value_meta_offset = cuda.jit(device=True)(layout.value_meta_offset)
tail_offset = cuda.jit(device=True)(layout.tail_offset)
