"""The routers' reports, summed: per model, per endpoint, kept for a while, and drained only when every router says so."""

import pytest

from llmgw.control.demand import MAX_ROUTERS, Demand, TooManyRouters
from llmgw.traffic import REPORT_INTERVAL_S, REPORT_LIFETIME_S, EndpointLoad, ModelLoad, RouterLoad


def load(router="r1", inflight=0, queued=0, held=0, idle_s=None, engine_waiting=None, endpoints=()):
    return RouterLoad(router, [ModelLoad("qwen", inflight, queued, held, idle_s, engine_waiting)],
                      [EndpointLoad(e, n) for e, n in endpoints])


def test_two_routers_reports_add_up_and_a_silent_one_is_forgotten():
    demand = Demand()
    demand.report(load(inflight=2, held=1, endpoints=[("qwen/0", 2)]), "a", 100.0)
    demand.report(load(inflight=1, queued=3, engine_waiting=4, endpoints=[("qwen/0", 1)]), "b", 100.5)
    qwen = demand.model("qwen")
    assert (qwen.inflight, qwen.queued, qwen.held, qwen.engine_waiting) == (3, 3, 1, 4)
    assert qwen.busy == 11 and qwen.waiting == 4
    assert demand.inflight("qwen/0") == 3
    demand.expire(100.0 + REPORT_LIFETIME_S + 0.1)
    assert demand.model("qwen").inflight == 1 and len(demand) == 1


def test_no_engine_figure_stays_unknown_not_zero():
    demand = Demand()
    demand.report(load(inflight=1), "a", 1.0)
    assert demand.model("qwen").engine_waiting is None


def test_the_last_request_is_the_newest_any_router_saw_and_outlives_its_report():
    demand = Demand()
    demand.report(load(idle_s=30.0), "a", 100.0)
    demand.report(load(idle_s=5.0), "b", 100.0)
    demand.report(load(idle_s=50.0), "a", 101.0)
    assert demand.model("qwen").last_request_at == 95.0
    demand.expire(1000.0)
    assert demand.model("qwen").last_request_at == 95.0
    demand.forget(set())
    assert demand.model("qwen").last_request_at is None


def test_drained_needs_a_report_from_every_router_a_full_interval_after_the_drain_began():
    demand = Demand()
    demand.report(load(endpoints=[("qwen/0", 0)]), "a", 10.0)
    demand.report(load(endpoints=[("qwen/0", 0)]), "b", 10.0)
    assert not demand.drained("qwen/0", since=10.0)  # these may predate the table without it
    demand.report(load(endpoints=[("qwen/0", 0)]), "a", 10.0 + REPORT_INTERVAL_S)
    assert not demand.drained("qwen/0", since=10.0)  # b has not said yet
    demand.report(load(endpoints=[("qwen/0", 1)]), "b", 11.5)
    assert not demand.drained("qwen/0", since=10.0)  # b still has one on it
    demand.report(load(endpoints=[]), "b", 12.0)
    assert demand.drained("qwen/0", since=10.0)


def test_with_no_router_at_all_nothing_can_be_in_flight():
    assert Demand().drained("qwen/0", since=0.0)


def test_more_routers_than_the_bound_are_refused_until_one_lapses():
    demand = Demand()
    for n in range(MAX_ROUTERS):
        demand.report(load(), f"r{n}", 0.0)
    with pytest.raises(TooManyRouters):
        demand.report(load(), "one-more", 1.0)
    demand.report(load(), "one-more", REPORT_LIFETIME_S + 1)  # the others lapsed meanwhile
    assert len(demand) == 1


def test_a_router_that_no_longer_lists_the_replica_has_applied_the_table_and_has_nothing_on_it():
    demand = Demand()
    demand.report(load(endpoints=[("qwen/0", 0)]), "a", 10.0)
    demand.report(load(endpoints=[("qwen/0", 0), ("qwen/1", 0)]), "a", 10.2)
    assert not demand.drained("qwen/0", since=10.0)  # listed: its table may still route there
    demand.report(load(endpoints=[("qwen/1", 0)]), "a", 10.3)
    assert demand.drained("qwen/0", since=10.0)
    demand.report(load(endpoints=[("qwen/0", 2)]), "a", 10.4)  # departed, with two streams still on it
    assert not demand.drained("qwen/0", since=10.0)


class Counted(list):
    """A report's list that counts how often it is read through."""

    reads = 0

    def __iter__(self):
        Counted.reads += 1
        return super().__iter__()


def test_a_report_costs_its_own_size_not_every_routers_reports_again():
    demand = Demand()
    Counted.reads = 0
    for i in range(200):
        demand.report(RouterLoad("r", Counted([ModelLoad("qwen", inflight=1)]), Counted()), f"router{i}", 1.0)
    assert Counted.reads <= 2 * 200  # each read once or twice as it comes, not again for each later report
    assert demand.model("qwen").inflight == 200 and demand.inflight("qwen/0") == 0
    assert Counted.reads <= 2 * 200 + 2 * 200  # and summed once when asked
    demand.model("qwen")
    demand.inflight("qwen/0")
    assert Counted.reads <= 4 * 200  # not again while nothing new came


def test_one_certificate_cannot_take_every_routers_place():
    from llmgw.control.demand import MAX_PER_CERTIFICATE

    demand = Demand()
    for n in range(MAX_PER_CERTIFICATE):
        demand.report(load(), f"router01#{n}", 0.0)
    with pytest.raises(TooManyRouters, match="sessions of router router01"):
        demand.report(load(), "router01#extra", 0.0)
    demand.report(load(), "router02#1", 0.0)  # another certificate still reports
    assert len(demand) == MAX_PER_CERTIFICATE + 1
