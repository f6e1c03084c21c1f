"""benchmarks.gpu_common: save (rows as JSON and a printed table), flag_value (the benchmarks' options)."""

import json

import pytest

from benchmarks.gpu_common import flag_value, save


def test_save_prints_rows_whose_keys_differ(tmp_path, monkeypatch, capsys):
    """A row without a later row's key (a tiered decode row has no register count) prints
    an empty cell instead of stopping the run before its table."""
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = [dict(kernel="hexcore int4", ms=0.5, regs=128), dict(kernel="hexcore int4-aged", ms=0.25)]
    save("rows", rows)
    assert json.loads((tmp_path / "rows.json").read_text())["rows"] == rows
    lines = [line.rstrip() for line in capsys.readouterr().out.strip().splitlines()]
    assert lines == ["kernel | ms | regs", "hexcore int4 | 0.5 | 128", "hexcore int4-aged | 0.25 |"]


def test_fill_store_writes_finite_values_in_range():
    """Every FP16 array of a filled store holds finite values in its range (codes are bytes)."""
    import numpy as np

    from benchmarks.gpu_common import fill_store
    from hexcore import KVCacheConfig
    from hexcore.cuda import DeviceKVStore

    cfg = KVCacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, kv_dtype="int4")
    store = DeviceKVStore(cfg, num_blocks=3, max_seqs=2)
    fill_store(store)
    for name, array in store.arrays.items():
        if array.dtype == np.float16:
            values = array.copy_to_host().astype(np.float32)
            lo, hi = (0.01, 0.1) if name.endswith("meta") else (-1.0, 1.0)
            assert np.isfinite(values).all() and values.min() >= lo and values.max() <= hi, name
            assert np.unique(values).size > values.size // 4, name  # random, not a constant


def test_a_broken_fill_is_refused():
    """check_filled names the array and the first bad value: a benchmark never times NaN data
    (the H200 once wrote non-finite halves where the simulator wrote the intended ones)."""
    import numpy as np
    import pytest
    from numba import cuda

    from benchmarks.gpu_common import check_filled

    good = np.linspace(-1, 0.99, 100).astype(np.float16)
    check_filled("k_tails", cuda.to_device(good), -1.0, 1.0)
    for bad_value in (np.nan, np.inf, 1.5):
        bad = good.copy()
        bad[-1] = bad_value
        with pytest.raises(RuntimeError, match="k_tails holds 1 of 100"):
            check_filled("k_tails", cuda.to_device(bad), -1.0, 1.0)


def _reference_hash(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _check_fill_hash():
    import numpy as np
    from numba import cuda

    from benchmarks.gpu_common import _fill_bytes

    words = cuda.device_array(1000, np.uint32)
    _fill_bytes[4, 256](words, 5)
    got = words.copy_to_host()
    assert [int(w) for w in got] == [_reference_hash((i * 2654435761 + 5) & 0xFFFFFFFF) for i in range(1000)]


def test_the_fill_hash_is_32_bit():
    """The device hash equals a 32-bit reference (on the simulator, numpy wraps at 32 bits)."""
    _check_fill_hash()


@pytest.mark.gpu
def test_the_fill_hash_is_32_bit_gpu():
    """The same on a GPU, where numba computes uint32 * uint32 in 64 bits: before the hash cut
    its products back, its high bits made the float fill write inf."""
    _check_fill_hash()


def test_time_gpu_with_a_queue_holds_the_stream_before_each_timed_run(monkeypatch):
    import time

    from numba import cuda

    from benchmarks import gpu_common

    calls, spins = [], []
    spin = gpu_common._spin

    class Counting:
        def __getitem__(self, config):
            def launch(ns):
                spins.append(int(ns))
                t0 = time.perf_counter()
                spin[config](ns)
                spins.append(time.perf_counter() - t0)
            return launch

    # (the simulator's events time nothing and it has no event_elapsed_time)
    monkeypatch.setattr(cuda, "event_elapsed_time", lambda start, stop: 1.0, raising=False)
    monkeypatch.setattr(gpu_common, "_spin", Counting())
    seconds = gpu_common.time_gpu(lambda: calls.append(1), warmup=2, repeats=3, inner=4, queue_ns=300_000)
    cuda.synchronize()
    assert len(calls) == 2 + 3 * 4 and seconds >= 0
    assert spins[0::2] == [300_000] * 3  # one spin before each timed run, none in the warm-up
    assert all(s >= 300e-6 for s in spins[1::2])  # each held its 0.3 ms (the simulator's clock is real time)


def test_flag_value_reads_the_word_after_its_flag():
    argv = ["--shapes", "quick", "--queued", "--dtypes"]
    assert flag_value(argv, "--shapes", "all") == "quick"
    assert flag_value(argv, "--name", "decode") == "decode"
    with pytest.raises(SystemExit, match="--dtypes needs a value"):
        flag_value(argv, "--dtypes", "fp16")
