"""benchmarks/sanitize.py's selection flags: a sanitizer's pass over every kernel split into
parts that each fit a time-limited GPU call."""

import pytest

from benchmarks.sanitize import DTYPES, chosen_dtypes


def test_dtypes_flag_picks_a_subset_in_a_fixed_order():
    assert chosen_dtypes([]) == DTYPES == ("fp16", "int4", "int2")
    assert chosen_dtypes(["--no-tiered", "--dtypes", "int2,fp16"]) == ("fp16", "int2")
    assert chosen_dtypes(["--dtypes", "int4"]) == ("int4",)


@pytest.mark.parametrize("argv", [["--dtypes"], ["--dtypes", ""], ["--dtypes", "int8"], ["--dtypes", "int4,bf16"]])
def test_dtypes_flag_refuses_what_is_no_dtype(argv):
    with pytest.raises(SystemExit, match="--dtypes"):
        chosen_dtypes(argv)
