"""Admission, driven by a test clock: the in-flight limit, the FIFO queue, its refusals and cancellation.

Everything goes through ``Dispatcher.admit`` as the HTTP path calls it; a
request "finishes" when the test releases its lease.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from llmgw.config.routing import Admission, RouterSettings
from llmgw.router import errors
from llmgw.router.admission import retry_after_s
from llmgw.router.dispatch import Dispatcher, RequestInfo
from llmgw.views import EndpointEntry


def dispatcher(clock, replicas=1, limit=2, queue=3, timeout_s=10.0, model="echo", metrics=None):
    d = Dispatcher(clock, RouterSettings(admission=Admission(limit, queue, timeout_s)), metrics)
    d.set_endpoints(specs(replicas, model))
    return d


def specs(n, model="echo", first_port=8001):
    return [EndpointEntry(f"{model}/{i}", model, f"http://127.0.0.1:{first_port + i}") for i in range(n)]


_results: dict[defer.Deferred, list] = {}


def result(d: defer.Deferred):
    """What *d* fired with: the lease, the exception, or ``None`` while it has not fired."""
    box = _results.get(d)
    if box is None:
        box = _results[d] = []
        d.addBoth(lambda v: box.append(v.value if isinstance(v, Failure) else v))
    return box[0] if box else None


def admit(d, model="echo", **kw):
    return d.admit(model, RequestInfo(**kw))


def test_each_endpoint_takes_at_most_its_limit_and_the_rest_wait():
    clock = Clock()
    d = dispatcher(clock, replicas=2, limit=2, queue=5)
    leases = [result(admit(d)) for _ in range(4)]
    assert all(lease is not None and not isinstance(lease, Exception) for lease in leases)
    assert sorted(e.inflight for e in d.endpoints("echo")) == [2, 2]
    waiting = admit(d)
    assert result(waiting) is None
    assert d.queue_depth("echo") == 1


def test_a_release_hands_its_slot_to_the_oldest_waiter_only():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5)
    first = result(admit(d))
    waiters = [admit(d, prefix=str(i)) for i in range(3)]
    first.release("ok")
    fired = [result(w) for w in waiters]
    assert fired[0] is not None and fired[1] is None and fired[2] is None
    assert fired[0].endpoint.inflight == 1
    fired[0].release("ok")
    assert result(waiters[1]) is not None and result(waiters[2]) is None
    assert d.queue_depth("echo") == 1


def test_new_requests_queue_behind_waiters_even_when_a_slot_was_just_freed():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5)
    lease = result(admit(d))
    waiter = admit(d)
    lease.release("ok")
    latecomer = admit(d)
    assert result(waiter) is not None
    assert result(latecomer) is None


def test_queue_full_is_429_with_retry_after_from_how_fast_requests_finish():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=2, timeout_s=30)
    # Requests have been holding their slot 4 s each.
    for _ in range(3):
        lease = result(admit(d))
        clock.advance(4)
        lease.release("ok")
    result(admit(d))
    admit(d), admit(d)
    refused = result(admit(d))
    assert isinstance(refused, errors.QueueFull)
    assert refused.status == 429
    # Two waiting, one slot, 4 s each.
    assert refused.retry_after_s == 8
    assert dict(refused.headers)["Retry-After"] == "8"
    assert "queue is full" in refused.message and "'echo'" in refused.message


def test_a_queue_of_zero_refuses_as_soon_as_every_slot_is_taken():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=0)
    result(admit(d))
    refused = result(admit(d))
    assert isinstance(refused, errors.QueueFull)
    assert refused.retry_after_s >= 1


def test_a_waiter_times_out_after_queue_timeout_s_with_retry_after():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5, timeout_s=10)
    result(admit(d))
    waiter = admit(d)
    clock.advance(9.9)
    assert result(waiter) is None
    clock.advance(0.2)
    timed_out = result(waiter)
    assert isinstance(timed_out, errors.QueueTimeout)
    assert timed_out.status == 429
    assert isinstance(timed_out.retry_after_s, int) and timed_out.retry_after_s >= 1
    assert "10 s" in timed_out.message
    assert d.queue_depth("echo") == 0


def test_a_cancelled_waiter_leaves_the_queue_and_the_slot_goes_to_the_next():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5)
    lease = result(admit(d))
    gone, next_one = admit(d), admit(d)
    gone.cancel()
    assert isinstance(result(gone), defer.CancelledError)
    assert d.queue_depth("echo") == 1
    lease.release("client_gone")
    assert result(next_one) is not None
    # The cancelled waiter's timer went with it.
    clock.advance(60)
    assert d.queue_depth("echo") == 0


def test_a_cancelled_waiter_frees_its_place_for_a_new_one():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=1)
    result(admit(d))
    waiter = admit(d)
    assert isinstance(result(admit(d)), errors.QueueFull)
    waiter.cancel()
    assert isinstance(result(waiter), defer.CancelledError)
    assert result(admit(d)) is None  # queued, not refused


def test_waiters_fail_at_once_when_the_model_loses_every_endpoint():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5)
    result(admit(d))
    waiter = admit(d)
    d.set_endpoints([], unavailable={"echo": "node01: is unreachable"})
    failed = result(waiter)
    assert isinstance(failed, errors.NoReadyEndpoint)
    assert "node01: is unreachable" in failed.message


def test_a_new_endpoint_takes_waiters_at_once():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5)
    result(admit(d))
    waiter = admit(d)
    d.set_endpoints(specs(2))
    lease = result(waiter)
    assert lease.endpoint.id == "echo/1"
    assert lease.queued_s == 0.0


def test_a_lease_says_how_long_it_waited():
    clock = Clock()
    d = dispatcher(clock, replicas=1, limit=1, queue=5)
    lease = result(admit(d))
    waiter = admit(d)
    clock.advance(2.5)
    lease.release("ok")
    assert result(waiter).queued_s == pytest.approx(2.5)


def test_models_do_not_share_slots_or_queues():
    clock = Clock()
    d = Dispatcher(clock, RouterSettings(admission=Admission(1, 5, 10.0)))
    d.set_endpoints(specs(1, "a") + specs(1, "b", first_port=9001))
    result(admit(d, "a"))
    assert result(admit(d, "b")) is not None
    assert result(admit(d, "a")) is None
    assert d.queue_depth("a") == 1 and d.queue_depth("b") == 0


@pytest.mark.parametrize(
    "ahead, slots, service_s, ceiling, expected",
    [
        (2, 1, 4.0, 30, 8),
        (10, 4, 1.0, 30, 3),  # 2.5 s rounds up
        (1, 16, 0.01, 30, 1),  # never under 1 s
        (500, 1, 10.0, 30, 30),  # never past the queue's own timeout
        (3, 1, None, 30, 3),  # no request has finished yet: 1 s each
        (3, 0, 2.0, 12.5, 13),  # no slot at all
    ],
)
def test_retry_after_estimate(ahead, slots, service_s, ceiling, expected):
    assert retry_after_s(ahead, slots, service_s, ceiling) == expected


# -- Hypothesis: random traffic never breaks the limit or loses a waiter ---------


class AdmissionMachine(RuleBasedStateMachine):
    """Admit, release (every outcome), cancel, time out, add and drop endpoints, in any order."""

    @initialize(limit=st.integers(1, 3), queue=st.integers(0, 4), replicas=st.integers(1, 3))
    def start(self, limit, queue, replicas):
        self.clock = Clock()
        self.limit = limit
        self.d = Dispatcher(self.clock, RouterSettings(admission=Admission(limit, queue, 5.0)))
        self.replicas = replicas
        self.d.set_endpoints(specs(replicas))
        self.leases = []  # held, not yet released
        self.pending = []  # (order, Deferred) still waiting
        self.served_order = []
        self.order = 0

    def _settle(self):
        still = []
        for order, waiter in self.pending:
            value = result(waiter)
            if value is None:
                still.append((order, waiter))
            elif isinstance(value, Exception):
                assert isinstance(
                    value, (errors.QueueTimeout, errors.NoReadyEndpoint, defer.CancelledError)
                ), value
            else:
                self.leases.append(value)
                self.served_order.append(order)
        self.pending = still

    @rule(prefix=st.sampled_from(["", "a", "bb"]))
    def admit(self, prefix):
        d = self.d.admit("echo", RequestInfo(prefix=prefix))
        value = result(d)
        if value is None:
            self.order += 1
            self.pending.append((self.order, d))
        elif isinstance(value, Exception):
            assert isinstance(value, (errors.QueueFull, errors.NoReadyEndpoint, errors.UnknownModel)), value
        else:
            self.leases.append(value)
        self._settle()

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 100), outcome=st.sampled_from(["ok", "error", "client_gone", "upstream_failed"]))
    def release(self, i, outcome):
        lease = self.leases.pop(i % len(self.leases))
        lease.release(outcome)
        self._settle()

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 100))
    def retry(self, i):
        lease = self.leases.pop(i % len(self.leases))
        d = lease.retry()
        if d is not None:
            value = result(d)
            if value is None:
                self.pending.append((0, d))  # a retry: not in the FIFO order of new requests
            elif not isinstance(value, Exception):
                assert value.endpoint.id != lease.endpoint.id
                self.leases.append(value)
        self._settle()

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 100))
    def cancel(self, i):
        _, waiter = self.pending[i % len(self.pending)]
        waiter.cancel()
        self._settle()

    @rule(seconds=st.sampled_from([0.5, 2.0, 6.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)
        self._settle()

    @rule(replicas=st.integers(0, 3))
    def reannounce(self, replicas):
        self.d.set_endpoints(specs(replicas))
        self._settle()

    @invariant()
    def never_over_the_limit(self):
        for endpoint in self.d.endpoints("echo"):
            assert 0 <= endpoint.inflight <= self.limit

    @invariant()
    def inflight_counts_the_leases_held(self):
        held = {}
        for lease in self.leases:
            held[lease.endpoint] = held.get(lease.endpoint, 0) + 1
        for endpoint in self.d.endpoints("echo"):
            assert endpoint.inflight == held.get(endpoint, 0)

    @invariant()
    def every_pending_waiter_is_in_the_queue(self):
        assert self.d.queue_depth("echo") == len(self.pending)

    @invariant()
    def nobody_waits_while_a_slot_is_free(self):
        if any(order for order, _ in self.pending):
            free = [e for e in self.d.endpoints("echo") if e.healthy and e.inflight < self.limit]
            assert not free

    @invariant()
    def new_requests_are_served_in_order(self):
        fresh = [o for o in self.served_order if o]
        assert fresh == sorted(fresh)


AdmissionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestAdmissionNeverOverflowsNorLosesAWaiter = AdmissionMachine.TestCase
