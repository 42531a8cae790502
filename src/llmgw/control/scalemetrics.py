"""Elastic replicas' figures for /metrics, read from the scaler at scrape time.

``llmgw_scale_events_total{model, event}`` counts the scaler's decisions —
``cold start``, ``up``, ``down``, ``sleep`` and ``evicted`` — since the server
started; ``llmgw_replicas_wanted{model}`` is each elastic model's count now
(a fixed model's is its ``replicas``, and is not emitted).  The held requests
and their seconds are the routers' (``llmgw_router_held_*``).
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.control.scaler import Scaler

#: Every decision the scaler counts, emitted at zero for each elastic model so an alert need not wait for the first.
EVENTS = ("cold start", "up", "down", "sleep", "evicted")


class ScaleCollector(Collector):
    def __init__(self, scaler: Scaler):
        self.scaler = scaler

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily("llmgw_scale_events", "Elastic replicas' decisions, by model and event: "
                                     "cold start, up, down, sleep, evicted.", labels=["model", "event"])
        wanted = GaugeMetricFamily("llmgw_replicas_wanted", "Replicas an elastic model wants now (its scaler's count).",
                                   labels=["model"])
        counts = self.scaler.counts
        models = sorted(set(self.scaler.models) | {model for model, _ in counts})
        for model in models:
            for event in EVENTS:
                events.add_metric([model, event], counts.get((model, event), 0))
            target = self.scaler.target(model)
            if target is not None:
                wanted.add_metric([model], target)
        yield events
        yield wanted
