"""What one router's report can make the control plane do: no more than the catalog allows, one pass at a time.

A router is an authenticated peer, but what it says is a claim: models the
catalog does not have, endpoints that are not the catalog's replicas, more
requests held than ``max_held`` lets it hold, and urgent reports sent many
times a second are each a guard here.
"""

from __future__ import annotations

import pytest_twisted
from twisted.internet import task

from llmgw.config.catalog import Model, Profile
from llmgw.config.scale import Scale
from llmgw.control.catalog import Entry
from llmgw.control.elastic import Elastic
from llmgw.control.scaling import PASS_GAP_S, Scaling, within_catalog
from llmgw.link import uris
from llmgw.roles import ROLE_ROUTER
from llmgw.traffic import EndpointLoad, KeyCounts, ModelCounts, ModelLoad, RouterLoad
from llmgw.wire import to_wire
from tests.control.test_plane import clock, plane  # noqa: F401  (fixtures)


def catalog(**models):
    return {name: Entry(model, Profile(name="sim", engine="sim"), "f") for name, model in models.items()}


def models():
    return catalog(
        qwen=Model(name="qwen", profile="sim", replicas=3, scale=Scale(min=0, max=3, max_held=8)),
        warm=Model(name="warm", profile="sim", replicas=2, scale=Scale(min=1, max=2)),
        fixed=Model(name="fixed", profile="sim", replicas=1),
    )


def test_models_endpoints_and_counts_the_catalog_does_not_have_are_left_out():
    report = RouterLoad(
        "r", [ModelLoad("qwen", inflight=1), ModelLoad("invented", held=5, idle_s=0.0)],
        [EndpointLoad("qwen/2", 1), EndpointLoad("qwen/3", 1), EndpointLoad("invented/0", 1),
         EndpointLoad("qwen", 1), EndpointLoad("static:qwen:http://x", 1)],
        [ModelCounts("qwen", requests=3), ModelCounts("invented", requests=2**53)],
        [KeyCounts("alice", 1)], urgent=True)
    kept = within_catalog(report, models())
    assert [m.model for m in kept.models] == ["qwen"]
    assert [e.id for e in kept.endpoints] == ["qwen/2"]
    assert [c.model for c in kept.counts] == ["qwen"]
    assert kept.keys == report.keys and kept.urgent and kept.router == "r"


def test_requests_held_are_at_most_max_held_and_none_for_a_model_that_does_not_start_on_demand():
    report = RouterLoad("r", [ModelLoad("qwen", held=1_000_000), ModelLoad("warm", held=5),
                              ModelLoad("fixed", held=5, queued=2)])
    kept = {m.model: m for m in within_catalog(report, models()).models}
    assert kept["qwen"].held == 8
    assert kept["warm"].held == 0 and kept["fixed"].held == 0
    assert kept["fixed"].queued == 2
    twice = within_catalog(RouterLoad("r", [ModelLoad("qwen", held=8)] * 1000), models())
    assert [m.held for m in twice.models] == [8]


def test_a_report_within_the_catalog_is_handed_on_as_it_came():
    report = RouterLoad("r", [ModelLoad("qwen", held=3)], [EndpointLoad("qwen/0", 1)], [ModelCounts("qwen", 1)])
    assert within_catalog(report, models()) is report


class FakeSession:
    """What Scaling reads of the control session."""

    def __init__(self, clock, entries):
        self._clock = clock
        self.catalog = type("Catalog", (), {"entries": entries})()
        self.load_listeners = []
        self.event_listeners = []
        self.passes = 0
        elastic = Elastic()
        session = self

        class Reconciler:
            def tick(self):
                session.passes += 1

        self.reconciler = Reconciler()
        self.reconciler.elastic = elastic

    def is_attached(self):
        return True

    def publish_endpoints(self):
        pass


def test_a_flood_of_urgent_reports_runs_one_pass_per_gap_not_one_per_report():
    clock = task.Clock()
    session = FakeSession(clock, models())
    scaling = Scaling(session)
    urgent = RouterLoad("r", [ModelLoad("qwen", held=1)], urgent=True)
    for _ in range(100):
        scaling.deliver(urgent, "router01#1")
        clock.advance(0)
    assert session.passes == 1  # the first at once: a cold start does not wait
    for _ in range(100):
        scaling.deliver(urgent, "router01#1")
        clock.advance(PASS_GAP_S / 10)
    assert session.passes <= 1 + 10 + 1  # 100 reports over ten gaps: a pass a gap
    clock.advance(PASS_GAP_S)
    passes = session.passes
    clock.advance(10 * PASS_GAP_S)
    assert session.passes == passes  # nothing asked since: nothing more runs


def test_demand_keeps_only_the_catalogs_models_and_caps_what_is_held():
    clock = task.Clock()
    session = FakeSession(clock, models())
    Scaling(session).deliver(RouterLoad("r", [ModelLoad(f"m{i}", held=1, idle_s=0.0) for i in range(1000)]
                                        + [ModelLoad("qwen", held=10**6, idle_s=0.0)]), "router01#1")
    demand = session.reconciler.elastic.demand
    assert set(demand.models) == {"qwen"} and demand.model("qwen").held == 8
    assert demand.model("m1").last_request_at is None


@pytest_twisted.ensureDeferred
async def test_over_the_hub_a_report_naming_invented_models_wakes_none_of_them(plane):
    plane.catalog = type("Catalog", (), {"entries": models()})()
    router = await plane.attach("router01", ROLE_ROUTER)
    report = RouterLoad("r", [ModelLoad("invented", held=50), ModelLoad("warm", held=50)],
                        [EndpointLoad("fixed/7", 3)])
    await router.call(uris.ROUTER_LOAD, to_wire(report))
    demand = plane.reconciler.elastic.demand
    assert demand.model("invented").held == 0 and demand.model("warm").held == 0
    assert demand.inflight("fixed/7") == 0
