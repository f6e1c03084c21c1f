"""benchmarks.bench_hf_decode's paged row: transformers' continuous batching timed per decode
step (CPU, a tiny random Llama; skipped without transformers)."""

import math

import pytest


def test_paged_seconds_times_decode_steps_of_every_row():
    pytest.importorskip("transformers")
    from benchmarks.bench_hf_decode import build_model, llama_config, paged_seconds

    model = build_model(llama_config(None, tiny=True, max_positions=256), "cpu")
    seconds = paged_seconds(model, batch=2, context=32, steps=3)
    assert math.isfinite(seconds) and 0 < seconds < 5
    assert model.config._attn_implementation == "hexcore"  # the model's attention is given back
