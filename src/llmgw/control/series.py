"""The last hour's figures without Prometheus: a fixed ring of buckets per series, per model, key and node.

``Rolling`` keeps ``buckets`` buckets of ``bucket_s`` seconds (server.yaml's
``history.series_buckets`` and ``history.series_bucket_s``: 360 of 10 s, an
hour) for at most ``history.series_subjects`` subjects — models, keys and
nodes together.  Each series is an ``array('f')`` of one float per bucket,
allocated when its first figure is known, so its memory is fixed whatever
the traffic: docs/metrics.rst gives the bytes.  When a new subject would be
one too many, the least recently updated one is let go, and the log says so
once; one written in the same bucket is never let go for a newcomer — the
newcomer is then not kept, so a fleet larger than the bound does not churn
every subject every bucket.  The open bucket holds as many names at most,
so a router naming thousands of keys costs no more than the bound.

What goes in a bucket comes from ``llmgw.control.seriesfeed``: the
traffic's differences as they arrive (``add_model``, ``add_key``), and,
when the bucket closes, a sample of the gauges (queue, each node's figures)
from the samplers the feed sets.  A bucket closes once the clock has passed
its end: on the next report, figure read, or the server's timer, whichever
comes first.  A bucket no report reached is None, never 0: absent is not
zero.  A rate is the bucket's count over the seconds it covered (the first
bucket after a start covers less than ``bucket_s``).

The time to first token's percentiles are made from the bucket's counts per
``traffic.TTFT_BUCKETS_MS`` edge: the rank's bucket is found and the value
interpolated linearly between its edges, as Prometheus's
``histogram_quantile`` does; past the last edge, the last edge (60 s) is
the answer — "at least".
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from typing import Callable

import attrs
from twisted.logger import Logger

from llmgw.history import PAGE_MOST, Figures, Scope, Series
from llmgw.traffic import TTFT_BUCKETS_MS

log = Logger()

#: Each scope's series, in the order an answer lists them: (name, unit).
MODEL_SERIES = (
    ("requests_per_s", "req/s"), ("tokens_in_per_s", "tok/s"), ("tokens_out_per_s", "tok/s"),
    ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"), ("errors_per_s", "req/s"), ("queue", "requests"),
)
#: The error classes a router counts (``traffic.ModelCounts.errors``), each its own series once seen;
#: a class not named here is counted in ``errors_per_s`` only.
ERROR_CLASSES = ("4xx", "429", "5xx", "503", "upstream")
ERROR_SERIES = tuple((f"errors_{c}_per_s", "req/s") for c in ERROR_CLASSES)
KEY_SERIES = (("requests_per_s", "req/s"), ("tokens_per_s", "tok/s"))
NODE_SERIES = (("memory_used_pct", "%"), ("gpu_util_pct", "%"), ("gpu_memory_used_pct", "%"))
_SERIES = {Scope.MODEL: MODEL_SERIES + ERROR_SERIES, Scope.KEY: KEY_SERIES, Scope.NODE: NODE_SERIES}
_UNITS = {scope: dict(names) for scope, names in _SERIES.items()}
# Shown even before their first figure (as None); the error classes only once one is seen.
_ALWAYS = {Scope.MODEL: MODEL_SERIES, Scope.KEY: KEY_SERIES, Scope.NODE: NODE_SERIES}
_SCOPE_ORDER = {Scope.MODEL: 0, Scope.KEY: 1, Scope.NODE: 2}
_NAN = float("nan")


def percentile(counts: list[int], q: float) -> float | None:
    """The *q* quantile (0 < q < 1) of counts per ``TTFT_BUCKETS_MS`` bucket, in ms; None when none were counted."""
    total = sum(counts)
    if total <= 0 or len(counts) != len(TTFT_BUCKETS_MS) + 1:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i == len(TTFT_BUCKETS_MS):
                return float(TTFT_BUCKETS_MS[-1])
            low = TTFT_BUCKETS_MS[i - 1] if i else 0
            return low + (TTFT_BUCKETS_MS[i] - low) * (rank - below) / n
        below += n
    return float(TTFT_BUCKETS_MS[-1])  # not reached: the last non-empty bucket holds the rank


@attrs.define
class ModelBucket:
    """One model's traffic in the open bucket, summed over every router's differences."""

    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    errors: int = 0
    by_class: dict[str, int] = attrs.Factory(dict)
    ttft: list[int] = attrs.Factory(lambda: [0] * (len(TTFT_BUCKETS_MS) + 1))


class _Subject:
    """One model's, key's or node's rings, and the newest bucket written to them."""

    __slots__ = ("scope", "name", "newest", "rings")

    def __init__(self, scope: Scope, name: str):
        self.scope = scope
        self.name = name
        self.newest = -1
        self.rings: dict[str, array] = {}


class Rolling:
    """Every series, bucketed alike; *clock* gives wall time (``seconds()``)."""

    def __init__(self, clock, bucket_s: float = 10.0, buckets: int = 360, subjects: int = 2000):
        self.clock = clock
        self.bucket_s = float(bucket_s)
        self.buckets = int(buckets)
        self.subjects = int(subjects)
        self._subjects: OrderedDict[tuple[Scope, str], _Subject] = OrderedDict()
        self._open: int | None = None  # the bucket now filling
        self._since: float | None = None  # when the first bucket began to fill
        self._models: dict[str, ModelBucket] = {}
        self._keys: dict[str, list[int]] = {}
        # Set by the feed: each gauge's value now, sampled as a bucket closes.
        self.queue_sampler: Callable[[], dict[str, int]] = dict
        self.node_sampler: Callable[[], dict[str, tuple[float | None, ...]]] = dict
        # Subjects let go to keep the bound, and newcomers not kept; the log says so once.
        self.let_go = 0
        self.not_kept = 0
        self._told = False

    def bucket_of(self, now: float) -> int:
        return math.floor(now / self.bucket_s)

    # -- filling the open bucket ------------------------------------------------------------

    def model(self, now: float, model: str) -> ModelBucket:
        """The open bucket's figures of *model*, for the feed to add a report's differences to."""
        self.advance(now)
        found = self._models.get(model)
        if found is None:
            if not self._room(Scope.MODEL, model):
                return ModelBucket()  # added to, then let go: a name past the bound is not kept
            found = self._models[model] = ModelBucket()
        return found

    def add_key(self, now: float, key: str, requests: int, tokens: int) -> None:
        self.advance(now)
        found = self._keys.get(key)
        if found is None:
            if self._room(Scope.KEY, key):
                self._keys[key] = [requests, tokens]
        else:
            found[0] += requests
            found[1] += tokens

    def _room(self, scope: Scope, name: str) -> bool:
        """Whether the open bucket may take one more name: at most ``subjects``, as the rings hold."""
        if len(self._models) + len(self._keys) < self.subjects:
            return True
        self.not_kept += 1
        self._tell(f"not keeping the figures of {scope} {name!r}")
        return False

    def advance(self, now: float) -> None:
        """Close every bucket that ended by *now*: the open one with its figures, any skipped one as unknown.

        The gauges are sampled as the open bucket closes, which the server's timer does on time.
        """
        current = self.bucket_of(now)
        if self._open is None:
            self._open, self._since = current, now
            return
        if current <= self._open:
            return
        self._close(self._open)
        self._open = current

    def _close(self, bucket: int) -> None:
        start = bucket * self.bucket_s
        seconds = self.bucket_s - max(0.0, min(self.bucket_s, (self._since or start) - start))
        per_s = 1.0 / max(seconds, 1e-3)
        queues = self.queue_sampler()
        for name, m in self._models.items():
            values = {
                "requests_per_s": m.requests * per_s, "tokens_in_per_s": m.tokens_in * per_s,
                "tokens_out_per_s": m.tokens_out * per_s, "errors_per_s": m.errors * per_s,
                "ttft_p50_ms": percentile(m.ttft, 0.5), "ttft_p99_ms": percentile(m.ttft, 0.99),
                "queue": queues.get(name),
            }
            for c, n in m.by_class.items():
                if c in ERROR_CLASSES:
                    values[f"errors_{c}_per_s"] = n * per_s
            self._put(bucket, Scope.MODEL, name, values)
        for name, queue in queues.items():
            if name not in self._models:
                self._put(bucket, Scope.MODEL, name, {"queue": queue})
        for name, (requests, tokens) in self._keys.items():
            self._put(bucket, Scope.KEY, name, {"requests_per_s": requests * per_s, "tokens_per_s": tokens * per_s})
        for name, figures in self.node_sampler().items():
            self._put(bucket, Scope.NODE, name, dict(zip((n for n, _ in NODE_SERIES), figures)))
        self._models = {}
        self._keys = {}

    # -- the rings ---------------------------------------------------------------------------

    def _put(self, bucket: int, scope: Scope, name: str, values: dict[str, float | None]) -> None:
        key = (scope, name)
        subject = self._subjects.get(key)
        if subject is None:
            subject = self._admit(bucket, key)
            if subject is None:
                return
        else:
            self._subjects.move_to_end(key)
        n = self.buckets
        if bucket > subject.newest:
            gap = range(max(subject.newest + 1, bucket - n + 1), bucket)
            for ring in subject.rings.values():
                for b in gap:
                    ring[b % n] = _NAN
                ring[bucket % n] = _NAN
            subject.newest = bucket
        slot = bucket % n
        for series, value in values.items():
            if value is None:
                continue
            ring = subject.rings.get(series)
            if ring is None:
                ring = subject.rings[series] = array("f", [_NAN]) * n
            ring[slot] = value

    def _admit(self, bucket: int, key: tuple[Scope, str]) -> _Subject | None:
        if len(self._subjects) >= self.subjects:
            oldest_key, oldest = next(iter(self._subjects.items()))
            if oldest.newest >= bucket:
                self.not_kept += 1
                self._tell(f"not keeping the figures of {key[0]} {key[1]!r}")
                return None
            del self._subjects[oldest_key]
            self.let_go += 1
            self._tell(f"letting go of the least recently updated, first {oldest.scope} {oldest.name!r}")
        subject = self._subjects[key] = _Subject(*key)
        return subject

    def _tell(self, what: str) -> None:
        if not self._told:
            self._told = True
            log.warn("the last hour's figures keep at most {n} models, keys and nodes (history.series_subjects in "
                     "server.yaml): {what}; raise it to keep them all (docs/metrics.rst)", n=self.subjects, what=what)

    # -- reading -----------------------------------------------------------------------------

    def figures(self, scope: Scope | None = None, subject: str | None = None, buckets: int | None = None,
                limit: int = PAGE_MOST) -> Figures:
        """The newest *buckets* closed buckets (all by default) of every series of *scope* and *subject*.

        Subjects with nothing in the window are left out; at most *limit* series, models first, then
        keys and nodes, each by name.
        """
        self.advance(self.clock.seconds())
        count = self.buckets if buckets is None else max(1, min(int(buckets), self.buckets))
        newest = (self._open if self._open is not None else self.bucket_of(self.clock.seconds())) - 1
        first = newest - count + 1
        chosen = [s for (sc, name), s in self._subjects.items()
                  if (scope is None or sc is scope) and (subject is None or name == subject) and s.newest >= first]
        chosen.sort(key=lambda s: (_SCOPE_ORDER[s.scope], s.name))
        out: list[Series] = []
        for s in chosen:
            for name, unit in _SERIES[s.scope]:
                ring = s.rings.get(name)
                if ring is None and (name, unit) not in _ALWAYS[s.scope]:
                    continue
                if len(out) >= limit:
                    return Figures(self.bucket_s, (newest + 1) * self.bucket_s, out)
                out.append(Series(s.scope, s.name, name, unit, self._points(s, ring, first, newest)))
        return Figures(self.bucket_s, (newest + 1) * self.bucket_s, out)

    def now_figures(self, scope: Scope | None = None, subject: str | None = None) -> Figures:
        """The latest closed bucket alone: what ``llmgw ctl top`` shows."""
        return self.figures(scope, subject, buckets=1)

    def _points(self, s: _Subject, ring: array | None, first: int, newest: int) -> list[float | None]:
        count = newest - first + 1
        low, high = max(first, s.newest - self.buckets + 1), min(newest, s.newest)
        if ring is None or high < low:
            return [None] * count
        n = self.buckets
        a, b = low % n, high % n
        values = ring[a:b + 1] if a <= b else ring[a:] + ring[:b + 1]
        # NaN is unknown: None.  A float32 reads back with its rounding (0.9 as 0.8999999761581421);
        # whoever shows it rounds, as ctl top does, rather than every point of every read here.
        return [None] * (low - first) + [None if v != v else v for v in values.tolist()] + [None] * (newest - high)

    def held(self) -> int:
        """How many series are held now (each ``buckets`` floats)."""
        return sum(len(s.rings) for s in self._subjects.values())
