"""The held-request families, read back the way Prometheus would see them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmgw.router.elasticmetrics import HELD_BUCKETS, ElasticMetrics
from llmgw.router.metrics import RouterMetrics


def test_held_requests_their_time_and_timeouts_are_counted_per_model():
    registry = CollectorRegistry()
    metrics = ElasticMetrics(registry)
    metrics.held("qwen", 3)
    metrics.held_for("qwen", 41.0)
    metrics.held_for("qwen", 700.0)
    metrics.cold_start_timeout("qwen")
    value = registry.get_sample_value
    assert value("llmgw_router_held_requests", {"model": "qwen"}) == 3
    assert value("llmgw_router_held_seconds_bucket", {"model": "qwen", "le": "45.0"}) == 1
    assert value("llmgw_router_held_seconds_bucket", {"model": "qwen", "le": "600.0"}) == 1
    assert value("llmgw_router_held_seconds_count", {"model": "qwen"}) == 2
    assert value("llmgw_router_cold_start_timeouts_total", {"model": "qwen"}) == 1
    assert HELD_BUCKETS[-1] == 600.0


def test_the_router_registers_them_with_its_model_label_hygiene():
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    metrics.set_models(["qwen"])
    metrics.elastic.held("made-up-by-a-client", 1)
    assert registry.get_sample_value("llmgw_router_held_requests", {"model": "unknown"}) == 1
