"""The fair-share families: stalls cut per model, queue waits per key."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmgw.router.fairmetrics import FairMetrics


def test_stalls_and_key_waits_are_counted_under_their_labels():
    registry = CollectorRegistry()
    fair = FairMetrics(registry, label=lambda model: model.upper())
    fair.stall_cut("qwen")
    fair.stall_cut("qwen")
    fair.key_queue_wait("team-a", 0.3)
    assert registry.get_sample_value("llmgw_router_client_stalls_cut_total", {"model": "QWEN"}) == 2
    assert registry.get_sample_value("llmgw_router_key_queue_wait_seconds_count", {"key": "team-a"}) == 1
    assert registry.get_sample_value("llmgw_router_key_queue_wait_seconds_bucket", {"key": "team-a", "le": "0.5"}) == 1
