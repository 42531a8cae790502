"""A node the fleet forgot (offboarded) leaves the dashboard: its row, its count, its details.

The event arrives as the hub sends it, through ``WampBackend``'s own
decoding, to the app; the snapshot is the FakeBackend's.
"""

from __future__ import annotations

import pytest
from twisted.internet import task

from llmgw.huburl import parse_hub_url
from llmgw.tui.app import DashboardApp
from llmgw.tui.backend import WampBackend
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fake import node_view
from llmgw.views import NodeChange, NodeEvent
from llmgw.wire import to_wire

from .tui_helpers import fixed_clock, rows, screen_text, small_fleet, until

pytestmark = pytest.mark.asyncio(loop_scope="session")

SIZE = (80, 24)


def hub_events(app) -> WampBackend:
    """A WampBackend, never connected, that hands the events it is given to *app* as the hub's would."""
    backend = WampBackend(task.Clock(), parse_hub_url("wss://127.0.0.1:7443/"), tls=None)
    backend.subscribe(app)
    return backend


def forgotten(view) -> dict:
    return to_wire(NodeEvent(NodeChange.FORGOTTEN, view))


async def test_a_forgotten_node_leaves_the_table_and_the_ready_count_and_its_details_say_so():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.loaded and app.link_problem is None, "the fleet to load")
        assert "Nodes 2/3 ready" in screen_text(app)
        hub = hub_events(app)
        hub._node_event("node01", forgotten(fake.nodes["node01"]))
        await until(pilot, lambda: "node01" not in rows(app, "nodes"), "node01 to leave the nodes table")
        assert list(rows(app, "nodes")) == ["node02", "node03"]
        assert "Nodes 1/2 ready" in screen_text(app)

        app.push_screen(DetailsScreen("node", "node02"))
        await until(pilot, lambda: "10.0.0.2" in screen_text(app), "node02's details")
        hub._node_event("node02", forgotten(fake.nodes["node02"]))
        await until(pilot, lambda: "node02 is no longer in the fleet" in screen_text(app), "the details to say so")
        assert set(app.store.nodes) == {"node03"}


async def test_a_node_forgotten_while_a_view_of_it_waits_goes_and_one_onboarded_again_comes_back():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock, seen_tick_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.store.loaded and app.link_problem is None, "the fleet to load")
        hub = hub_events(app)
        # A heartbeat's figures wait for the slow pass; the forgetting after them does not.
        hub._node_event("node01", to_wire(NodeEvent(NodeChange.HEARTBEAT, node_view("node01", memory_available_bytes=7))))
        hub._node_event("node01", forgotten(fake.nodes["node01"]))
        await until(pilot, lambda: "node01" not in rows(app, "nodes"), "node01 to leave the nodes table")
        hub._node_event("node01", to_wire(NodeEvent(NodeChange.REGISTERED, node_view("node01", cordoned=True))))
        await until(pilot, lambda: "node01" in rows(app, "nodes"), "node01, registered anew, to be shown")
        assert app.store.nodes["node01"].cordoned
