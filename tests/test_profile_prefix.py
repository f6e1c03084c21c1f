"""benchmarks.profile_prefix on a tiny random Llama (CPU, the CUDA simulator; skipped
without transformers): the hit finds its prefix cached and both cases are reported."""

import numpy as np
import pytest


def test_profile_prefix_reports_a_hit_and_a_miss(capsys):
    pytest.importorskip("transformers")
    from benchmarks import profile_prefix

    results = profile_prefix.main(["--tiny", "--device", "cpu", "--prompt-tokens", "40", "--new-tokens", "2",
                                   "--top", "5", "--repeats", "1"])
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
                                       "--prompt-tokens", "40", "--new-tokens", "2", "--top", "1", "--repeats", "1"])
        found[layers] = {name: profile_prefix.call_counts(result["stats"]) for name, result in results.items()}
        assert profile_prefix.attention_per_layer(results["hit"]["stats"])[0] == layers
    out = capsys.readouterr().out
    assert "32 cached" in out and "   checked " in out  # the call sites of each count
    for name in ("checked", "to_device"):
        assert found[2]["hit"][name] == found[4]["hit"][name], (name, found)
        assert found[4]["hit"][name] <= found[4]["miss"][name] + 2, (name, found)


def test_a_hit_launches_no_host_array_and_copies_its_ids_once_per_forward_and_once_per_commit(capsys):
    # --stub on the simulator, one counted turn each: no launch takes a host (numpy) array
    # (numba would copy it per launch); the hit's ids go up in two copies, its rows' at the
    # first layer and its prefill's at the commit (before: four, tables, packed rows, slots
    # and positions each), the miss's in one (before: three); timed turns without a profiler
    pytest.importorskip("transformers")
    from benchmarks import profile_prefix

    results = profile_prefix.main(["--tiny", "--device", "cpu", "--stub", "--prompt-tokens", "40", "--new-tokens",
                                   "2", "--top", "1", "--repeats", "3"])
    out = capsys.readouterr().out
    hit, miss = results["hit"], results["miss"]
    assert hit["launches"]["launches"] > 0 and hit["launches"]["host array arguments"] == 0
    assert miss["launches"]["host array arguments"] == 0
    assert (hit["launches"]["of id arrays"], miss["launches"]["of id arrays"]) == (2, 1)
    assert len(hit["unprofiled"]) == len(miss["unprofiled"]) == 3 and min(hit["unprofiled"]) > 0
    assert out.count("-- unprofiled: best ") == 2 and out.count("-- one more turn, counted: launches ") == 2
    # each timed turn: one attention call per layer (2), each timed, within its turn's wall time
    for result in (hit, miss):
        assert [len(calls) for calls in result["phases"]] == [2, 2, 2]
        assert all(0 < sum(calls) + sum(calls.admit) < wall for calls, wall in zip(result["phases"],
                                                                                   result["unprofiled"]))
        assert [len(calls.admit) for calls in result["phases"]] == [1, 1, 1]
    assert out.count("-- host in the attention function: 2 calls a turn") == 2


def test_the_launch_counter_finds_a_host_array_argument():
    # counted_launches itself: a host array given to a launch is counted with its kernel
    # and call site (none in hexcore here), a device array is not, and nothing is counted
    # once it is closed
    from numba import cuda

    from benchmarks import profile_prefix
    from hexcore.cuda.store import _fill_words_kernel

    words = np.zeros(8, np.uint32)
    with profile_prefix.counted_launches() as found:
        _fill_words_kernel[1, 32](words, np.uint32(7))
        _fill_words_kernel[1, 32](cuda.to_device(words), np.uint32(7))
        cuda.to_device(np.zeros(4, np.int32))
    assert (found["launches"], found["host array arguments"], found["host-to-device copies"]) == (2, 1, 2)
    assert found["of id arrays"] == 1 and found["sites"] == {"_fill_words_kernel at ?": 1}
    _fill_words_kernel[1, 32](words, np.uint32(7))
    assert found["launches"] == 2


def test_repeats_must_not_be_negative():
    from benchmarks import profile_prefix

    with pytest.raises(SystemExit):
        profile_prefix.main(["--tiny", "--device", "cpu", "--repeats", "-1"])


def test_detail_times_each_function_once_per_call_and_restores_them(capsys):
    # --detail on the simulator (launches stubbed): the hit's turn starts its rows once and
    # calls the engine's batch attention once per layer; the miss stages once per layer;
    # every wrapped function is the original again afterwards
    pytest.importorskip("transformers")
    from benchmarks import profile_prefix
    from hexcore.engine import Engine
    from hexcore.integrations import _hf_prefix

    before = (_hf_prefix.Extend._start, Engine.prefill_attention_batch, _hf_prefix.real_tokens)
    results = profile_prefix.main(["--tiny", "--device", "cpu", "--stub", "--prompt-tokens", "40", "--new-tokens",
                                   "2", "--top", "1", "--repeats", "2", "--detail"])
    assert (_hf_prefix.Extend._start, Engine.prefill_attention_batch, _hf_prefix.real_tokens) == before
    for turn in results["hit"]["phases"]:
        assert len(turn.detail["Extend._start"]) == 1 and len(turn.detail["Engine.prefill_attention_batch"]) == 2
        assert 0 < sum(turn.detail["Engine.prefill_attention_batch"]) < sum(turn)
    for turn in results["miss"]["phases"]:
        assert len(turn.detail["Prefill.stage"]) == 2 and not turn.detail["Extend._start"]
    assert capsys.readouterr().out.count("-- host by function (median a turn") == 2
