"""The chart geometry (dashboard.web.charts): time labels that stay inside the chart, latency lines."""

from __future__ import annotations

import datetime as dt

import pytest

from dashboard.stats.latency import percentile
from dashboard.stats.outcomes import Bucket
from dashboard.web import charts


def test_the_last_label_is_anchored_at_its_end_so_it_is_not_clipped():
    start = dt.datetime(2026, 12, 1)
    buckets = [Bucket(start + dt.timedelta(hours=i)) for i in range(168)]
    ticks = charts.x_ticks(buckets, 24, "%b %d", 760, 44, 708 / 168, 759)
    assert [label for _, label, _ in ticks] == [f"Dec {d:02d}" for d in range(1, 8)]
    assert ticks[0][2] == "start" and ticks[-1] == (pytest.approx(44 + 144 * 708 / 168 + 2, abs=0.01), "Dec 07", "start")
    crowded = charts.x_ticks(buckets, 24, "%b %d", 760, 44, 716 / 168, 759)
    assert all(x + len(label) * charts.TICK_CHAR_PX <= 759 if anchor == "start" else x <= 759
               for x, label, anchor in crowded)
    near_edge = charts.x_ticks(buckets[:10], 9, "%H:%M", 100, 0, 10, 99)
    assert near_edge[-1] == (90, "09:00", "end")


def test_lines_break_where_there_is_no_value_and_share_one_scale():
    paths = charts.line_paths([([10, None, 20, 40], "p50", "p50"), ([None, None, 80, None], "p95", "p95")],
                              width=40, height=100)
    assert paths["peak"] == 80
    assert paths["p50"] == "M5 87.5h0M25 75h0L35 50"  # a gap after the first point: a new move
    assert paths["p95"] == "M25 0h0"
    assert charts.line_paths([([None], "p50", "p50")], 10, 10) == {"peak": 0, "p50": ""}


def test_nearest_rank_percentiles():
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 1.0)) == (50, 95, 100)
    assert percentile([7], 0.95) == 7
