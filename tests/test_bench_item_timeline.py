"""benchmarks.item_timeline: the summary of a one-launch call's per-item clock readings, its
command line, and one row end to end on the simulator."""

import json

import numpy as np
import pytest

from benchmarks import item_timeline


def test_summary_of_known_records():
    """Two rows of three splits (ns): the spans, the ramp, the items' own times, and each row's
    tail (its last end less the latest other end of the row: 900 - 600 and 1000 - 950), the
    critical one that of the row ending last (the second)."""
    starts = np.array([0, 100, 200, 50, 300, 400])
    ends = np.array([500, 600, 900, 950, 700, 1000])
    got = item_timeline.summarize(starts, ends, 3)
    assert got == pytest.approx(dict(span=1.0, ramp=0.4, item_p50=0.55, item_max=0.9, tail_p50=0.175, tail_max=0.3,
                                     critical_tail=0.05)), got


def test_unsplit_rows_have_no_tail():
    got = item_timeline.summarize(np.array([10, 20]), np.array([110, 220]), 1)
    assert (got["tail_p50"], got["tail_max"], got["critical_tail"], got["span"]) == (0, 0, 0, 0.21), got


@pytest.mark.parametrize("starts, ends, splits", [
    ([0, 1, 2], [3, 4, 5], 2), ([0, 1], [3, 4, 5], 1), ([0, 1], [3, 4], 0), ([[0, 1]], [[3, 4]], 1),
    (np.zeros(0, np.int64), np.zeros(0, np.int64), 1), ([0, 1], [3, 4], 2.0), ([0, 1], [3, 4], "2"),
    ([0.5, 1.5], [3.5, 4.5], 1)])
def test_records_that_are_no_call_raise_naming_the_sizes(starts, ends, splits):
    with pytest.raises(ValueError, match=f"splits={splits!r}"):
        item_timeline.summarize(np.array(starts), np.array(ends), splits)


@pytest.mark.parametrize("calls", ["0", "-1", "x", ""])
def test_a_bad_call_count_exits_naming_it(calls):
    with pytest.raises(SystemExit, match="--calls"):
        item_timeline.main(["--calls", calls])


def test_a_row_end_to_end_on_the_simulator(monkeypatch):
    """One B=1 row on the simulator (one-block splits, a grid of every item: one launch), the
    back-to-back timing stubbed to one call at 50 us: the row's items and splits are the
    plan's; its single calls' fields are medians (of two: ``outside`` is then the median event
    time less the median span); JSON-ready. No call at all is refused."""
    from benchmarks import gpu_common
    from hexcore.cuda import DecodeOptions
    from hexcore.cuda.timer import SimulatedClock, use_clock

    monkeypatch.setattr(gpu_common, "time_gpu", lambda fn, **kwargs: (fn(), 50e-6)[1])
    options = DecodeOptions(ctas_per_sm=64, split_blocks=1, eager_first=True)
    with use_clock(SimulatedClock(1000)):
        row = item_timeline.timeline_row("int4", (1, 8, 2, 40), 2, options)
    assert (row["items"], row["splits"], row["calls"]) == (2 * 2, 2, 2), row
    assert row["queued"] == row["paged"] == pytest.approx(50.0), row
    assert row["outside"] == pytest.approx(row["event"] - row["span"]), row  # (the simulator's events: -1 ms)
    assert 0 < row["item_max"] <= row["span"] and 0 <= row["ramp"] < row["span"], row
    json.dumps(row)
    with pytest.raises(ValueError, match="calls=0"):
        item_timeline.timeline_row("int4", (1, 8, 2, 40), 0, options)
