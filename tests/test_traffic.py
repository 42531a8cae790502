"""A router's traffic report crosses the link whole, and one past its bounds is refused naming the field."""

import pytest

from llmgw.traffic import TTFT_BUCKETS_MS, EndpointLoad, KeyCounts, ModelCounts, ModelLoad, RouterLoad
from llmgw.wire import WireError, from_wire, to_wire


def report(**model) -> RouterLoad:
    load = ModelLoad("qwen", **model)
    counts = ModelCounts("qwen", 3, 40, 50, {"5xx": 1}, [1] * (len(TTFT_BUCKETS_MS) + 1))
    return RouterLoad("server", [load], [EndpointLoad("qwen/0", 2)], [counts], [KeyCounts("alice", 3, 90)])


def test_a_report_comes_back_as_it_was_sent():
    sent = report(inflight=2, queued=1, held=4, idle_s=1.5, engine_waiting=None)
    assert from_wire(RouterLoad, to_wire(sent)) == sent


@pytest.mark.parametrize("field,value", [("inflight", -1), ("held", 10**7), ("idle_s", float("nan"))])
def test_a_figure_past_its_bound_is_refused_by_name(field, value):
    wire = to_wire(report())
    wire["models"][0][field] = value
    with pytest.raises(WireError, match=field):
        from_wire(RouterLoad, wire)


def test_more_ttft_buckets_than_there_are_is_refused():
    wire = to_wire(report())
    wire["counts"][0]["ttft_ms"] = [0] * (len(TTFT_BUCKETS_MS) + 2)
    with pytest.raises(WireError, match="ttft_ms"):
        from_wire(RouterLoad, wire)
