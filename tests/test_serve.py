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


def _bad_server_args():
    from hexcore.errors import HexcoreInvalidArgumentError as Invalid

    for name in ("num_blocks", "max_prefill_tokens", "check_every", "sample_every"):
        for value in (None, 0, -1, 1.5, "3", True, 10**30, [1]):
            yield name, value, Invalid, name
    for name in ("seed", "check_seqs", "inject_at"):
        for value in (-1, 1.5, "3", np.bool_(True), float("nan"), object()):
            yield name, value, Invalid, name
    for name, value in (("cfg", None), ("cfg", "int4"), ("workload", None), ("workload", [0, 20, 2]),
                        ("on_step", 5), ("fault_tolerance", "yes"), ("fault_tolerance", None)):
        yield name, value, Invalid, name


@pytest.mark.parametrize("name,value,error,match", list(_bad_server_args()))
def test_bad_server_arguments_are_typed_before_anything_is_made(name, value, error, match):
    """Every Server argument, checked up front (they once raised TypeError, ValueError or
    ZeroDivisionError, some only in ``run``: ``check_every=0``), naming the argument."""
    work = Workload(np.array([0]), np.array([20]), np.array([2]))
    args = dict(cfg=tiny(), num_q_heads=2, num_blocks=4, max_seqs=2, workload=work, format="int4-aged")
    with pytest.raises(error, match=match):
        Server(**dict(args, **{name: value})).run(max_steps=2)


@pytest.mark.parametrize("max_steps", [-1, 1.5, "2", float("nan"), [1], True])
def test_server_run_checks_max_steps(max_steps):
    from hexcore.errors import HexcoreInvalidArgumentError

    work = Workload(np.array([0]), np.array([20]), np.array([2]))
    server = Server(tiny(), 2, num_blocks=4, max_seqs=2, workload=work, format="int4-aged")
    with pytest.raises(HexcoreInvalidArgumentError, match="max_steps"):
        server.run(max_steps)
    assert server.run(np.int64(5)).requests_finished == 1  # nothing was changed by the refused call


@pytest.mark.parametrize("fields,match", [
    (([0], [0], [2]), r"prompt_lens\[0\] = 0 is outside \[1, "),
    (([0], [20], [-1]), r"output_lens\[0\] = -1 is outside"),
    (([-1], [20], [2]), r"arrivals\[0\] = -1 is outside"),
    (([0, 1], [20], [2]), "prompt_lens: expected 2 entries"),
    (([3, 0], [20, 20], [2, 2]), r"arrivals: expected non-decreasing steps, arrivals\[1\] = 0 < arrivals\[0\] = 3"),
    (([0], [20.5], [2]), "prompt_lens: expected a 1-D integer array, got float64"),
    (([0], [np.nan], [2]), "prompt_lens: expected a 1-D integer array"),
    ((None, [20], [2]), "arrivals: expected a 1-D integer array, got NoneType"),
    (([[0]], [20], [2]), "arrivals: expected a 1-D integer array"),
    (([0], [True], [2]), "prompt_lens: expected a 1-D integer array, got bool"),
    (([0], [2**62], [2**62]), r"prompt_lens\[0\] = 4611686018427387904 is outside"),  # (their sum once wrapped)
])
def test_a_workload_is_checked_when_made(fields, match):
    from hexcore.errors import HexcoreInvalidArgumentError

    with pytest.raises(HexcoreInvalidArgumentError, match=match):
        Workload(*fields)
    work = Workload([0, 0], (20, 5), np.array([2, 2], np.uint8))  # lists, tuples, any integer dtype: int64
    assert all(a.dtype == np.int64 for a in (work.arrivals, work.prompt_lens, work.output_lens))


@pytest.mark.parametrize("at,value", [(0, 0), (0, 10**30), (0, 2.5), (1, None), (1, 7), (2, 0), (2, float("nan")),
                                      (2, -1.0), (3, 0), (3, 1.5), (4, float("inf")), (5, None), (6, 0.0),
                                      (6, True), (6, 10**400)])
def test_synthetic_workload_arguments_are_typed(at, value):
    """(once: ZeroDivisionError for 0 arrivals a step, numpy's ValueError for a negative
    mean or count, AttributeError for a non-Generator, IndexError for 0 requests)"""
    from hexcore.errors import HexcoreInvalidArgumentError

    names = ("num_requests", "rng", "prompt_mean", "prompt_max", "output_mean", "output_max", "arrivals_per_step")
    args = [4, np.random.default_rng(0), 20, 30, 5, 8, 1.0]
    args[at] = value
    with pytest.raises(HexcoreInvalidArgumentError, match=names[at]):
        synthetic_workload(*args)


def test_token_table_arguments_are_typed():
    from hexcore.errors import HexcoreInvalidArgumentError
    from hexcore.serve_workload import TokenTable

    for args, match in (((None, 0), "cfg"), ((tiny(), -1), "seed"), ((tiny(), "1"), "seed")):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            TokenTable(*args)
    table = TokenTable(tiny(), 0)
    for args, match in (((-1, 0, 4), "req_id"), ((0, 5, 4), "start"), ((0, 0, None), "stop"), ((1.5, 0, 4), "req_id")):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            table.span(*args)
    assert table.span(np.int64(0), 0, 4)[0].shape == (1, 4, 1, 64)


def test_exact_attention_arguments_are_typed():
    """(once AttributeError, IndexError or numpy's errors; an empty key set a ValueError)"""
    from hexcore.errors import HexcoreInvalidArgumentError

    q, kv = np.zeros((2, 8)), np.zeros((3, 1, 8))
    for args, match in (((None, kv, kv, 1.0), "q: expected a real 2-D array, got NoneType"),
                        ((np.zeros(8), kv, kv, 1.0), "q: expected a real 2-D array"),
                        ((q, np.zeros((0, 1, 8)), np.zeros((0, 1, 8)), 1.0), "n >= 1"),
                        ((np.zeros((3, 8)), np.zeros((3, 2, 8)), np.zeros((3, 2, 8)), 1.0), "Hq a multiple of H"),
                        ((q, kv, np.zeros((4, 1, 8)), 1.0), "q, keys, values"),
                        ((q, kv, kv, "1"), "scale: expected a positive finite number"),
                        ((q, kv, kv, float("nan")), "scale"), ((q, kv, kv, np.zeros(2)), "scale")):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            exact_attention(*args)


def test_fault_drill_arguments_are_typed():
    """(``inject_at="3"`` once passed and raised TypeError at the first step; a server that
    is not a Server raised AttributeError)"""
    from hexcore.errors import HexcoreInvalidArgumentError
    from hexcore.serve_faults import FaultDrill

    work = Workload(np.array([0]), np.array([20]), np.array([2]))
    server = Server(tiny(), 2, num_blocks=4, max_seqs=2, workload=work)
    for args, match in (((None, 2, 3), "server: expected a Server"), ((server, 0, 3), "sample_every"),
                        ((server, 2, "3"), "inject_at"), ((server, 2, -1), "inject_at"), ((server, None, 3),
                                                                                          "sample_every")):
        with pytest.raises(HexcoreInvalidArgumentError, match=match):
            FaultDrill(*args)
    tiered = Server(tiny(), 2, num_blocks=4, max_seqs=2, workload=work, format="int4-aged")
    with pytest.raises(HexcoreInvalidArgumentError, match="server: expected a Server without a format by age"):
        FaultDrill(tiered, 2, 3)
