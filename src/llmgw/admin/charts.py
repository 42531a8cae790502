"""The last hour's figures (``llmgw.history.Figures``) as small SVG charts, drawn on the server.

No script draws them and no style is inline (the page's CSP refuses both):
each chart is an ``<svg>`` whose lines carry classes that admin.css colours.
Each says what it shows in words for those who cannot see it: the svg is
``role="img"`` labelled by its ``<title>`` and ``<desc>`` (what, for whom,
and its figures now, lowest, highest and mean), and the ``<figcaption>``
under it says the same.  The points themselves are on the svg as
``data-points`` (one figure a bucket, oldest first, ``-`` for a bucket
nothing was known in), so a test or a curious operator reads back exactly
what was drawn.

A gap (a bucket with nothing known) breaks the line rather than drawing it
down to zero: absent is not zero.
"""

from __future__ import annotations

import itertools

from twisted.web.template import Tag, tags

from llmgw import figurewords as words
from llmgw.figurewords import Group
from llmgw.history import Figures, Scope, Series
from llmgw.render import DASH
from llmgw.text import printable

WIDTH, HEIGHT = 300, 90
# Room for the top figure's label and the time axis.
TOP, BOTTOM, LEFT, RIGHT = 14, 14, 2, 2
_ids = itertools.count()


def _dom_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def nice_top(high: float) -> float:
    """The chart's top: the smallest of 1, 2, 2.5, 5 times a power of ten at or above *high* (1 for nothing)."""
    if high <= 0:
        return 1.0
    scale = 10 ** len(str(int(high))) / 10 if high >= 1 else 1.0
    while scale > high:
        scale /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * scale >= high:
            return step * scale
    return 10 * scale


def segments(points: list[float | None], top: float) -> list[list[tuple[float, float]]]:
    """The runs of known points as (x, y) in the svg's box; each gap starts a new run."""
    n = len(points)
    step = (WIDTH - LEFT - RIGHT) / max(n - 1, 1)
    runs: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    for i, p in enumerate(points):
        if p is None:
            if current:
                runs.append(current)
            current = []
            continue
        x = LEFT + i * step
        y = HEIGHT - BOTTOM - (max(p, 0.0) / top) * (HEIGHT - TOP - BOTTOM)
        current.append((round(x, 1), round(y, 1)))
    if current:
        runs.append(current)
    return runs


def points_attr(points: list[float | None]) -> str:
    return " ".join(DASH if p is None else repr(round(p, 6)) for p in points)


def chart(series: Series, figures: Figures, subject_words: str) -> Tag:
    """One series over the window, as a figure with its words."""
    points = words.recent(series, words.window(figures))
    summary = words.summary(points)
    title = f"{words.label(series)} of {subject_words}, last {minutes(figures, len(points))}"
    said = words.summary_words(series, points)
    title_id, desc_id = _dom_id("chart-title"), _dom_id("chart-desc")
    top = nice_top(summary.high or 0.0)
    drawn: list = [
        Tag("title")(title, id=title_id),
        Tag("desc")(said, id=desc_id),
        Tag("line")(x1=str(LEFT), x2=str(WIDTH - RIGHT), y1=str(HEIGHT - BOTTOM), y2=str(HEIGHT - BOTTOM),
                    class_="axis"),
        Tag("line")(x1=str(LEFT), x2=str(WIDTH - RIGHT), y1=str(TOP), y2=str(TOP), class_="grid"),
        Tag("text")(words.value(top, series.unit), x=str(LEFT), y=str(TOP - 3), class_="tick"),
        Tag("text")(f"-{minutes(figures, len(points))}", x=str(LEFT), y=str(HEIGHT - 2), class_="tick"),
        Tag("text")("now", x=str(WIDTH - RIGHT), y=str(HEIGHT - 2), class_="tick end"),
    ]
    for run in segments(points, top):
        if len(run) == 1:
            (x, y), = run
            drawn.append(Tag("circle")(cx=str(x), cy=str(y), r="1.8", class_="dot"))
        else:
            drawn.append(Tag("polyline")(points=" ".join(f"{x},{y}" for x, y in run), class_="line"))
    if summary.latest is None:
        drawn.append(Tag("text")("nothing known", x=str(WIDTH // 2), y=str(HEIGHT // 2), class_="tick middle"))
    svg = Tag("svg")(drawn, xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {WIDTH} {HEIGHT}", role="img",
                     class_="chart",
                     **{"aria-labelledby": f"{title_id} {desc_id}", "data-points": points_attr(points),
                        "data-unit": printable(series.unit), "data-bucket-s": repr(figures.bucket_s),
                        "data-end": repr(figures.end)})
    latest = words.value(summary.latest, series.unit)
    return tags.figure(
        tags.div(tags.span(words.label(series), class_="chart-name"), " ", tags.span(latest, class_="chart-now"),
                 class_="chart-head", **{"aria-hidden": "true"}),
        svg,
        tags.figcaption(said),
        class_="chart",
        **{"data-scope": str(series.scope), "data-subject": printable(series.subject),
           "data-series": printable(series.name)},
    )


def minutes(figures: Figures, points: int) -> str:
    span = figures.bucket_s * points
    if span >= 3600 and span % 3600 == 0:
        return f"{span / 3600:.0f} h"
    return f"{span / 60:.0f} min" if span >= 60 else f"{span:.0f} s"


def group_section(group: Group, figures: Figures, heading: Tag | str, level: str = "h3") -> Tag:
    kind = {Scope.MODEL: "model", Scope.NODE: "node", Scope.KEY: "key"}[group.scope]
    return tags.section(
        getattr(tags, level)(heading),
        tags.div([chart(s, figures, f"{kind} {group.subject}") for s in group.series], class_="charts"),
        class_="chart-group", **{"data-scope": str(group.scope), "data-subject": printable(group.subject)},
    )


def figures_section(figures: Figures | None, error: str | None, max_groups: int, link_for=None) -> Tag:
    """The cluster page's "Last hour": a group of charts per model, per node, then per API key (by its name in
    ``router.keys``); *link_for(scope, subject)*
    makes a heading a link (to the node's page)."""
    body: list = [tags.p(f"the figures could not be read: {error}", class_="bad")] if error else []
    shown_any = False
    if figures is not None:
        for scope, noun in ((Scope.MODEL, "Models"), (Scope.NODE, "Nodes"), (Scope.KEY, "API keys")):
            found = words.groups(figures, scope)
            if not found:
                continue
            shown_any = True
            parts = [group_section(g, figures, link_for(scope, g.subject) if link_for else g.subject)
                     for g in found[:max_groups]]
            more = (tags.p(f"and {len(found) - max_groups} more (admin.max_rows is {max_groups})", class_="empty")
                    if len(found) > max_groups else "")
            body.append(tags.section(tags.h3(noun, class_="chart-scope"), parts, more))
    if not shown_any and not error:
        body.append(tags.p("no figures yet: the server counts traffic and heartbeats as they come", class_="empty"))
    return tags.section(tags.h2("Last hour"), body, id="figures")


def subject_section(figures: Figures | None, error: str | None, scope: Scope, subject: str, heading: str) -> Tag | str:
    """A node's or a model's own charts, for its page; nothing when there are none and nothing went wrong."""
    if error:
        return tags.section(tags.h2(heading), tags.p(f"the figures could not be read: {error}", class_="bad"))
    found = words.groups(figures, scope, subject) if figures is not None else []
    if not found:
        return ""
    kind = {Scope.MODEL: "model", Scope.NODE: "node", Scope.KEY: "key"}[scope]
    return tags.section(tags.h2(heading),
                        tags.div([chart(s, figures, f"{kind} {subject}") for s in found[0].series], class_="charts"),
                        id="figures")
