"""benchmarks.profile_prefix on a tiny random Llama (CPU, the CUDA simulator; skipped
without transformers): the hit finds its prefix cached and both cases are reported."""

import pytest


def test_profile_prefix_reports_a_hit_and_a_miss(capsys):
    pytest.importorskip("transformers")
    from benchmarks import profile_prefix

    results = profile_prefix.main(["--tiny", "--device", "cpu", "--prompt-tokens", "40", "--new-tokens", "2",
                                   "--top", "5"])
    out = capsys.readouterr().out
    assert set(results) == {"hit", "miss"}
    assert "32 cached" in out  # one whole block of turn 1 found again
    assert "== hit: wall" in out and "== miss: wall" in out and "prefill_attention_batch" in out
