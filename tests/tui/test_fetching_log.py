"""A replica still fetching its weights: its log view shows the download, and its node is not asked for a log."""

from __future__ import annotations

import pytest

from llmgw.records import Progress
from llmgw.states import ReplicaState
from llmgw.tui.app import DashboardApp
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fake import FakeBackend, node_view, replica_view

from .tui_helpers import fixed_clock, screen_text, until

pytestmark = pytest.mark.asyncio(loop_scope="session")

POLLS = 5
DOWNLOAD = Progress("hf://acme/tiny", "model.safetensors", 120_000_000, 253_000_000, 5_000_000.0)


def fetching() -> object:
    return replica_view("tiny/0", "node01", state=ReplicaState.FETCHING, progress=DOWNLOAD)


def shard_logs_asked(fake: FakeBackend) -> list[tuple]:
    return [c for c in fake.calls if c[0] == "logs" and c[2] == "tiny/0/0"]


@pytest.mark.parametrize("where", ["details", "logs pane"])
async def test_a_fetching_replicas_log_shows_its_download_and_asks_its_node_nothing(where):
    fake = FakeBackend([node_view("node01")], [fetching()], logs={("node01", "tiny/0/0"): ["engine says hello"]})
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.store.loaded and app.link_problem is None, "the fleet to load")
        await pilot.press("tab")
        if where == "details":
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
            log = app.screen.query_one("#details-log")
        else:
            await pilot.press("3")
            log = app.screen.query_one("#logs")
        said = "tiny/0/0 has not started, so it has no log yet: fetching its weights: model.safetensors: 120 MB of 253 MB"
        await until(pilot, lambda: said in " ".join(screen_text(app).split()), "the download in the log's place")
        for _ in range(POLLS):
            log.poll()
            await pilot.pause()
        assert shard_logs_asked(fake) == []
        assert "no shard" not in screen_text(app)

        # Once it starts, its log is asked for and shown.
        fake.set_replicas([replica_view("tiny/0", "node01", state=ReplicaState.STARTING)], "tiny/0/0")
        await until(pilot, lambda: app.store.replicas["tiny/0"].state == ReplicaState.STARTING, "the replica to start")
        log.poll()
        await until(pilot, lambda: "engine says hello" in screen_text(app), "the shard's log")
        assert "has not started" not in screen_text(app)
