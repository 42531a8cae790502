"""Fair shares between keys and client addresses, driven by a test clock through ``Dispatcher.admit``.

A request "finishes" when the test releases its lease; which waiter a freed
slot goes to is what each test asserts.
"""

from __future__ import annotations

from twisted.internet.task import Clock

from llmgw.config.routing import Admission, APIKey, RouterSettings
from llmgw.router import errors
from llmgw.router.dispatch import Dispatcher, RequestInfo
from llmgw.router.fairqueue import FairQueue
from llmgw.router.keys import hash_token
from llmgw.views import EndpointEntry

from .test_admission import result


def key(name, **kw):
    return APIKey(name=name, sha256=hash_token("tok-" + name), **kw)


def dispatcher(clock, keys=(), slots=2, queue=50, timeout_s=30.0):
    d = Dispatcher(clock, RouterSettings(admission=Admission(slots, queue, timeout_s), keys=tuple(keys)))
    d.set_endpoints([EndpointEntry("m/0", "m", "http://127.0.0.1:8001")])
    return d


def ask(d, who):
    """A request from key *who* (or, on a router without keys, from address *who*), tagged with who sent it."""
    info = RequestInfo(model="m", api_key="tok-" + who, client=who) if not d.open_api else RequestInfo(model="m", client=who)
    deferred = d.admit("m", info)
    return who, deferred


def served_order(d, asked, holding):
    """Release the held leases one at a time and say whose request each freed slot went to."""
    order = []
    pending = list(asked)
    while holding:
        holding.pop(0).release("ok")
        for item in list(pending):
            lease = result(item[1])
            if lease is not None:
                assert not isinstance(lease, Exception), lease
                pending.remove(item)
                order.append(item[0])
                holding.append(lease)
        if not pending:
            break
    return order


def fill(d, who, n):
    leases = [result(ask(d, who)[1]) for _ in range(n)]
    assert all(lease is not None and not isinstance(lease, Exception) for lease in leases)
    return leases


def test_a_key_that_queued_many_does_not_delay_another_keys_one_request_past_one_slot():
    clock = Clock()
    d = dispatcher(clock, [key("flood"), key("calm")])
    holding = fill(d, "flood", 2)
    asked = [ask(d, "flood") for _ in range(10)] + [ask(d, "calm")]
    # The calm key holds no slot: the very next free slot is its, ahead of the ten queued before it.
    assert served_order(d, asked, holding)[:1] == ["calm"]


def test_two_keys_that_both_wait_take_turns():
    clock = Clock()
    d = dispatcher(clock, [key("a"), key("b")], slots=1)
    holding = fill(d, "a", 1)
    asked = [ask(d, "a") for _ in range(4)] + [ask(d, "b") for _ in range(4)]
    assert served_order(d, asked, holding) == ["b", "a", "b", "a", "b", "a", "b", "a"]


def test_three_keys_share_the_slots_in_turn_whatever_order_they_queued_in():
    clock = Clock()
    d = dispatcher(clock, [key("a"), key("b"), key("c")], slots=3)
    holding = fill(d, "a", 3)
    asked = [ask(d, "a") for _ in range(3)] + [ask(d, "b") for _ in range(3)] + [ask(d, "c") for _ in range(3)]
    order = served_order(d, asked, holding)
    assert sorted(order) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    # b and c, holding nothing, go first; from then on each window of three has one of each.
    assert order[:2] == ["b", "c"]
    for i in range(2, 8, 3):
        assert sorted(order[i:i + 3]) == ["a", "b", "c"], order


def test_a_slot_held_by_a_key_counts_against_it_whatever_its_client_does_with_it():
    clock = Clock()
    d = dispatcher(clock, [key("a"), key("b")], slots=4)
    a_leases = fill(d, "a", 3)
    b_leases = fill(d, "b", 1)
    asked = [ask(d, "a"), ask(d, "b"), ask(d, "b")]
    a_leases[0].release("ok")
    # a holds 2 (its unread streams count), b holds 1: b's waiter gets the slot though a's came first.
    assert result(asked[1][1]) is not None and result(asked[0][1]) is None
    assert b_leases


def test_an_interactive_keys_request_goes_before_a_batch_keys_queue():
    clock = Clock()
    d = dispatcher(clock, [key("bulk", priority="batch"), key("chat")], slots=2)
    holding = fill(d, "bulk", 1) + fill(d, "chat", 1)
    asked = [ask(d, "bulk") for _ in range(5)] + [ask(d, "chat") for _ in range(2)]
    assert served_order(d, asked, holding)[:2] == ["chat", "chat"]


def test_batch_keys_get_slots_no_interactive_request_waits_for():
    clock = Clock()
    d = dispatcher(clock, [key("bulk", priority="batch"), key("chat", max_inflight=1)], slots=2)
    holding = fill(d, "chat", 1)
    asked = [ask(d, "chat"), ask(d, "bulk")]
    # chat is at its cap of 1: the free slot goes to the batch key rather than stay empty.
    assert result(asked[1][1]) is not None and result(asked[0][1]) is None
    assert holding


def test_a_key_at_its_cap_waits_while_slots_are_free_and_gets_its_own_back():
    clock = Clock()
    d = dispatcher(clock, [key("capped", max_inflight=2)], slots=8)
    leases = fill(d, "capped", 2)
    third = ask(d, "capped")[1]
    assert result(third) is None and d.queue_depth("m") == 1
    leases[0].release("ok")
    assert result(third) is not None


def test_a_capped_keys_retry_after_counts_its_cap_not_the_models_slots():
    clock = Clock()
    d = dispatcher(clock, [key("capped", max_inflight=1)], slots=8, queue=2, timeout_s=60)
    lease = fill(d, "capped", 1)[0]
    clock.advance(20)
    lease.release("ok")  # requests hold a slot 20 s
    fill(d, "capped", 1)
    ask(d, "capped"), ask(d, "capped")
    refused = result(ask(d, "capped")[1])
    assert isinstance(refused, errors.QueueFull)
    # Three of its own go through its one slot, 20 s each; the model's eight slots would say 8 s.
    assert refused.retry_after_s == 60


def test_a_full_queue_drops_the_newest_waiter_of_the_client_with_the_most_for_one_with_fewer():
    clock = Clock()
    d = dispatcher(clock, [key("flood"), key("calm")], slots=1, queue=4)
    fill(d, "flood", 1)
    flood = [ask(d, "flood")[1] for _ in range(4)]
    calm = ask(d, "calm")[1]
    assert result(calm) is None
    dropped = result(flood[-1])
    assert isinstance(dropped, errors.QueueFull) and "gave its place" in str(dropped)
    assert [result(x) for x in flood[:-1]] == [None] * 3
    # Now flood has 3, calm 1: flood's next is refused, not swapped for its own.
    assert isinstance(result(ask(d, "flood")[1]), errors.QueueFull)


def test_a_cancelled_waiter_leaves_its_flow_at_once_and_the_slot_goes_to_the_next():
    clock = Clock()
    d = dispatcher(clock, [key("a"), key("b")], slots=1)
    lease = fill(d, "a", 1)[0]
    b = ask(d, "b")[1]
    a = ask(d, "a")[1]
    b.cancel()
    assert d.queue_depth("m") == 1
    lease.release("ok")
    assert result(a) is not None


def test_a_retry_goes_before_every_new_request_of_every_key():
    clock = Clock()
    d = dispatcher(clock, [key("a"), key("b")], slots=1)
    d.set_endpoints([EndpointEntry("m/0", "m", "http://127.0.0.1:8001"), EndpointEntry("m/1", "m", "http://127.0.0.1:8002")])
    first = fill(d, "a", 1)[0]
    other = fill(d, "b", 1)[0]
    waiting_b = ask(d, "b")[1]
    # a's request failed on its engine before its first byte: it waits for the other engine, ahead of b's.
    retry = first.retry()
    assert result(waiting_b) is not None  # the slot a's failure freed on m/0 is b's: the retry may not use m/0
    assert result(retry) is None
    other.release("ok")
    assert result(retry).endpoint.id != first.endpoint.id


def test_without_keys_each_client_address_is_a_share():
    clock = Clock()
    d = dispatcher(clock, slots=1)
    holding = fill(d, "10.0.0.1", 1)
    asked = [ask(d, "10.0.0.1") for _ in range(3)] + [ask(d, "10.0.0.2")]
    assert served_order(d, asked, holding)[0] == "10.0.0.2"


def test_a_flow_is_forgotten_once_it_holds_nothing_and_waits_for_nothing():
    clock = Clock()
    d = dispatcher(clock, slots=1)
    for n in range(50):
        lease = fill(d, f"10.0.0.{n}", 1)[0]
        lease.release("ok")
    assert d._queue("m").fair.flows == {}


def test_the_queue_alone_picks_the_flow_holding_least_then_the_one_served_longest_ago():
    fair: FairQueue[str] = FairQueue()
    a, b, c = fair.flow("a", 0, None), fair.flow("b", 0, None), fair.flow("c", 1, None)
    a.held, b.held = 2, 2
    for flow, w in ((a, "a1"), (b, "b1"), (c, "c1")):
        fair.push(flow, w)
    assert fair.pick() is a
    fair.served(a)
    assert fair.pick() is b
    b.held = 3
    assert fair.pick() is a
    fair.remove(a, "a1")
    fair.remove(b, "b1")
    assert fair.pick() is c
    assert fair.depth == 1
