"""The hub's figures on the server's admin listener: what each link limit refused, and the listeners' budgets."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Every limit Hub.refusals counts, so each series exists (at 0) before its first refusal.
LIMITS = ("hello_timeout", "duplicate_node", "subscriptions", "message_depth", "invalid_uri",
          "not_authorized", "protocol_violation")


class LinkCollector(Collector):
    """Reads the hub's counters and each listener's ``ConnectionBudget`` on every collect."""

    def __init__(self, hub, listeners: Mapping[str, object]):
        self._hub = hub
        self._listeners = listeners

    def collect(self) -> Iterator[Metric]:
        refusals = CounterMetricFamily(
            "llmgw_link_refusals", "Messages, sessions and connections the hub refused or ended, by link limit",
            labels=["limit"],
        )
        for limit in sorted(set(LIMITS) | set(self._hub.refusals)):
            refusals.add_metric([limit], self._hub.refusals.get(limit, 0))
        yield refusals
        duplicates = CounterMetricFamily(
            "llmgw_link_duplicate_sessions_refused",
            "Second sessions refused for a node whose first session answered (two agents with one certificate)",
            labels=["node"],
        )
        for node, record in sorted(self._hub.duplicates.items()):
            duplicates.add_metric([node], record.count)
        yield duplicates
        held = GaugeMetricFamily("llmgw_listener_connections", "Connections a listener holds now", labels=["listener"])
        limit = GaugeMetricFamily("llmgw_listener_connection_limit", "The most connections a listener holds",
                                  labels=["listener"])
        refused = CounterMetricFamily("llmgw_listener_connections_refused",
                                      "Connections closed as they arrived because the listener was full",
                                      labels=["listener"])
        for name, budget in sorted(self._listeners.items()):
            held.add_metric([name], budget.held)
            limit.add_metric([name], budget.limit)
            refused.add_metric([name], budget.refused)
        yield from (held, limit, refused)
