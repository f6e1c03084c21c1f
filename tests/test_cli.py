import json

import numpy as np
import pytest

from hexcore.cli import capacity_table, main


def test_capacity_table_lists_every_dtype():
    table = capacity_table("llama-3-8b", 40, 256, 32)
    assert all(d in table for d in ("fp16", "int4", "int2"))


def test_demo_prints_table_layout_and_a_served_summary(capsys, tmp_path):
    path = tmp_path / "demo.json"
    argv = ["demo", "--preset", "mistral-7b", "--budget-gib", "8", "--requests", "1", "--steps", "2",
            "--kv-dtype", "int2", "--seed", "3", "--no-progress", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mistral-7b" in out and "layout agreement" in out and "DISAGREES" not in out
    assert "serving 1 requests (int2" in out and "step latency p50 / p99" in out and "attention error" in out
    summary = json.loads(path.read_text())
    assert summary["kv_dtype"] == "int2" and 1 <= summary["steps"] <= 2 and summary["decode_tokens"] == summary["steps"]
    assert summary["peak_kv_bytes_fp16"] >= summary["peak_kv_bytes"] and summary["mirror_mismatches"] == 0


def test_demo_serves_from_a_format_by_age(capsys, tmp_path):
    path = tmp_path / "demo.json"
    argv = ["demo", "--requests", "2", "--steps", "3", "--format", "int2-aged", "--seed", "1", "--no-progress",
            "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "serving 2 requests (int2-aged" in out and "last pool of" in out and "re-seals as blocks aged" in out
    summary = json.loads(path.read_text())
    assert summary["format"] == summary["kv_dtype"] == "int2-aged" and 1 <= summary["steps"] <= 3
    assert summary["fault_tolerance"] == {"available": False, "note": "not with a format by age"}


@pytest.mark.parametrize("flag,warmup", [([], None), (["--no-warmup"], False)])
def test_demo_passes_no_warmup_to_the_run(monkeypatch, capsys, flag, warmup):
    """``--no-warmup`` turns the warm-up off; without it the run decides (on a GPU only)."""
    from hexcore import cli, demo

    seen = {}

    def served(shape, requests, **options):
        seen.update(options)
        return demo.summarize(shape, demo.ServeReport(requests=requests), {"available": False, "note": "test"})

    monkeypatch.setattr(cli, "_layout_report", lambda preset, block_size: "layout agreement: skipped")
    monkeypatch.setattr(demo, "run_demo", served)
    assert main(["demo", "--requests", "1", "--no-progress", *flag]) == 0
    assert seen["warmup"] is warmup and "compile and warm-up" in capsys.readouterr().out


def test_plan_prices_the_formats_by_age_at_the_context(capsys):
    from hexcore.cli import GIB

    assert main(["plan", "--preset", "llama-3-8b", "--memory", "80GiB", "--context", "4096"]) == 0
    out = capsys.readouterr().out
    assert "formats by age, one sequence of 4,096 tokens (Engine(format=...)" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    # llama-3-8b at 4096 tokens, tail included (benchmarks/quality-notes.md): FP16 132096 B/token
    for name, per_token in (("int4-aged", 41376), ("int2-aged", 25936)):
        assert rows[name][1:] == [f"{per_token:.1f}", f"{132096 / per_token:.2f}x",
                                  f"{80 * GIB // (per_token * 4096):,}"]
    assert main(["plan", "--preset", "llama-3-8b"]) == 0  # without --context: priced at 4096
    assert "one sequence of 4,096 tokens" in capsys.readouterr().out


def test_plan_memory_and_context(capsys):
    from hexcore import KVCacheConfig
    from hexcore.cli import GIB, sequences_at_context

    assert main(["plan", "--preset", "llama-3-8b", "--memory", "80GiB", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "80 GiB budget" in out and "seqs @ 8,192" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip()}
    for dtype in ("fp16", "int4", "int2"):
        cfg = KVCacheConfig.from_preset("llama-3-8b", kv_dtype=dtype, block_size=32)
        assert int(rows[dtype][-1].replace(",", "")) == sequences_at_context(cfg, 80 * GIB, 8192)
        assert float(rows[dtype][1]) == cfg.block_bytes / 32  # bytes per token
    fp16 = KVCacheConfig.from_preset("llama-3-8b", block_size=32)
    # 128 KiB per token in FP16: 8192 tokens are 1 GiB plus a 4 MiB tail, so 79 sequences fit in 80 GiB
    assert fp16.block_bytes / 32 == 131072 and sequences_at_context(fp16, 80 * GIB, 8192) == 79
    assert int(rows["int2"][-1].replace(",", "")) > int(rows["int4"][-1].replace(",", "")) > 79
    assert main(["plan", "--memory", "512MiB"]) == main(["plan", "--memory", "0.5"]) == 0
    first, second = capsys.readouterr().out.split("llama-3-8b: ")[1:]
    assert first == second


def test_bench_draws_the_committed_gpu_runs(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import report

    assert report.main(["--out", str(tmp_path), "--plots-only"]) == 0
    assert {p.name for p in tmp_path.glob("*.png")} == {"decode_bandwidth.png", "decode_speedup.png",
                                                        "graph_host.png"}


def test_decode_json_finds_a_folders_decode_table(tmp_path):
    from benchmarks.report import GPU_RUN, decode_json

    assert decode_json(tmp_path) is None
    (tmp_path / "decode_table.json").write_text("{}")
    assert decode_json(tmp_path) == tmp_path / "decode_table.json"
    (tmp_path / "decode_other.json").write_text("{}")
    assert decode_json(tmp_path) is None  # two named tables: which one is not guessed
    (tmp_path / "decode_new.json").write_text("{}")
    assert decode_json(tmp_path) == tmp_path / "decode_new.json"
    assert decode_json(GPU_RUN) is not None  # the committed run the plots default to


def test_plan_rejects_bad_block_size(capsys):
    assert main(["plan", "--block-size", "12"]) == 2
    assert "--block-size" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["plan", "--budget-gib", "nan"], "--budget-gib"), (["plan", "--budget-gib", "-1"], "--budget-gib"),
    (["plan", "--budget-gib", "inf"], "--budget-gib"), (["plan", "--budget-gib", "0"], "--budget-gib"),
    (["plan", "--budget-gib", "1e300"], "--budget-gib"), (["plan", "--budget-gib", "x"], "--budget-gib"),
    (["plan", "--max-seqs", "0"], "--max-seqs"), (["plan", "--max-seqs", "1" + "0" * 30], "--max-seqs"),
    (["plan", "--max-seqs", "2.5"], "--max-seqs"), (["plan", "--block-size", "1024"], "--block-size"),
    (["demo", "--steps", "-1"], "--steps"), (["demo", "--kv-dtype", "int3"], "--kv-dtype"),
    (["plan", "--preset", "gpt-5"], "--preset"), (["plan", "--bogus"], "--bogus"), ([], "command"),
    (["plan", "--budget-gib"], "--budget-gib"), (["frobnicate"], "frobnicate"),
    (["demo", "--requests", "0"], "--requests"), (["demo", "--seed", "-1"], "--seed"),
    (["demo", "--json", "/nonexistent-dir/x.json"], "--json"), (["plan", "--memory", "80XB"], "--memory"),
    (["plan", "--memory", "nanGiB"], "--memory"), (["plan", "--memory", "0GiB"], "--memory"),
    (["plan", "--context", "0"], "--context"), (["bench", "--out", "pyproject.toml"], "--out"),
    (["bench", "--frobnicate"], "--frobnicate"),
])
def test_bad_flags_print_one_line_naming_the_flag_and_return_2(capsys, argv, flag):
    """Hardening (issue 13): a bad argument is one line naming the flag, exit status 2, no traceback."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and flag in captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith("hexcore: ") and "Traceback" not in captured.err


def test_help_returns_0_and_main_never_raises(capsys):
    assert main(["--help"]) == 0 and main(["plan", "-h"]) == 0
    assert "usage" in capsys.readouterr().out
    assert main("plan") == 2 and main([b"plan"]) == 2  # not a list of str: one line, status 2


def test_plan_at_the_edges_of_its_flags(capsys):
    assert main(["plan", "--budget-gib", "4294967295", "--max-seqs", "2147483647", "--block-size", "256"]) == 0
    assert main(["plan", "--budget-gib", "1e-9", "--max-seqs", "1", "--block-size", "16"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("fp16") for line in out.splitlines()) == 2
    assert "int4-aged             - (its tier ages [32] are not multiples of block_size 256)" in out


@pytest.mark.parametrize("args", [("llama-3-8b", float("nan"), 4, 32), ("llama-3-8b", -1, 4, 32),
                                  ("llama-3-8b", True, 4, 32), ("llama-3-8b", 1, None, 32), ("x", 1, 4, 32),
                                  ("llama-3-8b", 1, 4, 12)])
def test_capacity_table_raises_typed_errors(args):
    from hexcore import HexcoreError

    with pytest.raises(HexcoreError):
        capacity_table(*args)


@pytest.mark.parametrize("name, args, text", [
    ("format_rows", ("llama-3-8b", None, 32, 4096), "budget_bytes: expected an int, got NoneType"),
    ("format_rows", ("llama-3-8b", float("nan"), 32, 4096), "budget_bytes: expected an int, got float nan"),
    ("format_rows", ("llama-3-8b", np.int64(0), 32, 4096), r"budget_bytes: expected an int in \[1, "),
    ("format_rows", ("llama-3-8b", 2**30, 32, 0), r"context: expected an int in \[1, "),
    ("sequences_at_context", (None, 2**30, 4096), "cfg: expected KVCacheConfig, got NoneType"),
    ("sequences_at_context", ("cfg", "3", 4096), "budget_bytes: expected an int, got str"),
    ("sequences_at_context", ("cfg", 2**30, -1), r"context: expected an int in \[1, "),
])
def test_format_rows_and_sequences_at_context_raise_typed_errors(name, args, text):
    """Were TypeError, ValueError, OverflowError (a uint8 budget) and ZeroDivisionError
    (context -1), or AttributeError for a config that is not one."""
    from hexcore import HexcoreInvalidArgumentError, KVCacheConfig
    from hexcore import cli

    cfg = KVCacheConfig.from_preset("llama-3-8b")
    args = tuple(cfg if a == "cfg" else a for a in args)
    with pytest.raises(HexcoreInvalidArgumentError, match=text):
        getattr(cli, name)(*args)
    assert cli.format_rows("llama-3-8b", np.uint8(1), 32, 4096)  # was OverflowError: a numpy int is an int
    assert cli.sequences_at_context(cfg, 2**30, 4096) == 2**30 // (cfg.tail_bytes + 4096 // cfg.block_size
                                                                  * cfg.block_bytes)
