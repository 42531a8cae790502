"""A node's words on the dashboard: shown as they were sent, never obeyed as markup or by the terminal.

Textual's DataTable reads a string cell as markup (``[@click=app.quit]`` in
a GPU's name is an action), its ``Log`` passes ESC on to the terminal, and
a notification is markup unless told otherwise.  The words are
``tests/ctl/hostile.py``'s, the ones ``ctl`` is tested with.
"""

from __future__ import annotations

import pytest
from textual.widgets import Log

from llmgw.records import EngineInfo
from llmgw.states import EngineState
from llmgw.tui.app import DashboardApp
from llmgw.tui.backend import ActionFailed
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fake import FakeBackend, node_view, replica_view
from tests.ctl.hostile import NAME_WORDS, WORDS, raw_in

from .tui_helpers import fixed_clock, screen_text, until

pytestmark = pytest.mark.asyncio(loop_scope="session")

ESCAPED = "\\x1b]52;c;cm0gLXJmIH4vKg==\\x07"


def hostile_fleet() -> FakeBackend:
    node = node_view(
        "node01", hostname=NAME_WORDS, cpu={"model": NAME_WORDS, "logical_cores": 8},
        gpus=[{"index": 0, "name": NAME_WORDS}], labels={"gpu": NAME_WORDS}, warnings=[WORDS],
        engines=[EngineInfo(name="llama.cpp", version="b1", state=EngineState.BROKEN, reason=WORDS)],
    )
    replica = replica_view("echo/0", reason=WORDS)
    return FakeBackend([node], [replica], logs={("node01", None): [WORDS, "after\nforged line"]})


def loaded(app) -> bool:
    return app.store.loaded and app.link_problem is None


async def test_a_nodes_words_in_the_tables_are_text_not_markup_and_escaped():
    app = DashboardApp(hostile_fleet(), clock=fixed_clock)
    async with app.run_test(size=(300, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        screen = screen_text(app)
        # The GPUS column (a string cell) shows the markup as it was sent: no bold, no click action.
        assert "1x x [b]b[/b] [@click=app.quit]q[/] <i>" in screen, screen
        assert raw_in(screen) == []
        table = app.screen.query_one("#nodes").table
        cells = [table.get_cell_at((0, i)) for i in range(len(table.columns))]
        assert all(not isinstance(c, str) or "[" not in c for c in cells), cells


async def test_the_details_and_the_log_show_a_nodes_words_escaped_each_on_its_own_line():
    app = DashboardApp(hostile_fleet(), clock=fixed_clock)
    async with app.run_test(size=(300, 60)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the node's details")
        log = app.screen.query_one(Log)
        await until(pilot, lambda: log.line_count == 2, "the node's two log lines")
        assert list(log.lines) == [
            ESCAPED + "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m evil\\u202egnp.exe [b]bold[/b] [@click=app.quit]quit[/] "
            "<script>alert(1)</script>\\rforged",
            "after\\nforged line",
        ]
        facts = str(app.screen.query_one("#facts").render())
        assert raw_in(facts) == [], facts
        assert f"! {ESCAPED}" in facts  # the warning, on its own line
        assert f"llama.cpp b1 broken: {ESCAPED}" in facts
        assert raw_in(screen_text(app)) == []


async def test_a_refusal_in_a_nodes_words_is_notified_as_text():
    fake = hostile_fleet()

    async def cordon(node_id):
        raise ActionFailed(f"{node_id}: {WORDS}", error="llmgw.error.refused")

    fake.cordon = cordon
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(300, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        app.ask_node_verb("uncordon", "node01")  # asks nothing first
        fake.uncordon = cordon
        await until(pilot, lambda: any("failed" in (n.title or "") for n in app._notifications), "the refusal")
        (said,) = [n for n in app._notifications if "failed" in (n.title or "")]
        assert said.markup is False
        assert said.message.startswith(f"node01: {ESCAPED}")
        assert raw_in(said.message) == []


@pytest.mark.integration
async def test_a_node_that_answers_its_logs_wrongly_is_named_in_the_log_pane_over_the_real_hub(cluster, reactor):
    import asyncio

    from twisted.internet import defer

    from llmgw.huburl import parse_hub_url
    from llmgw.tlsfiles import TLSFiles
    from llmgw.tui.backend import WampBackend
    from llmgw.tui.logs import LogPane
    from tests.ctl.hostile import HostileNode

    from .tui_helpers import column

    await asyncio.to_thread(cluster.start_server)
    node = await defer.ensureDeferred(HostileNode(cluster).join()).asFuture(asyncio.get_running_loop())
    node.answers["logs"] = {"node": "node01", "source": "agent", "lines": 5}
    pki = cluster.pki
    tls = TLSFiles(str(pki / "ca.crt"), str(pki / "alice.crt"), str(pki / "alice.key"))
    app = DashboardApp(WampBackend(reactor, parse_hub_url(cluster.hub), tls))
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, lambda: column(app, "nodes", "node01", "node") == "node01", "node01 listed", timeout=20)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "node01's details")
            pane = app.screen.query_one(LogPane)
            await until(pilot, lambda: pane.status and "cannot read" in pane.status, "the log pane's reason", timeout=20)
            assert pane.status.startswith("node01 answered logs with something llmgw cannot read "
                                          "(LogsAnswer.lines: expected a list, got int 5)"), pane.status
            node.answers["logs"] = {"node": "node01", "source": "agent", "lines": [WORDS]}
            await until(pilot, lambda: pane.lines, "the node's line", timeout=20)
            assert raw_in(str(list(app.screen.query_one(Log).lines))) == []
            assert app.screen.query_one(Log).lines[0].startswith(ESCAPED)
    finally:
        node.leave()
