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
