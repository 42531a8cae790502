"""The control plane's rolling figures (``llmgw.history.Figures``) as words: what the admin page and the TUI share.

A series' name is the control plane's (``requests_per_s``, ``gpu_util_pct``,
see docs/metrics.rst); :func:`label` says it as a person reads it, and a
name this module does not know is shown as it came, escaped, so a newer
server's figure still shows.  :func:`value` writes one figure in its unit
(``-`` where nothing was known: absent is not zero), and :func:`groups`
puts each subject's series in the order an operator looks at them.
"""

from __future__ import annotations

import math

import attrs

from llmgw.history import Figures, Scope, Series
from llmgw.render import DASH, said, size

#: How much of the series the charts and sparklines show.
WINDOW_S = 3600.0

LABELS = {
    "requests_per_s": "requests/s",
    "tokens_in_per_s": "tokens in/s",
    "tokens_out_per_s": "tokens out/s",
    "tokens_per_s": "tokens/s",
    "ttft_p50_ms": "time to first token p50",
    "ttft_p99_ms": "time to first token p99",
    "errors_per_s": "errors/s",
    "queue": "queue",
    "waiting": "waiting",
    "in_flight": "in flight",
    "memory_used_pct": "memory used",
    "memory_used_bytes": "memory used",
    "gpu_util_pct": "GPU busy",
    "gpu_memory_used_pct": "GPU memory used",
    "gpu_memory_used_bytes": "GPU memory used",
}
#: The order each scope's series are shown in; a name not listed comes after these, by name.
ORDER = {
    Scope.MODEL: ("requests_per_s", "tokens_per_s", "tokens_in_per_s", "tokens_out_per_s", "ttft_p50_ms",
                  "ttft_p99_ms", "errors_per_s", "queue", "waiting", "in_flight"),
    Scope.NODE: ("memory_used_pct", "memory_used_bytes", "gpu_util_pct", "gpu_memory_used_pct", "gpu_memory_used_bytes"),
    Scope.KEY: ("requests_per_s", "tokens_per_s", "tokens_in_per_s", "tokens_out_per_s", "errors_per_s"),
}


@attrs.frozen
class Summary:
    """What a series says in words: its newest known figure and the range over the window; None: nothing known."""

    latest: float | None
    low: float | None
    high: float | None
    mean: float | None
    known: int  # points with a figure


@attrs.frozen
class Group:
    """One subject's series (a model, a node or a key), in ``ORDER``."""

    scope: Scope
    subject: str
    series: list[Series]


def label(series: Series) -> str:
    return LABELS.get(series.name) or said(series.name.replace("_", " "))


def value(figure: float | None, unit: str) -> str:
    """*figure* in *unit*: ``1.5 GB``, ``35%``, ``120 ms``, ``3.2 req/s``; ``-`` when not known."""
    if figure is None or not math.isfinite(figure):
        return DASH
    if unit == "bytes":
        return size(figure)
    if unit == "%":
        return f"{figure:.0f}%"
    if unit == "ms":
        return f"{figure:.0f} ms" if abs(figure) >= 10 else f"{figure:.1f} ms"
    return f"{number(figure)} {said(unit)}".rstrip()


def number(figure: float) -> str:
    """Three significant figures at most, no exponent for what a fleet counts: ``0.25``, ``3.2``, ``41``, ``1200``."""
    if figure == 0:
        return "0"
    if abs(figure) >= 100:
        return f"{figure:.0f}"
    if abs(figure) >= 10:
        return f"{figure:.1f}".rstrip("0").rstrip(".")
    return f"{figure:.2f}".rstrip("0").rstrip(".")


def window(figures: Figures, seconds: float = WINDOW_S) -> int:
    """How many of a series' newest points cover *seconds*."""
    return max(1, math.ceil(seconds / figures.bucket_s)) if figures.bucket_s > 0 else 1


def recent(series: Series, points: int) -> list[float | None]:
    """The newest *points* of *series*, each finite or None."""
    return [p if p is not None and math.isfinite(p) else None for p in series.points[-points:]]


def summary(points: list[float | None]) -> Summary:
    known = [p for p in points if p is not None]
    if not known:
        return Summary(None, None, None, None, 0)
    latest = next(p for p in reversed(points) if p is not None)
    return Summary(latest, min(known), max(known), sum(known) / len(known), len(known))


def summary_words(series: Series, points: list[float | None]) -> str:
    """``now 3.2 req/s, lowest 0 req/s, highest 5 req/s, mean 2.1 req/s``, or that nothing was counted."""
    s = summary(points)
    if s.latest is None:
        return "nothing known in this window"
    unit = series.unit
    return (f"now {value(s.latest, unit)}, lowest {value(s.low, unit)}, highest {value(s.high, unit)}, "
            f"mean {value(s.mean, unit)}")


def groups(figures: Figures, scope: Scope, subject: str | None = None) -> list[Group]:
    """*scope*'s series by subject (only *subject*'s when given), subjects by name, each subject's in ``ORDER``."""
    by: dict[str, list[Series]] = {}
    for s in figures.series:
        if s.scope == scope and (subject is None or s.subject == subject):
            by.setdefault(s.subject, []).append(s)
    order = ORDER.get(scope, ())

    def rank(s: Series):
        return (order.index(s.name) if s.name in order else len(order), s.name)

    return [Group(scope, name, sorted(series, key=rank)) for name, series in sorted(by.items())]
