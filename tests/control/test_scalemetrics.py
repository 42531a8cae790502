"""The scaler's decisions on /metrics: every event at zero for each elastic model, counted as they happen."""

from prometheus_client import CollectorRegistry, generate_latest

from llmgw.config.scale import Scale
from llmgw.control.demand import Demand
from llmgw.control.scalemetrics import ScaleCollector
from llmgw.control.scaler import Scaler
from llmgw.traffic import ModelLoad, RouterLoad


def test_a_cold_start_is_counted_and_the_wanted_count_shown():
    demand = Demand()
    scaler = Scaler(demand)
    registry = CollectorRegistry()
    registry.register(ScaleCollector(scaler))
    assert b"llmgw_scale_events_total{" not in generate_latest(registry)
    policy = Scale(min=0, max=2)
    scaler.wanted("qwen", policy, 0, 0, True, 1.0)
    text = generate_latest(registry).decode()
    assert 'llmgw_scale_events_total{event="cold start",model="qwen"} 0.0' in text
    assert 'llmgw_replicas_wanted{model="qwen"} 0.0' in text
    demand.report(RouterLoad("r", [ModelLoad("qwen", held=1)]), "r", 2.0)
    scaler.wanted("qwen", policy, 0, 0, True, 2.0)
    text = generate_latest(registry).decode()
    assert 'llmgw_scale_events_total{event="cold start",model="qwen"} 1.0' in text
    assert 'llmgw_replicas_wanted{model="qwen"} 1.0' in text
