"""Onboarding asks the control plane for the one node it names (``llmgw.cp.node``), never for the whole fleet.

The whole list of ten thousand nodes does not fit one link message, and
onboarding asked for it twice a second while a node registered.  These
tests count what onboarding asks of a control plane holding that many.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import ComponentConfig
from twisted.internet import reactor

from llmgw.ctl.onboard import _wait_registered, fleet_node, name_in_fleet
from llmgw.ctl.ssh import Refusal
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.records import Inventory
from llmgw.roles import ROLE_OPERATOR
from llmgw.states import NodeState
from llmgw.views import NodeView
from llmgw.wire import encode_json, to_wire
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.link.conftest import Joined

FLEET = 10_000
#: More than one node's view, far less than a page of the fleet's.
ONE_NODE_BYTES = 16 * 1024


class Counted:
    """An operator's session that notes each procedure asked and the size of each answer."""

    def __init__(self, session):
        self.session = session
        self.asked: list[str] = []
        self.sizes: list[int] = []

    def call(self, uri, *args, **kwargs):
        self.asked.append(uri)

        def size(answer):
            self.sizes.append(len(encode_json(to_wire(answer))))
            return answer

        return self.session.call(uri, *args, **kwargs).addCallback(size)


async def operator(plane, nodes: int = FLEET) -> Counted:  # noqa: F811
    for i in range(nodes):
        plane.fleet.register(f"gpu{i:05d}", 1000 + i, Inventory(node_id=f"gpu{i:05d}", memory_total_bytes=2**36))
    return Counted(await plane.attach("alice", ROLE_OPERATOR))


@pytest_twisted.ensureDeferred
async def test_waiting_for_a_node_among_ten_thousand_asks_for_that_node_alone(plane):  # noqa: F811
    alice = await operator(plane)
    view = await _wait_registered(alice, "gpu04321", timeout=5)
    assert isinstance(view, NodeView) and view.id == "gpu04321" and view.state is NodeState.READY
    assert alice.asked == [uris.CP_NODE]
    assert max(alice.sizes) < ONE_NODE_BYTES, alice.sizes


@pytest_twisted.ensureDeferred
async def test_a_name_the_fleet_has_is_refused_after_asking_for_that_node_alone(plane):  # noqa: F811
    alice = await operator(plane)
    with pytest.raises(Refusal, match=r"^the fleet already has a node gpu00007 \(ready, at -\) and edge7 does not hold"):
        await name_in_fleet(alice, "gpu00007", "edge7", holds=False, replace=False)
    assert await name_in_fleet(alice, "gpu00007", "edge7", holds=True, replace=False) == "this node, again"
    assert (await name_in_fleet(alice, "gpu00007", "edge7", holds=False, replace=True)).startswith("replacing gpu00007")
    assert await name_in_fleet(alice, "edge7", "edge7", holds=False, replace=False) == "not in the fleet yet"
    assert alice.asked == [uris.CP_NODE] * 4
    assert max(alice.sizes) < ONE_NODE_BYTES, alice.sizes


@pytest_twisted.ensureDeferred
async def test_a_node_that_is_not_ready_or_not_there_is_refused_at_the_deadline_saying_what_it_is(plane):  # noqa: F811
    alice = await operator(plane, nodes=2)
    plane.fleet.link_closed(1001)  # gpu00001's session ended: unreachable at once
    with pytest.raises(Refusal, match=r"^gpu00001 started, but it is unreachable after 0 s; its log: "):
        await _wait_registered(alice, "gpu00001", timeout=0)
    with pytest.raises(Refusal, match=r"^edge9 started, but it has not registered after 0 s"):
        await _wait_registered(alice, "edge9", timeout=0)


@pytest_twisted.ensureDeferred
async def test_the_node_procedure_answers_one_view_or_none_and_refuses_an_id_that_is_not_a_string(plane):  # noqa: F811
    alice = await operator(plane, nodes=1)
    assert (await alice.call(uris.CP_NODE, "gpu00000"))["id"] == "gpu00000"
    assert await alice.call(uris.CP_NODE, "gpu99999") is None
    with pytest.raises(ApplicationError) as refused:
        await alice.call(uris.CP_NODE, ["gpu00000"])
    assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
    assert refused.value.args[0] == "llmgw.cp.node: a node's id is a string, not list"


@pytest_twisted.ensureDeferred
async def test_a_server_older_than_the_node_procedure_is_named_as_such():
    hub = Hub(reactor)
    alice = Joined(ComponentConfig(realm=uris.REALM))
    hub.attach_local(alice, authid="alice", role=ROLE_OPERATOR)
    await alice.ready.addTimeout(5, reactor)
    with pytest.raises(Refusal, match=r"^the server has no llmgw.cp.node: it is older than this ctl \(llmgw "):
        await fleet_node(alice, "edge1")
