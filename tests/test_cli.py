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
    assert "block_size" in capsys.readouterr().err
