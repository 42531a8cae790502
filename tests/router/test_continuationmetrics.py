"""The continuation families, read back the way Prometheus would see them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmgw.router.continuationmetrics import ContinuationMetrics
from llmgw.router.metrics import RouterMetrics


def test_continued_refused_failed_and_the_gap_are_counted_per_model_and_reason():
    registry = CollectorRegistry()
    metrics = ContinuationMetrics(registry)
    metrics.continued("qwen")
    metrics.gap("qwen", 0.03)
    metrics.not_continuable("qwen", "tool_call")
    metrics.failed("qwen", "reset")
    value = registry.get_sample_value
    assert value("llmgw_router_continued_total", {"model": "qwen"}) == 1
    assert value("llmgw_router_continuation_gap_seconds_bucket", {"model": "qwen", "le": "0.05"}) == 1
    assert value("llmgw_router_continuation_gap_seconds_bucket", {"model": "qwen", "le": "0.025"}) == 0
    assert value("llmgw_router_not_continuable_total", {"model": "qwen", "reason": "tool_call"}) == 1
    assert value("llmgw_router_continuation_failed_total", {"model": "qwen", "reason": "reset"}) == 1


def test_the_router_registers_them_with_its_model_label_hygiene():
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    metrics.set_models(["qwen"])
    metrics.continuation.continued("made-up-by-a-client")
    assert registry.get_sample_value("llmgw_router_continued_total", {"model": "unknown"}) == 1
