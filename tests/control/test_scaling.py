"""The elastic procedures on a real hub: routers' traffic in, by router certificate only; ``ctl scale``'s answers."""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError

from llmgw.answers import ScaleAnswer
from llmgw.config.catalog import Model, Profile
from llmgw.config.scale import Scale
from llmgw.control.catalog import Entry
from llmgw.link import uris
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER
from llmgw.traffic import ModelLoad, RouterLoad
from llmgw.wire import from_wire, to_wire
from tests.control.test_plane import clock, plane  # noqa: F401  (fixtures)


def serve(plane, **models):
    entries = {name: Entry(model, Profile(name="sim", engine="sim"), "f") for name, model in models.items()}
    plane.catalog = type("Catalog", (), {"entries": entries})()


def qwen():
    return Model(name="qwen", profile="sim", replicas=3, scale=Scale(min=0, max=3))


@pytest_twisted.ensureDeferred
async def test_a_routers_report_is_summed_under_its_own_session_whatever_it_calls_itself(plane):
    serve(plane, qwen=qwen())
    one = await plane.attach("router01", ROLE_ROUTER)
    two = await plane.attach("router01", ROLE_ROUTER)  # a second worker with the same certificate
    for router in (one, two):
        await router.call(uris.ROUTER_LOAD, to_wire(RouterLoad("same-name", [ModelLoad("qwen", inflight=2)])))
    assert plane.reconciler.elastic.demand.model("qwen").inflight == 4


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("role", [ROLE_NODE, ROLE_OPERATOR])
async def test_only_a_router_may_report_traffic(plane, role):
    caller = await plane.attach("node01" if role == ROLE_NODE else "alice", role)
    with pytest.raises(ApplicationError) as e:
        await caller.call(uris.ROUTER_LOAD, to_wire(RouterLoad("x", [ModelLoad("qwen", held=50)])))
    assert e.value.error in (uris.ERROR_NOT_AUTHORIZED, "wamp.error.not_authorized")
    assert plane.reconciler.elastic.demand.model("qwen").held == 0


@pytest_twisted.ensureDeferred
async def test_a_report_past_its_bounds_is_refused_naming_the_field(plane):
    router = await plane.attach("router01", ROLE_ROUTER)
    wire = to_wire(RouterLoad("x", [ModelLoad("qwen")]))
    wire["models"][0]["held"] = -5
    with pytest.raises(ApplicationError) as e:
        await router.call(uris.ROUTER_LOAD, wire)
    assert e.value.error == uris.ERROR_INVALID_ARGUMENT and "held" in e.value.args[0]


@pytest_twisted.ensureDeferred
async def test_ctl_scale_pins_a_count_within_bounds_and_auto_gives_it_back(plane):
    serve(plane, qwen=qwen(), fixed=Model(name="fixed", profile="sim", replicas=2))
    operator = await plane.attach("alice", ROLE_OPERATOR)
    answer = from_wire(ScaleAnswer, await operator.call(uris.CP_SCALE, "qwen", 2))
    assert (answer.min, answer.max, answer.target, answer.pinned) == (0, 3, 2, True)
    assert "until the next reload" in answer.words
    with pytest.raises(ApplicationError, match="between 0 and 3"):
        await operator.call(uris.CP_SCALE, "qwen", 7)
    with pytest.raises(ApplicationError, match=r"fixed 2 replica\(s\).*replicas: \{min: M, max: X\}"):
        await operator.call(uris.CP_SCALE, "fixed", 1)
    with pytest.raises(ApplicationError, match="no model named 'nope'.*models: fixed, qwen"):
        await operator.call(uris.CP_SCALE, "nope", 1)
    with pytest.raises(ApplicationError, match="whole number"):
        await operator.call(uris.CP_SCALE, "qwen", "2")
    answer = from_wire(ScaleAnswer, await operator.call(uris.CP_SCALE, "qwen", None))
    assert answer.pinned is False and plane.reconciler.elastic.scaler.pinned("qwen") is None
