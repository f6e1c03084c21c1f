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


def test_a_hit_checks_and_copies_once_per_turn_whatever_its_layers(capsys):
    # --stub on the simulator (launches stubbed): the host path only. A hit's query and K/V
    # buffers are made once per forward and handed to the Engine as device views, so its
    # checks and host-to-device copies per turn do not grow with the layers (before: 3 of
    # each per layer, the buffers copied to the device by every call), and a miss's are as few
    pytest.importorskip("transformers")
    from benchmarks import profile_prefix

    found = {}
    for layers in (2, 4):
        results = profile_prefix.main(["--tiny", "--device", "cpu", "--stub", "--layers", str(layers),
                                       "--prompt-tokens", "40", "--new-tokens", "2", "--top", "1"])
        found[layers] = {name: profile_prefix.call_counts(result["stats"]) for name, result in results.items()}
        assert profile_prefix.attention_per_layer(results["hit"]["stats"])[0] == layers
    out = capsys.readouterr().out
    assert "32 cached" in out and "   checked " in out  # the call sites of each count
    for name in ("checked", "to_device"):
        assert found[2]["hit"][name] == found[4]["hit"][name], (name, found)
        assert found[4]["hit"][name] <= found[4]["miss"][name] + 2, (name, found)
