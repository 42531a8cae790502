"""A node's or a replica's last hour in the details screen: sparklines with their gaps, and its own events."""

from __future__ import annotations

import pytest

from llmgw.history import JournalKind
from llmgw.tui.app import DashboardApp
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fake import replica_view
from llmgw.tui.sparks import HistoryPanel, spark
from tests.support import histories

from .test_events import loaded, with_history
from .tui_helpers import fixed_clock, screen_text, small_fleet, until

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_nodes_details_show_its_last_hour_as_sparklines_with_a_gap_and_its_own_events():
    fake = with_history(small_fleet())
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(120, 50)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        await until(pilot, lambda: "last hour of node node01" in screen_text(app), "node01's last hour")
        text = screen_text(app)
        assert "GPU busy                now 59%   0% to 99%" in text
        gpu = text.splitlines()[text.splitlines().index(next(l for l in text.splitlines() if "GPU busy" in l)) + 1]
        assert "    " in gpu.strip()  # the five minutes without heartbeats: blank, not the lowest block
        assert ("figures", "node", "node01") in [(c[0], str(c[1]), c[2]) for c in fake.calls if c[0] == "figures"]
        panel = app.screen.query_one(HistoryPanel)
        assert [e.seq for e in panel.journal.ordered()] == [2, 3, 4, 5, 6]
        app.screen.query_one("#facts-scroll").scroll_end(animate=False)
        await until(pilot, lambda: "exited 137 (killed)" in screen_text(app), "node01's events, scrolled to")
        assert "no heartbeat for 60 s" not in screen_text(app)  # node03's, not node01's
        fake.emit_journal(histories.entry(10, -5, JournalKind.EVICTED, "qwen/0", "to make room for llama/0",
                                          node="node01", model="qwen", replica="qwen/0"))
        await until(pilot, lambda: app.screen.query_one(HistoryPanel).journal.ordered()[-1].seq == 10, "the new event")
        app.screen.query_one("#facts-scroll").scroll_end(animate=False)
        await until(pilot, lambda: "to make room for llama/0" in screen_text(app), "the node's new event on screen")


async def test_a_replicas_details_show_its_models_figures_and_its_own_events_only():
    fake = with_history(small_fleet())
    fake.set_replicas([*fake.replica_views, replica_view("qwen/1", "node01")])
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(120, 50)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        app.open_details("replica", "qwen/0")
        await until(pilot, lambda: "last hour of model qwen" in screen_text(app), "qwen's last hour")
        text = screen_text(app)
        assert "requests/s              now 3.5 req/s   2 req/s to 3.5 req/s" in text
        assert [e.seq for e in app.screen.query_one(HistoryPanel).journal.ordered()] == [3, 4, 5, 6]
        assert ("events", None, "qwen") in fake.calls
        app.pop_screen()
        app.open_details("replica", "qwen/1")
        await until(pilot, lambda: "last hour of model qwen" in screen_text(app), "qwen/1's model's last hour")
        assert app.screen.query_one(HistoryPanel).journal.ordered() == []  # qwen/0's events are not qwen/1's


def test_a_sparkline_is_a_column_a_stretch_and_a_blank_where_nothing_was_known():
    assert spark([0.0, 1.0, None, 2.0], 4) == "▁▅ █"
    assert spark([None] * 10, 5) == "     "
    assert spark([0.0, 0.0], 2) == "▁▁"
    assert len(spark(histories.QWEN_REQUESTS)) == 60
    assert spark(histories.QWEN_REQUESTS).startswith(" " * 50)
