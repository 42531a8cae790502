"""``llmgw.event.heard``: every few seconds one batch of the nodes heard since the last, whatever their heartbeats.

The control plane is attached to a hub in process, with the fleet on a
``task.Clock``; an operator's session subscribes as the dashboard does.
"""

from __future__ import annotations

import pytest_twisted

from llmgw.control import heard
from llmgw.link import uris
from llmgw.records import Heartbeat, Inventory
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR
from llmgw.views import HEARD_PAGE, HeardEvent
from llmgw.wire import from_wire, to_wire
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures: the control plane on a task.Clock
from tests.support.wait import until


@pytest_twisted.ensureDeferred
async def test_nodes_heard_are_published_once_a_batch_with_how_long_ago_not_once_a_heartbeat(plane, clock):
    alice = await plane.attach("alice", ROLE_OPERATOR)
    events: list[HeardEvent] = []
    node_events: list = []
    await alice.subscribe(lambda event: events.append(from_wire(HeardEvent, event)), uris.EVENT_HEARD)
    await alice.subscribe(lambda node_id, event: node_events.append(node_id), uris.EVENT_NODE)
    nodes = {}
    for name in ("node01", "node02", "node03"):
        nodes[name] = await plane.attach(name, ROLE_NODE)
        await nodes[name].call(uris.AGENT_REGISTER, to_wire(Inventory(node_id=name, memory_total_bytes=8)))
    await until(lambda: len(node_events) == 3, "the three nodes' register events")
    assert plane.fleet.unreachable_after == 15.0 and heard.interval(15.0) == 5.0

    # node01 beats every second, node02 once; node03 is silent.
    for second in range(5):
        await nodes["node01"].call(uris.AGENT_HEARTBEAT, to_wire(Heartbeat()))
        if second == 1:
            await nodes["node02"].call(uris.AGENT_HEARTBEAT, to_wire(Heartbeat()))
        clock.advance(1)
    # Six heartbeats, none of them news: no node event, and one batch at 5 s.
    await until(lambda: len(events) == 1, "the first batch")
    assert events[0].seen_ago_s == {"node01": 1.0, "node02": 4.0}
    assert len(node_events) == 3

    # A quiet interval publishes nothing; the next heartbeat is in the batch after it.
    clock.advance(5)
    clock.advance(2)
    await nodes["node03"].call(uris.AGENT_HEARTBEAT, to_wire(Heartbeat()))
    clock.advance(3)
    await until(lambda: len(events) == 2, "the batch after node03's heartbeat")
    assert events[1].seen_ago_s == {"node03": 3.0}


def test_a_batch_leaves_out_a_forgotten_node_and_goes_out_in_pages():
    batch = heard.Heard()
    for i in range(HEARD_PAGE + 5):
        batch.noted(f"n{i}")
    batch.noted("gone")
    events = batch.batch(lambda node_id: None if node_id == "gone" else 95.0, now=100.0)
    assert [len(e.seen_ago_s) for e in events] == [HEARD_PAGE, 5]
    assert all(v == 5.0 for e in events for v in e.seen_ago_s.values())
    assert batch.batch(lambda node_id: 95.0, now=101.0) == []
    assert heard.interval(3.0) == heard.LEAST_S
