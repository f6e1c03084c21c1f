"""DeviceKVStore: the sealed pools, their metadata and the FP16 tails, in device memory."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ..config import KVCacheConfig, KVDtype
from ..errors import HexcoreConfigError, HexcoreInvalidArgumentError
from ..host.checksum import canary_word
from .arrays import as_device_array
from .device import SIMULATOR
from .views import memo

FP16_NAN_BITS = 0x7E00
CODE_POISON = 0xFF
GUARD_WORDS = 64  # words of each guard region: 256 bytes, a whole 16-lane run of 16-byte stores


class DeviceKVStore:
    """Device arrays of a KV cache, shaped by ``KVCacheConfig`` (layout.py lists them).

    Attributes (numba device arrays; layer is the leading axis of each):

    - ``k_codes``, ``v_codes``: sealed blocks; float16
      ``[L, num_blocks, H, block_size, head_dim]`` for FP16, uint8
      ``[L, num_blocks, H, block_size, row_bytes]`` codes for INT4/INT2.
    - ``k_meta``: float16 ``[L, num_blocks, H, 2, head_dim]`` per-channel scale, min;
      ``v_meta``: float16 ``[L, num_blocks, H, block_size, 2, num_groups]`` per-token
      group scales, mins. ``None`` for FP16.
    - ``k_tails``, ``v_tails``: float16 ``[L, max_seqs, H, block_size, head_dim]``.

    The arrays hold exactly ``config.total_bytes(num_blocks, max_seqs)`` bytes (``nbytes``).
    ``pool``, the one allocation they view, also holds a guard region of ``GUARD_WORDS``
    uint32 words after each array (``guard_offsets``: their word offsets in ``pool``, in
    array order), filled with ``canary_word(region, i)``: a write that runs off the end of
    an array (or, for every array but the first, off its start) clobbers a guard, which
    ``hexcore.cuda.integrity`` checks. The arrays' own addressing is unchanged by them.
    """

    def __init__(self, config: KVCacheConfig, num_blocks: int, max_seqs: int):
        if not isinstance(config, KVCacheConfig):
            raise HexcoreInvalidArgumentError(f"config: expected KVCacheConfig, got {type(config).__name__}")
        total = config.total_bytes(num_blocks, max_seqs)  # validates both counts
        self.config = config
        self.num_blocks = num_blocks
        self.max_seqs = max_seqs
        code_dtype = np.uint8 if config.kv_dtype.is_quantized else np.float16
        layout = [("k_codes", config.code_shape(num_blocks), code_dtype),
                  ("v_codes", config.code_shape(num_blocks), code_dtype)]
        if config.kv_dtype.is_quantized:
            layout += [("k_meta", config.key_meta_shape(num_blocks), np.float16),
                       ("v_meta", config.value_meta_shape(num_blocks), np.float16)]
        layout += [("k_tails", config.tail_shape(max_seqs), np.float16),
                   ("v_tails", config.tail_shape(max_seqs), np.float16)]
        # One allocation, so a kernel takes the whole cache as one argument plus word
        # offsets; every array's size is a multiple of 16 bytes, so each view stays aligned.
        # [array][guard][array][guard]...: a guard region follows each array
        self.pool = cuda.device_array(total // 4 + len(layout) * GUARD_WORDS, np.uint32)
        self.word_offsets: dict[str, int] = {}
        guards = []
        self.k_meta = self.v_meta = None
        start = 0
        for name, shape, dtype in layout:
            words = int(np.prod(shape)) * np.dtype(dtype).itemsize // 4
            self.word_offsets[name] = start
            setattr(self, name, self.pool[start:start + words].view(dtype).reshape(shape))
            guards.append(start + words)
            start += words + GUARD_WORDS
        assert start * 4 == total + 4 * GUARD_WORDS * len(layout) and total == self.nbytes, (start, total)
        self.guard_offsets: tuple[int, ...] = tuple(guards)
        self.guard_names: tuple[str, ...] = tuple(name for name, _, _ in layout)  # the array each guard follows
        self.fill_guards()
        # device constants launchers make on first use and reuse (never inside a capture)
        self.constants: dict = {}

    def fill_guards(self) -> None:
        """Write every guard region's canary pattern (done at construction; a test that
        fills the whole ``pool`` calls it again)."""
        for region, start in enumerate(self.guard_offsets):
            self.pool[start:start + GUARD_WORDS].copy_to_device(guard_pattern(region))

    @property
    def arrays(self) -> dict:
        """Name -> device array, for every array the store owns."""
        names = ("k_codes", "v_codes", "k_meta", "v_meta", "k_tails", "v_tails")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @property
    def nbytes(self) -> int:
        """Device bytes held by the store (its arrays; they tile ``pool`` exactly)."""
        return sum(int(a.nbytes) for a in self.arrays.values())

    @functools.cached_property
    def words(self) -> dict:
        """Name -> flat uint32 view of each array: what the kernels index (made once)."""
        return {name: flat_words(array) for name, array in self.arrays.items()}

    @functools.cached_property
    def flat(self) -> dict:
        """Name -> flat view of each array in its own dtype (made once)."""
        return {name: array.reshape(array.size) for name, array in self.arrays.items()}

    def poison(self) -> None:
        """Fill every slot with NaN (float16) or 0xFF (codes), so a read of unwritten data shows."""
        for array in self.arrays.values():
            pattern = CODE_POISON * 0x01010101 if array.dtype == np.uint8 else FP16_NAN_BITS * 0x10001
            words = flat_words(array)
            if SIMULATOR:  # one simulated thread per word would take seconds: copy the pattern
                words.copy_to_device(np.full(words.shape[0], pattern, np.uint32))
            else:
                _fill_words(words, pattern)

    def as_torch(self) -> dict:
        """Name -> zero-copy torch tensor of each array (needs torch with CUDA)."""
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise HexcoreConfigError("as_torch: torch is not installed") from exc
        return {name: torch.as_tensor(array, device="cuda") for name, array in self.arrays.items()}

    def __repr__(self) -> str:
        c = self.config
        return (f"DeviceKVStore({c.kv_dtype.value}, layers={c.num_layers}, kv_heads={c.num_kv_heads}, "
                f"head_dim={c.head_dim}, block_size={c.block_size}, num_blocks={self.num_blocks}, "
                f"max_seqs={self.max_seqs}, {self.nbytes / (1 << 20):.1f} MiB)")


def guard_pattern(region: int) -> np.ndarray:
    """The uint32 ``[GUARD_WORDS]`` canary words of guard region ``region``."""
    return np.array([canary_word(region, i) for i in range(GUARD_WORDS)], np.uint32)


def flat_words(array):
    """A contiguous device array viewed as a flat uint32 array (no copy).

    Axes of extent 1 may carry any stride (numpy gives ``x[None]`` a stride of 0, and
    ``cuda.to_device`` keeps it), which numba's ``reshape`` on a real GPU refuses as
    "requires copying": such an array gets a flat view of the same memory instead. Kept on a
    numba array (``views.memo``): a step's launches ask for the same arrays' words every step."""
    return memo(as_device_array(array), ("flat_words",), _flat_words)


def _flat_words(array):
    try:
        flat = array.reshape(array.size)
    except NotImplementedError:
        flat = type(array)(shape=(array.size,), strides=(np.dtype(array.dtype).itemsize,), dtype=array.dtype,
                           gpu_data=array.gpu_data)
    return flat.view(np.uint32)


@cuda.jit
def _fill_words_kernel(words, pattern):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < words.shape[0]:
        words[i] = pattern
        i += stride


def _fill_words(words, pattern: int) -> None:
    _fill_words_kernel[min(1024, (words.shape[0] + 255) // 256), 256](words, np.uint32(pattern))


__all__ = ["GUARD_WORDS", "DeviceKVStore", "KVDtype", "flat_words", "guard_pattern"]
