import pytest

from hexcore.cli import capacity_table, main


def test_capacity_table_lists_every_dtype():
    table = capacity_table("llama-3-8b", 40, 256, 32)
    assert all(d in table for d in ("fp16", "int4", "int2"))


def test_demo_prints_table_and_layout(capsys):
    assert main(["demo", "--preset", "mistral-7b", "--budget-gib", "8", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "mistral-7b" in out and "layout agreement" in out and "DISAGREES" not in out
    assert "served" in out and "step   0" in out


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


@pytest.mark.parametrize("args", [("llama-3-8b", float("nan"), 4, 32), ("llama-3-8b", -1, 4, 32),
                                  ("llama-3-8b", True, 4, 32), ("llama-3-8b", 1, None, 32), ("x", 1, 4, 32),
                                  ("llama-3-8b", 1, 4, 12)])
def test_capacity_table_raises_typed_errors(args):
    from hexcore import HexcoreError

    with pytest.raises(HexcoreError):
        capacity_table(*args)
