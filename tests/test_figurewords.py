"""The figures' words the admin page and the dashboard share: units, absent figures, order."""

from __future__ import annotations

import math

from llmgw import figurewords as words
from llmgw.history import Figures, Scope, Series


def test_each_unit_is_written_as_an_operator_reads_it_and_absent_is_a_dash_not_zero():
    assert words.value(None, "req/s") == "-"
    assert words.value(math.nan, "ms") == "-"
    assert words.value(0.0, "req/s") == "0 req/s"
    assert words.value(3.25, "req/s") == "3.25 req/s"
    assert words.value(41.37, "tok/s") == "41.4 tok/s"
    assert words.value(1234.5, "tok/s") == "1234 tok/s" or words.value(1234.5, "tok/s") == "1235 tok/s"
    assert words.value(950.0, "ms") == "950 ms" and words.value(2.5, "ms") == "2.5 ms"
    assert words.value(35.4, "%") == "35%"
    assert words.value(1.5e9, "bytes") == "1.5 GB"


def test_a_summary_skips_the_buckets_nothing_was_known_in():
    s = words.summary([None, 2.0, None, 4.0, None])
    assert (s.latest, s.low, s.high, s.mean, s.known) == (4.0, 2.0, 4.0, 3.0, 2)
    assert words.summary([None, None]).latest is None
    series = Series(Scope.MODEL, "qwen", "requests_per_s", "req/s", [None, 2.0, 4.0])
    assert words.summary_words(series, series.points) == ("now 4 req/s, lowest 2 req/s, highest 4 req/s, "
                                                          "mean 3 req/s")
    assert words.summary_words(series, [None]) == "nothing known in this window"


def test_series_are_grouped_by_subject_in_the_order_an_operator_reads_them_and_an_unknown_name_still_shows():
    figures = Figures(10.0, 100.0, [
        Series(Scope.MODEL, "qwen", "queue", "requests", [1.0]),
        Series(Scope.MODEL, "qwen", "zz_new_figure", "x", [1.0]),
        Series(Scope.MODEL, "qwen", "requests_per_s", "req/s", [1.0]),
        Series(Scope.MODEL, "llama", "requests_per_s", "req/s", [1.0]),
        Series(Scope.NODE, "gpu01", "gpu_util_pct", "%", [1.0]),
    ])
    groups = words.groups(figures, Scope.MODEL)
    assert [g.subject for g in groups] == ["llama", "qwen"]
    assert [s.name for s in groups[1].series] == ["requests_per_s", "queue", "zz_new_figure"]
    assert words.label(groups[1].series[2]) == "zz new figure"
    assert [g.subject for g in words.groups(figures, Scope.NODE, "gpu01")] == ["gpu01"]
    assert words.groups(figures, Scope.NODE, "gpu02") == []


def test_the_window_is_an_hour_of_buckets_and_a_bad_figure_is_no_figure():
    figures = Figures(10.0, 100.0, [])
    assert words.window(figures) == 360
    series = Series(Scope.MODEL, "m", "queue", "requests", [1.0] * 400 + [math.inf])
    shown = words.recent(series, words.window(figures))
    assert len(shown) == 360 and shown[-1] is None
