"""What the router tells Prometheus of fair shares: streams cut for a client that stopped reading, waits per key.

``FairMetrics`` is registered by ``RouterMetrics`` in its own registry, with
its model-label hygiene, as ``metrics.fair``; ``stall.StallWatch`` and
``dispatch.Dispatcher`` find it there.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

PREFIX = "llmgw_router_"

# The queue's own buckets: a wait in the queue is at most router.admission.queue_timeout_s (30 s).
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)


class FairMetrics:
    """Streams cut for a stalled client, per model; how long each key's requests waited for a slot."""

    def __init__(self, registry: CollectorRegistry, label: Callable[[str], str] = lambda model: model):
        self._label = label
        self._stalls = Counter(PREFIX + "client_stalls_cut_total",
                               "Streams cut because their client read none of them for router.client_stall_s "
                               "while another request waited for a slot of their model.", ["model"],
                               registry=registry)
        self._key_wait = Histogram(PREFIX + "key_queue_wait_seconds",
                                   "How long an API key's requests waited in a model's queue before a slot "
                                   "(only requests that waited).", ["key"], buckets=WAIT_BUCKETS, registry=registry)

    def stall_cut(self, model: str) -> None:
        self._stalls.labels(self._label(model)).inc()

    def key_queue_wait(self, key_name: str, seconds: float) -> None:
        self._key_wait.labels(key_name).observe(seconds)
