"""benchmarks.gpu_common.save: rows as JSON and a printed table."""

import json

from benchmarks.gpu_common import save


def test_save_prints_rows_whose_keys_differ(tmp_path, monkeypatch, capsys):
    """A row without a later row's key (a tiered decode row has no register count) prints
    an empty cell instead of stopping the run before its table."""
    monkeypatch.setenv("OUT", str(tmp_path))
    rows = [dict(kernel="hexcore int4", ms=0.5, regs=128), dict(kernel="hexcore int4-aged", ms=0.25)]
    save("rows", rows)
    assert json.loads((tmp_path / "rows.json").read_text())["rows"] == rows
    lines = [line.rstrip() for line in capsys.readouterr().out.strip().splitlines()]
    assert lines == ["kernel | ms | regs", "hexcore int4 | 0.5 | 128", "hexcore int4-aged | 0.25 |"]
