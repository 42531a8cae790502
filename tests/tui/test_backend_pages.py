"""WampBackend's snapshot comes a page at a time; node events between pages keep only what is newer.

The session is a stand-in whose calls the test answers one by one, so the
order of pages and events is the test's, not a race's.
"""

from __future__ import annotations

import asyncio

import pytest
from twisted.internet import defer, task

from llmgw.huburl import parse_hub_url
from llmgw.link import uris
from llmgw.tui.backend import WampBackend
from llmgw.tui.fake import node_view
from llmgw.views import NodeChange, NodeEvent
from llmgw.wire import to_wire

pytestmark = pytest.mark.asyncio


class Session:
    def __init__(self):
        self.calls: list[tuple[str, dict, defer.Deferred]] = []

    def call(self, uri, *args, **kwargs):
        d = defer.Deferred()
        self.calls.append((uri, kwargs, d))
        return d


class Listener:
    def __init__(self):
        self.nodes = []
        self.forgotten = []

    def node_changed(self, view):
        self.nodes.append(view)

    def node_forgotten(self, node_id):
        self.forgotten.append(node_id)


def event(node_id: str, change: NodeChange = NodeChange.CORDON, **fields) -> dict:
    return to_wire(NodeEvent(change, node_view(node_id, **fields)))


async def until_calls(session: Session, n: int) -> None:
    for _ in range(1000):
        if len(session.calls) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the backend made {len(session.calls)} calls, not {n}")


async def test_a_paged_snapshot_keeps_events_for_nodes_in_hand_and_drops_those_still_to_come():
    backend = WampBackend(task.Clock(), parse_hub_url("wss://127.0.0.1:7443/"), tls=None)
    backend.page = 2
    session = backend._session = Session()
    listener = Listener()
    backend.subscribe(listener)
    snapshot = asyncio.ensure_future(backend.snapshot())

    await until_calls(session, 1)
    assert session.calls[0][:2] == (uris.CP_NODES, {"limit": 2})
    backend._node_event("n3", event("n3", cordoned=True))  # older than the page that will bring n3
    session.calls[0][2].callback([to_wire(node_view("n1")), to_wire(node_view("n2"))])

    await until_calls(session, 2)
    assert session.calls[1][:2] == (uris.CP_NODES, {"limit": 2, "after": "n2"})
    backend._node_event("n1", event("n1", cordoned=True))  # newer than the page n1 came in
    backend._node_event("n0", event("n0"))  # registered behind the cursor meanwhile
    backend._node_event("n4", event("n4", cordoned=True))  # still to come
    session.calls[1][2].callback([to_wire(node_view("n3")), to_wire(node_view("n4"))])

    await until_calls(session, 3)
    session.calls[2][2].callback([to_wire(node_view("n5"))])
    await until_calls(session, 4)
    assert session.calls[3][0] == uris.CP_REPLICAS
    session.calls[3][2].callback([])
    nodes, replicas = await snapshot

    assert [n.id for n in nodes] == ["n1", "n2", "n3", "n4", "n5", "n0"]
    assert [n.id for n in nodes if n.cordoned] == ["n1"]
    assert listener.nodes == []  # nothing reached the app while the pages came
    backend._node_event("n5", event("n5", cordoned=True))
    assert [(v.id, v.cordoned) for v in listener.nodes] == [("n5", True)]


async def test_a_node_forgotten_while_the_pages_come_is_left_out_and_one_forgotten_after_is_passed_on():
    backend = WampBackend(task.Clock(), parse_hub_url("wss://127.0.0.1:7443/"), tls=None)
    backend.page = 2
    session = backend._session = Session()
    listener = Listener()
    backend.subscribe(listener)
    snapshot = asyncio.ensure_future(backend.snapshot())

    await until_calls(session, 1)
    session.calls[0][2].callback([to_wire(node_view("n1")), to_wire(node_view("n2"))])
    await until_calls(session, 2)
    backend._node_event("n1", event("n1", NodeChange.FORGOTTEN))  # newer than the page n1 came in
    session.calls[1][2].callback([to_wire(node_view("n3"))])
    await until_calls(session, 3)
    session.calls[2][2].callback([])
    nodes, _ = await snapshot
    assert [n.id for n in nodes] == ["n2", "n3"]

    backend._node_event("n2", event("n2", NodeChange.FORGOTTEN))
    assert (listener.forgotten, listener.nodes) == (["n2"], [])


async def test_an_event_of_a_change_this_dashboard_does_not_know_is_dropped_not_shown():
    backend = WampBackend(task.Clock(), parse_hub_url("wss://127.0.0.1:7443/"), tls=None)
    listener = Listener()
    backend.subscribe(listener)
    backend._node_event("n1", {**event("n1"), "change": "renamed"})
    backend._node_event("n1", event("n1", NodeChange.STATE, state="lost"))
    assert [(v.id, v.state) for v in listener.nodes] == [("n1", "lost")]
