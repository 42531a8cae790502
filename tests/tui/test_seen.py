"""SEEN ("last seen") is true to a few seconds on a healthy node, and a replica's age counts on in its details.

A steady node's heartbeats are not node events (they are news only every
30 s); the control plane says which nodes it heard in one batch every few
seconds (``llmgw.event.heard``), and the dashboard counts on from there.
"""

from __future__ import annotations

import asyncio

import pytest

from llmgw.tui.app import DashboardApp
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fake import FakeBackend, node_view
from llmgw.tui.store import FleetStore

from .test_real import dashboard
from .tui_helpers import column, screen_text, small_fleet, until

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_seen_follows_the_batches_of_nodes_heard_between_node_events():
    now = [1000.0]
    fake = FakeBackend([node_view("node01", seen_ago_s=1.0), node_view("node02", seen_ago_s=1.0)])
    app = DashboardApp(fake, clock=lambda: now[0], seen_tick_s=0.05)
    async with app.run_test(size=(120, 24)) as pilot:
        await until(pilot, lambda: column(app, "nodes", "node01", "seen") == "1s ago", "node01 seen 1 s ago")
        now[0] += 20
        await until(pilot, lambda: column(app, "nodes", "node01", "seen") == "21s ago", "SEEN to count on")
        # Only node01 was heard: its SEEN is the batch's, node02's counts on.
        fake.emit_heard({"node01": 2.0, "node99": 1.0})
        await until(pilot, lambda: column(app, "nodes", "node01", "seen") == "2s ago", "node01's SEEN from the batch")
        assert column(app, "nodes", "node02", "seen") == "21s ago"
        assert "node99" not in screen_text(app)


async def test_a_batch_never_moves_seen_back_and_waits_for_the_snapshot():
    now = [1000.0]
    store = FleetStore(lambda: now[0])
    store.heard({"node01": 1.0})  # before any snapshot: nothing to apply it to
    store.load([node_view("node01", seen_ago_s=1.0)], [])
    assert store.seen_ago("node01") == 1.0
    now[0] += 10
    store.heard({"node01": 4.0})
    assert store.seen_ago("node01") == 4.0
    # A node view queued before that batch says less recent news: SEEN stays the batch's.
    store.queue_node(node_view("node01", seen_ago_s=8.0))
    now[0] += 1
    store.take_nodes(figures=True)
    assert store.seen_ago("node01") == 5.0
    store.link_up()
    store.heard({"node01": 0.0})
    assert store.seen_ago("node01") == 5.0


async def test_a_replicas_age_counts_on_in_its_details():
    now = [1000.0]
    app = DashboardApp(small_fleet(), clock=lambda: now[0], seen_tick_s=0.05, moving_poll_s=3600)
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: app.store.loaded, "the fleet to load")
        await pilot.press("tab", "enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        def age() -> str:
            return next((line.split()[1] for line in screen_text(app).splitlines() if line.split()[:1] == ["age"]), "")

        await until(pilot, lambda: age() == "5m", "the replica's age")
        now[0] += 3 * 3600
        await until(pilot, lambda: age() == "3h", "the age to count on")


@pytest.mark.integration
async def test_a_real_dashboards_seen_stays_within_a_few_seconds_of_the_heartbeats(cluster, reactor):
    """Against a real server (a node unreachable after 3 s, so a batch each second) and an agent beating each second."""
    await asyncio.to_thread(lambda: (cluster.start_server(), cluster.start_agent("node01"),
                                     cluster.wait_node("node01", "ready")))
    app = dashboard(cluster, reactor)
    batches: list[dict] = []
    heard = app.nodes_heard
    app.nodes_heard = lambda seen: (batches.append(seen), heard(seen))
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 ready", timeout=20)
        await until(pilot, lambda: len(batches) >= 3, "three batches of nodes heard", timeout=20)
        assert all(set(b) == {"node01"} and 0 <= b["node01"] <= 2 for b in batches), batches
        assert app.store.seen_ago("node01") <= 3
