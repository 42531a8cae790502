"""What a person sees at 80x24, as SVG snapshots (pytest-textual-snapshot).

The fleet is the fake's, with a clock that stands still, so the pictures are
the same on every run.  After a deliberate change to the look, look at the
report pytest writes, then run with ``--snapshot-update`` and commit the new
SVGs under ``__snapshots__/``.  (Snapshots from a real server would differ in
every port, pid and second, so the real-server tests read text instead.)
"""

from __future__ import annotations

import pytest

from llmgw.tui.app import DashboardApp
from llmgw.tui.details import DetailsScreen
from llmgw.tui.logs import LogPane

from .tui_helpers import fixed_clock, screen_text, small_fleet, until

pytest.importorskip("pytest_textual_snapshot")

SIZE = (80, 24)


async def _loaded(pilot) -> None:
    app = pilot.app
    await until(pilot, lambda: app.store.loaded and app.link_problem is None, "the fleet to load")
    await pilot.pause()


def test_nodes_pane(snap_compare):
    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), terminal_size=SIZE, run_before=_loaded)


def test_replicas_pane_with_a_download(snap_compare):
    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), press=["tab"], terminal_size=SIZE,
                        run_before=_loaded)


def test_node_details_with_its_log(snap_compare):
    async def open_details(pilot):
        await _loaded(pilot)
        await pilot.press("down", "enter")
        # node02 has no log lines: the pane says so once the fetch has answered.
        await until(pilot, lambda: isinstance(pilot.app.screen, DetailsScreen)
                    and pilot.app.screen.query_one(LogPane).target is not None
                    and "no lines yet" in screen_text(pilot.app), "the details with the node's empty log")
        await pilot.pause()

    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), terminal_size=SIZE, run_before=open_details)


def test_keys(snap_compare):
    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), press=["question_mark"], terminal_size=SIZE,
                        run_before=_loaded)


def test_drain_asks_first(snap_compare):
    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), press=["d"], terminal_size=SIZE,
                        run_before=_loaded)


def test_disconnected_banner(snap_compare):
    fake = small_fleet()

    async def drop(pilot):
        await _loaded(pilot)
        fake.disconnect("link to wss://hub.example:7443/ failed: connection refused (is the server running and listening there?)")
        await until(pilot, lambda: "disconnected" in screen_text(pilot.app), "the banner")
        await pilot.pause()

    assert snap_compare(DashboardApp(fake, clock=fixed_clock), terminal_size=SIZE, run_before=drop)


def test_nodes_engines_and_a_broken_builds_reason_in_the_details(snap_compare):
    # Wide enough for the ENGINES column, tall enough for the details to reach the engines.
    async def open_details(pilot):
        await _loaded(pilot)
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, DetailsScreen)
                    and "libgomp" in screen_text(pilot.app), "node02's engines in its details")
        await pilot.pause()

    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), terminal_size=(140, 34),
                        run_before=open_details)


def test_nodes_pane_wide_enough_for_engines(snap_compare):
    assert snap_compare(DashboardApp(small_fleet(), clock=fixed_clock), terminal_size=(160, 12), run_before=_loaded)
