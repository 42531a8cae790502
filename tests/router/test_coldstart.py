"""A request for a model that starts on demand is held, not refused: order, bounds, timeout, and leaving."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from twisted.internet import defer
from twisted.internet.task import Clock

from llmgw.config.routing import Admission, RouterSettings
from llmgw.router import errors
from llmgw.router.coldstart import RETRY_AFTER_S
from llmgw.router.dispatch import Dispatcher, RequestInfo
from llmgw.router.metrics import RouterMetrics
from llmgw.views import ColdStart, EndpointEntry

from .test_dispatch import result, specs

WORDS = "starting on demand: node03: fetching qwen.gguf 41% (12/29 GB)"
QWEN = {"qwen": ColdStart(timeout_s=120, max_held=3)}


def asleep(clock, limit=4, queue=4, metrics=None, elastic=QWEN) -> Dispatcher:
    d = Dispatcher(clock, RouterSettings(admission=Admission(limit, queue, 10.0)), metrics)
    d.set_endpoints([], {"qwen": WORDS}, elastic)
    return d


def held(d, tag: str) -> defer.Deferred:
    return d.admit("qwen", RequestInfo(prefix=tag))


def wake(d, replicas=1, elastic=QWEN) -> None:
    d.set_endpoints(specs(replicas, "qwen"), {}, elastic)


def test_a_request_for_a_sleeping_model_is_held_not_refused_and_goes_through_once_it_has_an_endpoint():
    clock = Clock()
    d = asleep(clock)
    waiting = held(d, "a")
    assert not waiting.called
    assert d.cold.count("qwen") == 1
    clock.advance(119)
    wake(d)
    lease = result(waiting)
    assert lease.endpoint.id == "qwen/0"
    assert d.cold.count("qwen") == 0


def test_held_requests_go_through_in_arrival_order_ahead_of_those_that_come_after():
    clock = Clock()
    d = asleep(clock, limit=1)
    order = []
    for tag in "abc":
        held(d, tag).addCallback(lambda lease, tag=tag: order.append((tag, lease)))
    wake(d)
    # One slot: "a" has it, "b" and "c" wait in the queue before a request that comes now.
    assert [tag for tag, _ in order] == ["a"]
    later = d.admit("qwen", RequestInfo(prefix="later"))
    later.addCallback(lambda lease: order.append(("later", lease)))
    for _ in range(3):
        order[-1][1].release("ok")
    assert [tag for tag, _ in order] == ["a", "b", "c", "later"]


def test_past_max_held_the_next_request_is_503_at_once_saying_how_many_are_held():
    d = asleep(Clock())
    for tag in "abc":
        held(d, tag)
    refused = result(held(d, "d"))
    assert isinstance(refused, errors.NoReadyEndpoint)
    assert refused.status == 503
    assert "holds 3 requests for it already" in refused.message
    assert "scale.max_held: 3" in refused.message and WORDS in refused.message
    assert d.cold.count("qwen") == 3


def test_a_request_held_past_the_timeout_is_503_with_retry_after_and_the_control_planes_words():
    clock = Clock()
    registry = CollectorRegistry()
    d = asleep(clock, metrics=RouterMetrics(registry))
    waiting = held(d, "a")
    clock.advance(119.9)
    assert not waiting.called
    d.set_unavailable("qwen", WORDS.replace("41%", "97%"))
    clock.advance(0.1)
    error = result(waiting)
    assert isinstance(error, errors.NoReadyEndpoint)
    assert error.message == (
        "model 'qwen' has no ready replica: held 120 s while the model starts on demand "
        "(scale.cold_start_timeout_s): starting on demand: node03: fetching qwen.gguf 97% (12/29 GB)")
    assert dict(error.headers)["Retry-After"] == str(int(RETRY_AFTER_S))
    assert d.cold.count("qwen") == 0
    assert registry.get_sample_value("llmgw_router_cold_start_timeouts_total", {"model": "qwen"}) == 1
    assert registry.get_sample_value("llmgw_router_held_seconds_count", {"model": "qwen"}) == 1
    assert registry.get_sample_value("llmgw_router_held_requests", {"model": "qwen"}) == 0


def test_a_held_request_whose_client_goes_away_leaves_at_once_and_frees_its_place():
    clock = Clock()
    d = asleep(clock)
    gone, kept = held(d, "gone"), held(d, "kept")
    gone.addErrback(lambda f: f.trap(defer.CancelledError))
    gone.cancel()
    assert d.cold.count("qwen") == 1
    # Its timer went with it: nothing fires for it at the timeout.
    assert len(clock.getDelayedCalls()) == 1
    wake(d)
    assert result(kept).endpoint.id == "qwen/0"


def test_a_client_gone_after_its_held_request_moved_to_the_queue_leaves_the_queue():
    d = asleep(Clock(), limit=1)
    first, second = held(d, "a"), held(d, "b")
    wake(d)
    assert d.queue_depth("qwen") == 1
    second.addErrback(lambda f: f.trap(defer.CancelledError))
    second.cancel()
    assert d.queue_depth("qwen") == 0
    result(first).release("ok")


def test_a_table_that_no_longer_names_the_model_elastic_fails_its_held_requests_at_once():
    d = asleep(Clock())
    waiting = held(d, "a")
    d.set_endpoints([], {"qwen": "no node can hold it: node01 has 8 GB, needs 24"}, {})
    error = result(waiting)
    assert isinstance(error, errors.NoReadyEndpoint)
    assert "no node can hold it" in error.message
    # And the next request is refused, not held.
    assert isinstance(result(held(d, "b")), errors.NoReadyEndpoint)
    assert d.cold.count("qwen") == 0


def test_an_elastic_model_whose_endpoints_all_fail_is_refused_as_today_not_held():
    d = asleep(Clock(), limit=4)
    wake(d)
    for _ in range(2):
        result(held(d, "x")).release("upstream_failed")
    refused = result(held(d, "y"))
    assert isinstance(refused, errors.NoReadyEndpoint)
    assert "every endpoint is failing" in refused.message
    assert d.cold.count("qwen") == 0


def test_a_model_not_elastic_with_no_endpoint_is_refused_at_once():
    d = asleep(Clock(), elastic={})
    refused = result(held(d, "a"))
    assert isinstance(refused, errors.NoReadyEndpoint) and WORDS in refused.message


def test_the_first_request_held_for_a_model_is_told_once_until_none_is_held():
    d = asleep(Clock())
    told = []
    d.cold.first_held = told.append
    held(d, "a")
    held(d, "b")
    assert told == ["qwen"]
    wake(d)
    d.set_endpoints([], {"qwen": WORDS}, QWEN)
    held(d, "c")
    assert told == ["qwen", "qwen"]


def test_a_sleeping_model_is_listed_by_v1_models():
    d = asleep(Clock())
    assert d.models() == ["qwen"]


def test_a_max_held_of_zero_holds_nothing():
    d = asleep(Clock(), elastic={"qwen": ColdStart(timeout_s=120, max_held=0)})
    assert isinstance(result(held(d, "a")), errors.NoReadyEndpoint)
