"""The dispatcher's table and health: 404 and 503, state kept across tables, failures, cool-down, retries."""

from __future__ import annotations

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from llmgw.config.routing import Admission, RouterSettings
from llmgw.router import errors
from llmgw.router.dispatch import (
    COOLDOWN_S,
    MAX_COOLDOWN_S,
    Dispatcher,
    Endpoint,
    RequestInfo,
)
from llmgw.views import EndpointEntry


def specs(n, model="echo", first_port=8001, host="127.0.0.1"):
    return [
        EndpointEntry(f"{model}/{i}", model, f"http://{host}:{first_port + i}", node_id=f"node0{i + 1}")
        for i in range(n)
    ]


def dispatcher(clock, replicas=2, limit=4, queue=4, metrics=None):
    d = Dispatcher(clock, RouterSettings(admission=Admission(limit, queue, 10.0)), metrics)
    d.set_endpoints(specs(replicas))
    return d


_results: dict[defer.Deferred, list] = {}


def result(d):
    box = _results.get(d)
    if box is None:
        box = _results[d] = []
        d.addBoth(lambda v: box.append(v.value if isinstance(v, Failure) else v))
    return box[0] if box else None


def take(d, model="echo", prefix=""):
    return result(d.admit(model, RequestInfo(prefix=prefix)))


def by_id(d, ident):
    return next(e for e in d.endpoints() if e.id == ident)


def fail_twice(d, ident):
    """Two requests to *ident* that got no answer."""
    for _ in range(2):
        lease = take(d)
        while lease.endpoint.id != ident:
            other = lease
            lease = take(d)
            other.release("ok")
        lease.release("upstream_failed")


# -- the table ---------------------------------------------------------------------------


def test_an_unknown_model_is_404_naming_what_is_served():
    d = dispatcher(Clock())
    d.set_endpoints(specs(1) + specs(1, "gemma", 9001))
    refused = take(d, "gpt-5")
    assert isinstance(refused, errors.UnknownModel) and refused.status == 404
    assert "'gpt-5'" in refused.message and "echo, gemma" in refused.message


def test_a_model_without_replicas_is_503_with_the_placement_reason():
    d = dispatcher(Clock())
    d.set_unavailable("big", "no node can hold it: node05: has 8 GB of memory, needs 24")
    refused = take(d, "big")
    assert isinstance(refused, errors.NoReadyEndpoint) and refused.status == 503
    assert "node05: has 8 GB of memory, needs 24" in refused.message and "'big'" in refused.message
    d.set_unavailable("big", None)
    assert isinstance(take(d, "big"), errors.UnknownModel)


def test_a_model_without_replicas_says_when_to_retry():
    d = dispatcher(Clock())
    d.set_unavailable("big", "its replica is starting")
    assert dict(take(d, "big").headers) == {"Retry-After": "1"}


def test_a_pending_reason_makes_every_model_not_served_503_until_it_is_cleared():
    d = dispatcher(Clock())
    d.set_pending("no endpoint table from the control plane yet")
    refused = take(d, "anything")
    assert isinstance(refused, errors.NoReadyEndpoint)
    assert refused.message == "model 'anything' has no ready replica: no endpoint table from the control plane yet"
    d.set_pending(None)
    assert isinstance(take(d, "anything"), errors.UnknownModel)


def test_a_new_table_can_bring_every_reason_at_once():
    d = dispatcher(Clock())
    d.set_unavailable("old", "gone")
    d.set_endpoints(specs(1), unavailable={"big": "node05: has 8 GB of memory, needs 24"})
    assert "needs 24" in take(d, "big").message
    assert isinstance(take(d, "old"), errors.UnknownModel)
    # A table without reasons keeps the ones it had.
    d.set_endpoints(specs(2))
    assert "needs 24" in take(d, "big").message


def test_models_lists_those_with_a_healthy_endpoint():
    clock = Clock()
    d = dispatcher(clock, replicas=1)
    d.set_endpoints(specs(1) + specs(1, "gemma", 9001))
    assert d.models() == ["echo", "gemma"]
    fail_twice(d, "echo/0")
    assert d.models() == ["gemma"]
    clock.advance(COOLDOWN_S)
    assert d.models() == ["echo", "gemma"]


def test_a_new_table_keeps_the_state_of_endpoints_whose_id_and_address_are_unchanged():
    clock = Clock()
    d = dispatcher(clock, replicas=2)
    held = [take(d) for _ in range(2)]
    assert {lease.endpoint.id for lease in held} == {"echo/0", "echo/1"}
    fail_twice(d, "echo/1")
    kept = by_id(d, "echo/0")
    # echo/1 moved to another port (a restarted engine); echo/2 is new.
    d.set_endpoints(
        [
            EndpointEntry("echo/0", "echo", "http://127.0.0.1:8001", "node01"),
            EndpointEntry("echo/1", "echo", "http://127.0.0.1:8101", "node02"),
            EndpointEntry("echo/2", "echo", "http://127.0.0.1:8003", "node03"),
        ]
    )
    assert by_id(d, "echo/0") is kept and kept.inflight == 1
    moved = by_id(d, "echo/1")
    assert (moved.port, moved.inflight, moved.healthy, moved.consecutive_failures) == (8101, 0, True, 0)
    assert by_id(d, "echo/2").inflight == 0
    # A lease on the old echo/1 still releases cleanly.
    for lease in held:
        lease.release("ok")
    assert kept.inflight == 0 and moved.inflight == 0


def test_an_unchanged_failing_endpoint_stays_out_until_its_cool_down():
    clock = Clock()
    d = dispatcher(clock, replicas=2)
    fail_twice(d, "echo/1")
    d.set_endpoints(specs(2))
    assert not by_id(d, "echo/1").healthy
    clock.advance(COOLDOWN_S)
    assert by_id(d, "echo/1").healthy


def test_a_bad_table_is_refused_whole():
    d = dispatcher(Clock(), replicas=1)
    with pytest.raises(ValueError, match="appears twice"):
        d.set_endpoints(specs(1) + specs(1))
    with pytest.raises(ValueError, match="http://host:port"):
        d.set_endpoints([EndpointEntry("echo/0", "echo", "https://127.0.0.1:8001")])
    assert [e.id for e in d.endpoints()] == ["echo/0"]


def test_endpoints_carry_their_address_and_node():
    d = Dispatcher(Clock(), RouterSettings())
    d.set_endpoints([EndpointEntry("echo/0", "echo", "http://[::1]:8001", "node01")])
    endpoint = d.endpoints("echo")[0]
    assert (endpoint.host, endpoint.port, endpoint.node_id) == ("::1", 8001, "node01")
    assert endpoint.url == "http://[::1]:8001"
    assert Endpoint("x", "m", "10.0.0.5", 80).url == "http://10.0.0.5:80"


# -- health -------------------------------------------------------------------------------


def test_one_failure_does_not_take_an_endpoint_out_but_two_in_a_row_do():
    clock = Clock()
    d = dispatcher(clock, replicas=1)
    take(d).release("upstream_failed")
    endpoint = by_id(d, "echo/0")
    assert endpoint.healthy and endpoint.consecutive_failures == 1
    take(d).release("ok")
    assert endpoint.consecutive_failures == 0
    take(d).release("upstream_failed")
    take(d).release("upstream_failed")
    assert not endpoint.healthy


def test_errors_the_engine_answered_and_clients_leaving_do_not_count_as_failures():
    d = dispatcher(Clock(), replicas=1)
    for outcome in ("error", "client_gone", "error", "client_gone"):
        take(d).release(outcome)
    assert by_id(d, "echo/0").healthy


def test_requests_avoid_an_unhealthy_endpoint_and_it_returns_after_the_cool_down():
    clock = Clock()
    d = dispatcher(clock, replicas=2)
    fail_twice(d, "echo/0")
    for _ in range(4):
        lease = take(d)
        assert lease.endpoint.id == "echo/1"
        lease.release("ok")
    clock.advance(COOLDOWN_S - 0.1)
    assert not by_id(d, "echo/0").healthy
    clock.advance(0.1)
    assert by_id(d, "echo/0").healthy
    assert {take(d).endpoint.id for _ in range(2)} == {"echo/0", "echo/1"}


def test_failing_again_right_after_a_cool_down_doubles_it_and_an_answer_resets_it():
    clock = Clock()
    d = dispatcher(clock, replicas=1)
    endpoint = by_id(d, "echo/0")
    fail_twice(d, "echo/0")
    cooldowns = []
    for _ in range(6):
        cooldowns.append(endpoint.unhealthy_until - clock.seconds())
        clock.advance(endpoint.unhealthy_until - clock.seconds())
        assert endpoint.healthy
        # On probation: one failure is enough.
        take(d).release("upstream_failed")
        assert not endpoint.healthy
    assert cooldowns == [5, 10, 20, 40, 60, 60]
    assert MAX_COOLDOWN_S == 60
    clock.advance(60)
    take(d).release("ok")
    fail_twice(d, "echo/0")
    assert endpoint.unhealthy_until - clock.seconds() == COOLDOWN_S


def test_an_answer_from_an_endpoint_in_cool_down_brings_it_back_at_once():
    clock = Clock()
    d = dispatcher(clock, replicas=2)
    slow = take(d)
    assert slow.endpoint.id == "echo/0"
    fail_twice(d, "echo/0")
    slow.release("ok")  # a request sent before the failures finished fine
    assert by_id(d, "echo/0").healthy


def test_when_every_endpoint_is_failing_the_503_says_so_and_when_they_are_tried_again():
    clock = Clock()
    d = dispatcher(clock, replicas=2)
    fail_twice(d, "echo/0")
    fail_twice(d, "echo/1")
    refused = take(d)
    assert isinstance(refused, errors.NoReadyEndpoint)
    assert "every endpoint is failing (echo/0, echo/1)" in refused.message
    assert "5 s" in refused.message
    # Retry-After says when the first comes back, not a blind second.
    assert dict(refused.headers) == {"Retry-After": "5"}


def test_waiters_get_an_endpoint_back_from_its_cool_down():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1)
    take(d).release("upstream_failed")
    lease = take(d)
    waiter = d.admit("echo", RequestInfo())
    assert result(waiter) is None
    lease.release("upstream_failed")  # the second failure: the slot is free, the endpoint is not
    assert result(waiter) is None
    clock.advance(COOLDOWN_S)
    assert result(waiter).endpoint.id == "echo/0"


# -- leases and retries -------------------------------------------------------------------


def test_release_is_once_only_and_checks_its_outcome():
    d = dispatcher(Clock(), replicas=1)
    lease = take(d)
    with pytest.raises(ValueError, match="upstream_failed"):
        lease.release("timeout")
    lease.release("ok")
    lease.release("ok")
    assert by_id(d, "echo/0").inflight == 0


def test_retry_never_returns_an_endpoint_already_tried():
    clock = Clock()
    d = dispatcher(clock, replicas=3)
    lease = take(d, prefix="same prompt")
    tried = [lease.endpoint.id]
    for attempt in (2, 3):
        lease = result(lease.retry())
        assert lease.endpoint.id not in tried and lease.attempt == attempt
        tried.append(lease.endpoint.id)
    assert lease.retry() is None
    # retry() released each lease it replaced.
    assert sum(e.inflight for e in d.endpoints()) == 0


def test_retry_skips_unhealthy_endpoints_and_says_none_when_only_they_are_left():
    clock = Clock()
    d = dispatcher(clock, replicas=2)
    fail_twice(d, "echo/1")
    lease = take(d)
    assert lease.endpoint.id == "echo/0"
    assert lease.retry() is None


def test_a_retry_waits_for_a_slot_ahead_of_new_requests():
    clock = Clock()
    d = dispatcher(clock, replicas=2, limit=1)
    first, second = take(d), take(d)
    newcomer = d.admit("echo", RequestInfo())
    retried = first.retry()  # frees first's slot, which the newcomer takes
    assert result(newcomer).endpoint is first.endpoint
    assert result(retried) is None
    second.release("ok")
    assert result(retried).endpoint is second.endpoint


def test_the_retry_counts_the_failure_of_the_lease_it_replaces():
    d = dispatcher(Clock(), replicas=2)
    lease = take(d)
    lease.retry().addCallback(lambda again: again.release("ok"))
    assert lease.endpoint.consecutive_failures == 1


def test_metrics_hear_of_decisions_and_the_queue():
    class Recorder:
        def __init__(self):
            self.events = []

        def scored(self, model, decision):
            self.events.append(("scored", model, decision))

        def queue_depth(self, model, n):
            self.events.append(("depth", model, n))

        def queue_wait(self, model, seconds):
            self.events.append(("wait", model, seconds))

    clock = Clock()
    metrics = Recorder()
    d = dispatcher(clock, replicas=1, limit=1, metrics=metrics)
    lease = take(d)
    waiter = d.admit("echo", RequestInfo())
    clock.advance(3)
    lease.release("ok")
    assert result(waiter) is not None
    assert metrics.events == [
        ("scored", "echo", "least_outstanding"),
        ("depth", "echo", 1),
        ("wait", "echo", 3.0),
        ("scored", "echo", "least_outstanding"),
        ("depth", "echo", 0),
    ]


def test_metrics_with_only_scored_are_enough():
    class Scored:
        def scored(self, model, decision):
            pass

    d = dispatcher(Clock(), replicas=1, limit=1, metrics=Scored())
    lease = take(d)
    waiter = d.admit("echo", RequestInfo())
    lease.release("ok")
    assert result(waiter) is not None
