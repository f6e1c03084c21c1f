"""benchmarks.bench_decode's command line (CPU): its named shape sets and shapes of one's own."""

import pytest

from benchmarks import bench_decode


def test_named_shape_sets():
    assert bench_decode.parse_shapes("all") == bench_decode.SHAPES
    assert bench_decode.parse_shapes("quick") == bench_decode.QUICK
    assert bench_decode.parse_shapes("b1") == bench_decode.SHAPES[5:]


def test_shapes_of_ones_own():
    assert bench_decode.parse_shapes("32,32,8,4096;64,64,8,4096") == [(32, 32, 8, 4096), (64, 64, 8, 4096)]
    assert bench_decode.parse_shapes("1,9,3,1000") == [(1, 9, 3, 1000)]


@pytest.mark.parametrize("text", ["most", "32,32,8", "32,32,8,4096,1", "32,30,8,4096", "0,32,8,4096", "a,b,c,d",
                                  "32,32,8,4096;"])
def test_a_bad_shape_names_itself(text):
    with pytest.raises(SystemExit, match="--shapes"):
        bench_decode.parse_shapes(text)


def test_a_run_cut_after_its_first_shape_keeps_that_shapes_rows(tmp_path, monkeypatch, capsys):
    """``main`` saves shape by shape (a GPU call cut by its time limit keeps what it timed):
    the second shape raises, and the JSON holds the first shape's rows, each printed."""
    import json

    def rows_for(shape, *args, **kwargs):
        if shape[0] == 2:
            raise TimeoutError("cut")
        return [bench_decode._row("hexcore fp16", shape, 1e-5, 1e6, 1e6)]

    monkeypatch.setattr(bench_decode, "rows_for", rows_for)
    monkeypatch.setenv("OUT", str(tmp_path))
    with pytest.raises(TimeoutError):
        bench_decode.main(["--shapes", "1,32,8,1024;2,32,8,1024", "--name", "cut", "--queued"])
    saved = json.loads((tmp_path / "decode_cut.json").read_text())["rows"]
    assert [(r["kernel"], r["B"], r["queued"]) for r in saved] == [("hexcore fp16", 1, True)]
    assert "timed (1/2): hexcore fp16 (1, 32, 8, 1024): 0.01 ms" in capsys.readouterr().out
