"""What the router tells Prometheus of models that start on demand, and what its load report reads of the rest.

``ElasticMetrics`` holds the families of held requests (``coldstart.py``):
how many are held now, how long each was held, and how many waited past
``scale.cold_start_timeout_s``.  ``RouterMetrics`` registers it in its own
registry, with its own model-label hygiene, as ``metrics.elastic``.

``Counted`` names the ``RouterMetrics`` families the load report
(``loadreport.py``) sums each second, so a request is counted once, on the
path that already counts it, and the report reads the counters rather than
keeping a second set.
"""

from __future__ import annotations

from typing import Callable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "llmgw_router_"

# From a request held for a moment (a replica ready as it arrived) to a long weights fetch.
HELD_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)


@attrs.frozen
class Counted:
    """The counters the load report sums: prometheus_client families, read with their public ``collect()``."""

    # Called first: adds what RouterMetrics tallied since the last scrape (key counts).
    flush: Callable[[], None]
    requests: Counter  # model, path, status
    tokens: Counter  # model, kind
    ttft: Histogram  # model
    upstream_errors: Counter  # model, endpoint, kind
    key_requests: Counter  # key, model
    key_tokens: Counter  # key, kind


class ElasticMetrics:
    """Held requests per model: a gauge, a histogram of how long, and the timeouts."""

    def __init__(self, registry: CollectorRegistry, label: Callable[[str], str] = lambda model: model):
        self._label = label
        self._held = Gauge(PREFIX + "held_requests", "Requests held now while their model starts on demand.",
                           ["model"], registry=registry)
        self._held_seconds = Histogram(PREFIX + "held_seconds",
                                       "How long requests were held while their model started on demand "
                                       "(served, timed out or gone).", ["model"], buckets=HELD_BUCKETS,
                                       registry=registry)
        self._timeouts = Counter(PREFIX + "cold_start_timeouts_total",
                                 "Held requests answered 503 because their model did not start within "
                                 "scale.cold_start_timeout_s.", ["model"], registry=registry)

    def held(self, model: str, n: int) -> None:
        self._held.labels(self._label(model)).set(n)

    def held_for(self, model: str, seconds: float) -> None:
        self._held_seconds.labels(self._label(model)).observe(seconds)

    def cold_start_timeout(self, model: str) -> None:
        self._timeouts.labels(self._label(model)).inc()
