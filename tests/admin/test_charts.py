"""The last hour's charts as the page draws them: the points read back, gaps left open, words for each."""

from __future__ import annotations

import re

from twisted.web.template import flattenString

from llmgw.admin import charts, pages
from llmgw.history import Figures, Scope, Series
from tests.support import histories


def flat(tag) -> str:
    out = []
    flattenString(None, pages.shown(tag)).addCallback(out.append)
    return out[0].decode()


def test_a_chart_carries_its_points_and_says_them_in_words():
    figures = histories.figures()
    html = flat(charts.figures_section(figures, None, 50))
    (qwen,) = re.findall(r'<figure class="chart" data-scope="model" data-subject="qwen" '
                         r'data-series="requests_per_s">.*?</figure>', html)
    points = re.search(r'data-points="([^"]*)"', qwen).group(1).split()
    assert points == ["-" if p is None else repr(p) for p in histories.QWEN_REQUESTS]
    assert 'role="img"' in qwen and "aria-labelledby=" in qwen
    assert "<title " in qwen and "requests/s of model qwen, last 1 h</title>" in qwen
    words = "now 3.5 req/s, lowest 2 req/s, highest 3.5 req/s, mean 2.15 req/s"
    assert f"<figcaption>{words}</figcaption>" in qwen and f">{words}</desc>" in qwen
    # Each label names one id the svg holds.
    for ident in re.search(r'aria-labelledby="([^"]*)"', qwen).group(1).split():
        assert f'id="{ident}"' in qwen


def test_a_gap_breaks_the_line_and_a_lone_point_is_a_dot():
    figures = Figures(10.0, 1000.0, [Series(Scope.NODE, "gpu01", "gpu_util_pct", "%", [10.0, 20.0, None, 30.0, None,
                                                                                       40.0, 50.0])])
    html = flat(charts.figures_section(figures, None, 50))
    assert html.count("<polyline") == 2 and html.count("<circle") == 1


def test_nothing_known_says_so_and_the_top_is_a_round_figure():
    figures = Figures(10.0, 1000.0, [Series(Scope.MODEL, "qwen", "queue", "requests", [None, None])])
    html = flat(charts.figures_section(figures, None, 50))
    assert "nothing known in this window" in html and "<polyline" not in html
    assert [charts.nice_top(h) for h in (0, 0.3, 3.5, 7, 42, 950, 1001)] == [1, 0.5, 5, 10, 50, 1000, 2000]


def test_the_figures_section_names_what_is_missing_and_clips_at_max_rows():
    figures = Figures(10.0, 1000.0, [Series(Scope.MODEL, f"m{i}", "queue", "requests", [1.0]) for i in range(5)])
    html = flat(charts.figures_section(figures, None, 2))
    assert html.count('class="chart-group"') == 2 and "and 3 more (admin.max_rows is 2)" in html
    assert "could not be read: no callee" in flat(charts.figures_section(None, "no callee", 2))
    assert "no figures yet" in flat(charts.figures_section(Figures(), None, 2))


def test_a_subjects_own_charts_are_only_its_own_and_nothing_when_it_has_none():
    figures = histories.figures()
    html = flat(charts.subject_section(figures, None, Scope.NODE, "gpu01", "Last hour"))
    assert html.count("<figure") == 3 and 'data-subject="qwen"' not in html
    assert charts.subject_section(figures, None, Scope.NODE, "cpu07", "Last hour") == ""
    hostile = Figures(10.0, 1000.0, [Series(Scope.MODEL, histories.HOSTILE, "queue", "requests", [1.0])])
    html = flat(charts.figures_section(hostile, None, 5))
    assert "<script>alert" not in html and "\x1b" not in html and "\\x1b[2J" in html


def test_an_api_keys_traffic_is_charted_after_the_models_and_nodes_by_its_name():
    figures = histories.figures()
    figures = Figures(figures.bucket_s, figures.end, [*figures.series,
                                                      Series(Scope.KEY, "search-team", "requests_per_s", "req/s", [1.0])])
    html = flat(charts.figures_section(figures, None, 50))
    assert html.index(">Models<") < html.index(">Nodes<") < html.index(">API keys<")
    assert 'data-scope="key" data-subject="search-team" data-series="requests_per_s"' in html
    assert "requests/s of key search-team" in html
