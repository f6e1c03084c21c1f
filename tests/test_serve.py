"""The serving run: continuous batching over the Engine, checked against exact attention."""

import numpy as np
import pytest

from hexcore import HexcoreError, KVCacheConfig
from hexcore.demo import _Progress, demo_shape, format_summary, summarize, write_json
from hexcore.serve import Server
from hexcore.serve_workload import Workload, exact_attention, synthetic_workload


def tiny(dtype="fp16"):
    return KVCacheConfig(num_layers=1, num_kv_heads=1, head_dim=64, block_size=16, kv_dtype=dtype, group_size=32)


def test_synthetic_workload_is_seeded_and_bounded(seed):
    a = synthetic_workload(200, np.random.default_rng(seed), 20, 30, 5, 8, 1.5)
    b = synthetic_workload(200, np.random.default_rng(seed), 20, 30, 5, 8, 1.5)
    assert all(np.array_equal(x, y) for x, y in zip((a.arrivals, a.prompt_lens, a.output_lens),
                                                     (b.arrivals, b.prompt_lens, b.output_lens)))
    assert a.arrivals[0] == 0 and (np.diff(a.arrivals) >= 0).all() and a.arrivals[-1] > 50
    assert 1 <= a.prompt_lens.min() and a.prompt_lens.max() <= 30 and a.output_lens.max() <= 8
    assert 15 < a.prompt_lens.mean() < 25  # log-normal around its mean


def test_exact_attention_matches_a_direct_softmax(rng):
    q = rng.standard_normal((4, 8))
    keys, values = rng.standard_normal((5, 2, 8)), rng.standard_normal((5, 2, 8))
    got = exact_attention(q, keys, values, 0.5)
    s = np.einsum("hd,nhd->hn", q, np.repeat(keys, 2, axis=1)) * 0.5
    p = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    assert np.allclose(got, np.einsum("hn,nhd->hd", p, np.repeat(values, 2, axis=1)))


def test_serving_preempts_recomputes_and_matches_exact_attention():
    """Three requests in a 2-block pool: the third is preempted when the pool runs dry,
    recomputed later, and every output matches float64 attention over exact FP16 K/V."""
    work = Workload(np.array([0, 0, 0]), np.array([15, 15, 14]), np.array([2, 2, 2]))
    server = Server(tiny(), 2, num_blocks=2, max_seqs=3, workload=work, check_every=1, check_seqs=3,
                    batch_buckets=(1, 2, 4))
    report = server.run()
    assert report.requests_finished == 3 and report.preemptions == 1 and report.recomputed_tokens == 1
    assert report.decode_tokens == 6 and report.steps == 3 and report.peak_active_blocks == 2
    assert report.seals == 3 and report.seal_hits == 3  # every seal was predicted and reserved
    assert report.checked_outputs == 6 and report.max_error <= 2e-3, report.errors
    assert report.mirror_mismatches == 0 and report.events_applied > 0
    server.check_invariants()
    assert server.cache.num_sequences == 0 and server.cache.num_free_blocks == 2
    summary = summarize(demo_shape(True, kv_dtype="fp16"), report, {"available": False, "note": "test"})
    text = format_summary(summary)
    assert "3 of 3 (1 preemptions" in text and "100.0% of 3 seals" in text and "n/a (test)" in text


def test_the_fault_drill_detects_migrates_and_recomputes_a_corrupted_block():
    """One bit flipped in a sealed block at step 0: verification (every block, every step)
    finds it, the sequence moves to a fresh block, the lost block is recomputed from the
    exact K/V (the store is NaN-poisoned, so a block left unwritten shows), and every output
    matches float64 attention; the corrupted block is quarantined, never handed out again."""
    work = Workload(np.array([0, 0]), np.array([20, 20]), np.array([4, 4]))  # one sealed block each
    server = Server(tiny(), 2, num_blocks=4, max_seqs=2, workload=work, check_every=1, check_seqs=2,
                    batch_buckets=(1, 2), fault_tolerance=True, sample_every=1, inject_at=0)
    server.engine.store.poison()
    report = server.run()
    assert (report.corruptions_injected, report.corruptions_detected, report.sequences_migrated) == (1, 1, 1)
    assert report.requests_finished == 2 and report.checked_outputs == 8
    assert (np.array(report.errors) <= 2e-3).all(), report.errors  # NaN fails too
    assert report.mirror_mismatches == 0 and report.blocks_verified > 0
    assert server.faults.ft.stats()["blocks_quarantined"] == 1 and server.cache.num_free_blocks == 3
    server.check_invariants()


def test_a_request_larger_than_the_pool_is_refused():
    work = Workload(np.array([0]), np.array([40]), np.array([10]))
    with pytest.raises(HexcoreError, match="num_blocks"):
        Server(tiny(), 2, num_blocks=3, max_seqs=2, workload=work)


def test_summary_json_writes_nan_as_null(tmp_path):
    path = tmp_path / "s.json"
    write_json({"a": float("nan"), "b": 1.5}, str(path))
    assert path.read_text().replace(" ", "").replace("\n", "") == '{"a":null,"b":1.5}'


@pytest.mark.parametrize("fmt,prompts,outputs", [("int4-aged", [60, 33, 20], [6, 3, 2]),
                                                  ("int2-aged", [46, 33, 20], [3, 3, 2])])
def test_serving_from_a_format_by_age(fmt, prompts, outputs):
    """Requests of 20-66 tokens over a format by age (block 16): the sink stays FP16, later
    blocks are sealed (int2-aged: INT4 at once; int4-aged: FP16, and re-sealed INT4 at 32
    tokens of age, which the first request's block 1 reaches in a step, at 64 tokens); every
    output is checked against float64 attention over the exact FP16 K/V, at the format's
    error."""
    work = Workload(np.array([0, 0, 1]), np.array(prompts), np.array(outputs))
    server = Server(tiny(), 2, num_blocks=12, max_seqs=4, workload=work, check_every=1, check_seqs=4, format=fmt)
    assert server.engine.format.name == fmt and server.mirror is None
    report = server.run()
    assert report.requests_finished == 3 and report.preemptions == 0 and report.steps == max(outputs)
    assert report.seals > 0 and report.checked_outputs == report.decode_tokens
    if fmt == "int4-aged":
        assert report.reseals > 0  # blocks that reached 32 tokens of age became INT4
    assert 1e-4 < report.max_error <= 0.3, report.errors  # quantized blocks were read; NaN fails
    # int2-aged seals INT4 at once; int4-aged's blocks are FP16 at its peak (young ones)
    assert report.peak_kv_bytes < report.peak_kv_bytes_fp16 if fmt == "int2-aged" else \
        report.peak_kv_bytes == report.peak_kv_bytes_fp16
    server.check_invariants()
    assert server.cache.num_sequences == 0
    assert all(pool.num_free_blocks == pool.num_blocks for pool in server.cache.pools)
    text = format_summary(summarize(demo_shape(True, format=fmt), report, {"available": False, "note": "test"}))
    assert f"({fmt})" in text and "re-seals as blocks aged" in text and "n/a (a format by age)" in text


class _Bar:
    """A tqdm stand-in that keeps what the demo's progress shows."""

    def __init__(self):
        self.tokens, self.blocks = 0, []

    def update(self, n):
        self.tokens += n

    def set_postfix(self, blocks, **_):
        self.blocks.append(blocks)


@pytest.mark.parametrize("fmt", [None, "int2-aged"])
def test_the_demo_progress_shows_tokens_and_blocks_in_use(fmt):
    """The progress bar's per-step postfix (blocks in use) works for a plain cache and for a
    format by age, whose blocks are spread over several pools (the bar once raised there:
    a tiered cache has no single ``num_active_blocks``)."""
    work = Workload(np.array([0, 0]), np.array([40, 20]), np.array([3, 2]))
    progress = _Progress(5, enabled=False)
    progress.bar = bar = _Bar()
    server = Server(tiny(), 2, num_blocks=12, max_seqs=4, workload=work, on_step=progress, format=fmt)
    assert server.active_blocks == 0
    report = server.run()
    assert bar.tokens == report.decode_tokens == 5
    assert len(bar.blocks) == report.steps and bar.blocks[0] >= 3  # the 40-token request's blocks
    assert bar.blocks[-1] == 0  # every request retired after the last step
    assert server.active_blocks == 0


def test_a_format_by_age_refuses_the_fault_drill():
    from hexcore import HexcoreConfigError

    work = Workload(np.array([0]), np.array([20]), np.array([2]))
    with pytest.raises(HexcoreConfigError, match="fault_tolerance: not with a format by age"):
        Server(tiny(), 2, num_blocks=4, max_seqs=2, workload=work, fault_tolerance=True, format="int4-aged")
