"""What the router tells Prometheus of answers continued on another engine after theirs failed mid-stream.

``ContinuationMetrics`` holds the families ``llmgw.router.continuing`` counts:
answers continued, those that could not be (with the reason:
``continuation.refusal``'s and ``Delivered.refusal``'s words, or ``off``,
``model_off``, ``attempts``, ``no_replica``), continuations that failed in turn,
and the gap a client saw between the last byte of the failed engine and the
first of the next.  ``RouterMetrics`` registers it as ``metrics.continuation``.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

PREFIX = "llmgw_router_"
# From a reset noticed at once to a stall noticed after router.engines.between_bytes_timeout_s.
GAP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ContinuationMetrics:
    """Continued answers per model, refusals and failures by reason, and the gap each client saw."""

    def __init__(self, registry: CollectorRegistry, label: Callable[[str], str] = lambda model: model):
        self._label = label
        self._continued = Counter(PREFIX + "continued_total",
                                  "Answers whose engine failed mid-stream, continued on another engine.",
                                  ["model"], registry=registry)
        self._not_continuable = Counter(PREFIX + "not_continuable_total",
                                        "Answers whose engine failed mid-stream and that could not be continued, "
                                        "by reason; the client's stream ended with an error.",
                                        ["model", "reason"], registry=registry)
        self._failed = Counter(PREFIX + "continuation_failed_total",
                               "Continuations whose own engine failed before the answer ended, by kind.",
                               ["model", "reason"], registry=registry)
        self._gap = Histogram(PREFIX + "continuation_gap_seconds",
                              "From the failed engine's last byte to the continuation's first token, as the "
                              "client saw it.", ["model"], buckets=GAP_BUCKETS, registry=registry)

    def continued(self, model: str) -> None:
        self._continued.labels(self._label(model)).inc()

    def not_continuable(self, model: str, reason: str) -> None:
        self._not_continuable.labels(self._label(model), reason).inc()

    def failed(self, model: str, reason: str) -> None:
        self._failed.labels(self._label(model), reason).inc()

    def gap(self, model: str, seconds: float) -> None:
        self._gap.labels(self._label(model)).observe(seconds)
