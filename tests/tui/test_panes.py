"""The dashboard driven by keys against a FakeBackend: what an operator sees and can do."""

from __future__ import annotations

import asyncio

import attrs
import pytest

from llmgw.records import EngineInfo
from llmgw.states import EngineState, ReplicaState
from llmgw.tui.app import DashboardApp
from llmgw.tui.confirm import ConfirmScreen
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fake import FakeBackend, node_view, replica_view
from llmgw.tui.help import HelpScreen

from .tui_helpers import column, fixed_clock, rows, screen_text, small_fleet, until

pytestmark = pytest.mark.asyncio(loop_scope="session")

SIZE = (80, 24)


def loaded(app) -> bool:
    return app.store.loaded and app.link_problem is None


async def open_first_replica(pilot, app) -> None:
    await until(pilot, lambda: loaded(app), "the fleet to load")
    await pilot.press("tab", "enter")
    await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")


async def test_the_nodes_pane_shows_every_node_with_a_dash_for_what_it_did_not_report():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=(200, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        shown = rows(app, "nodes")
        assert list(shown) == ["node01", "node02", "node03"]
        node01 = dict(zip(["node", "state", "seen", "memory", "gpus", "disk", "engines", "cpu", "address"], shown["node01"]))
        assert node01 == {
            "node": "node01", "state": "ready", "seen": "1s ago", "memory": "400 GB free / 512 GB",
            "gpus": "1x H100 80GB HBM3 (20.0 GB / 80.0 GB used) 35%", "disk": "1.5 TB free / 2.0 TB",
            "engines": "sim 0.1", "cpu": "AMD EPYC 7763 (128)", "address": "10.0.0.1",
        }
        # node03's agent reported nothing: every figure is '-', never 0.
        assert shown["node03"][1] == "unreachable"
        assert shown["node03"][2] == "20s ago"
        assert shown["node03"][3:] == ["-"] * 6
        await until(pilot, lambda: "node03  unreachable  20s ago  -" in screen_text(app), "node03's dashes on screen")


async def test_an_engine_that_cannot_run_is_marked_in_the_row_and_its_reason_is_in_the_details():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        assert column(app, "nodes", "node02", "engines") == "llama.cpp b6000 (broken)"
        table = app.screen.query_one("#nodes").table
        assert "red" in str(table.get_cell("node02", "engines").spans[0].style)
        # The install finishes: the row says so, in place.
        fake.emit_node(attrs.evolve(fake.nodes["node02"], engines=[
            EngineInfo("llama.cpp", "b5000", state=EngineState.INSTALLED, origin="server.yaml"),
            EngineInfo("llama.cpp", "b6000", state=EngineState.INSTALLING, reason="downloading x.zip 12/16 MB",
                       origin="server.yaml"),
        ]))
        await until(pilot, lambda: column(app, "nodes", "node02", "engines")
                    == "llama.cpp b5000, llama.cpp b6000 (installing)", "the install under way")
        table.move_cursor(row=1)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        await until(pilot, lambda: "llama.cpp b6000 installing (server.yaml): downloading x.zip 12/16 MB"
                    in screen_text(app), "the node's words in the details")
        assert "llama.cpp b5000 installed (server.yaml)" in screen_text(app)


async def test_a_cpu_without_avx2_is_flagged_in_red_and_on_the_state():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=(200, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        assert column(app, "nodes", "node02", "cpu") == "Intel Atom C3758 (8) NO AVX2!"
        assert column(app, "nodes", "node02", "state") == "ready !"
        table = app.screen.query_one("#nodes").table
        assert "red" in str(table.get_cell("node02", "cpu").style)
        assert column(app, "nodes", "node01", "state") == "ready"
        # The details say it in words.
        table.move_cursor(row=1)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        assert "! CPU has no AVX2" in screen_text(app)


async def test_the_replicas_pane_shows_state_nodes_endpoint_reason_and_progress():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=(200, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("tab")
        shown = rows(app, "replicas")
        assert list(shown) == ["echo/0", "echo/1", "llama/0", "qwen/0"]
        assert shown["echo/0"] == ["echo", "0", "ready", "node01", "", "5m", "", "http://10.0.0.1:8100"]
        assert shown["echo/1"][:6] == ["echo", "1", "pending", "-", "", "-"]
        assert shown["echo/1"][7] == "-"
        assert column(app, "replicas", "echo/1", "note").startswith("no node fits: node01 has 80 GB")
        assert column(app, "replicas", "llama/0", "note") == "node01: engine exited with status 1 (next try in 30 s)"
        assert column(app, "replicas", "qwen/0", "note") == "━━━━━━━━━━━━  38% 6.0 GB / 16.0 GB 250 MB/s"
        assert "Replicas 1/4 ready" in screen_text(app)


async def test_a_download_of_unknown_size_shows_bytes_so_far_without_a_bar():
    fake = small_fleet()
    fake.replica_views = [replica_view("big/0", "node01", state=ReplicaState.FETCHING,
                                       progress={"source": "https://models.example/big.gguf", "bytes_done": 3_500_000_000,
                                                 "bytes_total": None, "rate_bps": None, "file_name": "big.gguf"})]
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(200, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        assert column(app, "replicas", "big/0", "note") == "3.5 GB so far"


async def test_slash_filters_the_focused_table_and_escape_clears_it():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("slash", "u", "n", "r", "e", "a", "c", "h")
        await until(pilot, lambda: list(rows(app, "nodes")) == ["node03"], "only node03 to match 'unreach'")
        assert "nodes filtered: 1/3" in screen_text(app)
        await pilot.press("enter")  # keeps the filter, back to the table
        assert app.focused is app.screen.query_one("#nodes").table
        assert list(rows(app, "nodes")) == ["node03"]
        # A node that starts to match while filtered appears; one that stops, goes.
        app.backend.emit_node(node_view("node01", state="unreachable"))
        await until(pilot, lambda: list(rows(app, "nodes")) == ["node01", "node03"], "node01 to match")
        await pilot.press("slash", "escape")
        await until(pilot, lambda: len(rows(app, "nodes")) == 3, "every node again")
        # Filters are per table: the replicas' is its own.
        await pilot.press("tab", "slash", "e", "c", "h", "o", "space", "p", "e", "n", "d")
        await until(pilot, lambda: list(rows(app, "replicas")) == ["echo/1"], "only echo/1, pending")
        assert len(rows(app, "nodes")) == 3


async def test_enter_opens_a_nodes_details_with_its_log_and_escape_goes_back():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        await until(pilot, lambda: "agent line 5" in screen_text(app), "the agent's log")
        text = screen_text(app)
        assert "node01" in text and "400 GB free / 512 GB" in text
        assert "logs · node01 · agent" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DetailsScreen), "the fleet screen")


async def test_enter_on_a_replica_opens_its_details_and_its_shards_log():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await open_first_replica(pilot, app)
        await until(pilot, lambda: "engine says hello" in screen_text(app), "the shard's log")
        text = screen_text(app)
        assert "echo/0  ready" in text
        assert "shard       echo/0/0 on node01: ready" in text
        assert "logs · echo/0 · node01 · echo/0/0" in text
        # d/c/u act on nodes; on a replica they are not offered.
        # Keys are handled in order: once the help shows, "d" has been handled too.
        await pilot.press("d", "question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert not any(isinstance(screen, ConfirmScreen) for screen in app.screen_stack)


async def test_a_failed_replicas_details_show_its_engines_last_lines():
    tail = [f"engine line {i}" for i in range(1, 31)] + ["error: unknown argument: --bogus"]
    failed = replica_view("llama/0", "node01", state=ReplicaState.FAILED,
                          reason="node01: exited with code 1 (next try in 30 s)",
                          shards=[{"shard": "llama/0/0", "node": "node01", "state": "failed", "pid": None,
                                   "endpoint": None, "reason": "exited with code 1", "output_tail": tail}])
    app = DashboardApp(FakeBackend([node_view("node01")], [failed]), clock=fixed_clock)
    async with app.run_test(size=(100, 50)) as pilot:
        await open_first_replica(pilot, app)
        await until(pilot, lambda: "unknown argument: --bogus" in screen_text(app), "the engine's last lines")
        text = screen_text(app)
        assert "last lines of llama/0/0 on node01:" in text
        # The last ten lines, as ctl replicas shows them; --json has them all.
        assert "engine line 22" in text and "engine line 21" not in text


async def test_the_log_follows_new_lines_while_visible_and_is_not_fetched_while_hidden():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)

    def logs_fetched() -> int:
        return len([c for c in fake.calls if c[0] == "logs"])

    async def poll_then_refetch(pilot, log) -> None:
        """Poll as the pane's timer does, then wait for a replicas refetch, which the app asks for after it."""
        log.poll()
        asked = len(fake.calls)
        fake.set_replicas(fake.replica_views)
        await until(pilot, lambda: ("replicas",) in fake.calls[asked:], "the replicas refetch")

    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        log = app.screen.query_one("#logs")
        await poll_then_refetch(pilot, log)
        assert logs_fetched() == 0, "no log is fetched while no log pane shows"
        await pilot.press("3")
        await until(pilot, lambda: log.lines[-1:] == ["agent line 5"], "the node's log")
        fake.log_lines[("node01", None)].extend(["agent line 6", "agent line 7"])
        log.poll()
        await until(pilot, lambda: "agent line 7" in screen_text(app), "the new lines")
        assert screen_text(app).count("agent line 5") == 1, "lines already shown are not shown again"
        await pilot.press("1")
        await until(pilot, lambda: not log.visible(), "the log pane to be hidden")
        fetched = logs_fetched()
        await poll_then_refetch(pilot, log)
        assert logs_fetched() == fetched, "a hidden pane fetches nothing"


async def test_s_switches_the_log_to_the_nodes_next_source():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("enter")
        await until(pilot, lambda: "agent line 5" in screen_text(app), "the agent's log")
        await pilot.press("s")
        await until(pilot, lambda: "engine says hello" in screen_text(app), "the shard's log")
        assert "agent line 5" not in screen_text(app)


async def test_logs_that_cannot_be_fetched_say_why():
    fake = small_fleet()
    fake.logs_unavailable["node01"] = "node01: agent too old or not answering"
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("enter")
        await until(pilot, lambda: "agent too old or not answering" in screen_text(app), "the reason")


async def test_d_asks_first_and_drains_only_after_yes():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        text = screen_text(app)
        assert "Drain node01?" in text and "3 replica(s)" in text
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the question to go")
        assert ("drain", "node01") not in fake.calls
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("enter")  # No has the focus: Enter is a safe answer
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the question to go")
        assert ("drain", "node01") not in fake.calls
        await pilot.press("d", "y")
        await until(pilot, lambda: ("drain", "node01") in fake.calls, "the drain")
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready,cordoned", "node01 cordoned")


async def test_c_asks_before_cordoning_and_u_uncordons_at_once():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "Cordon node01?" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: ("cordon", "node01") in fake.calls, "the cordon")
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready,cordoned", "node01 cordoned")
        await pilot.press("u")
        await until(pilot, lambda: ("uncordon", "node01") in fake.calls, "the uncordon")
        assert not isinstance(app.screen, ConfirmScreen)
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "ready", "node01 uncordoned")


async def test_a_refused_command_is_reported_not_raised():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        fake.connected = False  # the request finds no link
        await pilot.press("u")
        await until(pilot, lambda: any("uncordon node01 failed" in n.title for n in app._notifications), "the error")


async def test_node_verbs_act_only_on_the_nodes_pane():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("tab", "d")
        await until(pilot, lambda: any("select a node" in n.message for n in app._notifications), "the hint")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_the_banner_shows_while_disconnected_and_a_new_snapshot_clears_it():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        assert "disconnected" not in screen_text(app)
        fake.disconnect("the hub at wss://hub:7443/ closed the connection")
        await until(pilot, lambda: "disconnected — reconnecting" in screen_text(app), "the banner")
        assert "closed the connection" in screen_text(app)
        # What is known stays on screen meanwhile.
        assert "node01" in screen_text(app)
        # While away, node02 left the fleet and node04 joined.
        del fake.nodes["node02"]
        fake.nodes["node04"] = node_view("node04")
        fake.connect()
        await until(pilot, lambda: "disconnected" not in screen_text(app), "the banner to clear")
        assert [c for c in fake.calls if c == ("snapshot",)] == [("snapshot",)] * 2
        await until(pilot, lambda: list(rows(app, "nodes")) == ["node01", "node03", "node04"], "the new snapshot")


async def test_the_banner_shows_on_the_details_screen_too():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailsScreen), "the details screen")
        fake.disconnect()
        await until(pilot, lambda: "disconnected — reconnecting" in screen_text(app), "the banner")
        fake.connect()
        await until(pilot, lambda: "disconnected" not in screen_text(app), "the banner to clear")


async def test_an_event_changes_its_row_in_place(monkeypatch):
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock, seen_tick_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        table = app.screen.query_one("#nodes").table
        table.move_cursor(row=2)
        changes = []
        for name in ("add_row", "remove_row", "clear", "sort", "update_cell"):
            original = getattr(table, name)
            monkeypatch.setattr(table, name, lambda *a, _n=name, _o=original, **k: (changes.append((_n, a[:2])), _o(*a, **k))[1])
        fake.emit_node(node_view("node02", memory_available_bytes=100 * 10**9, cpu={"model": "Intel Atom C3758",
                                 "logical_cores": 8, "avx2": False}, gpus=[], address="10.0.0.2",
                                 warnings=["CPU has no AVX2: llama.cpp runs several times slower here"],
                                 engines=fake.nodes["node02"].engines))
        await until(pilot, lambda: column(app, "nodes", "node02", "memory") == "100 GB free / 512 GB", "the new figure")
        assert changes == [("update_cell", ("node02", "memory"))]
        assert table.cursor_row == 2, "the cursor stays where it was"


async def test_a_burst_of_events_is_applied_once_per_node():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock, seen_tick_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        for free in range(1, 101):
            fake.emit_node(node_view("node01", memory_available_bytes=free * 10**9))
        assert app.store.pending == 1
        await until(pilot, lambda: column(app, "nodes", "node01", "memory") == "100 GB free / 512 GB", "the last figure")


async def test_a_state_change_shows_at_once_and_a_heartbeat_with_the_next_tick():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock, seen_tick_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        fake.emit_node(node_view("node01", memory_available_bytes=7 * 10**9, seen_ago_s=0.0))
        fake.emit_node(node_view("node02", state="unreachable", cpu={"model": "Intel Atom C3758", "logical_cores": 8,
                                 "avx2": False}, warnings=["CPU has no AVX2"], gpus=[], address="10.0.0.2"))
        await until(pilot, lambda: column(app, "nodes", "node02", "state") == "unreachable !", "node02 unreachable")
        assert column(app, "nodes", "node01", "memory") == "400 GB free / 512 GB", "the heartbeat waits"
        app._tick()
        await until(pilot, lambda: column(app, "nodes", "node01", "memory") == "7.0 GB free / 512 GB", "the heartbeat")


async def test_events_during_a_snapshot_are_applied_after_it():
    fake = small_fleet()
    fake.hold_snapshot = asyncio.Event()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: ("snapshot",) in fake.calls, "the snapshot to be asked for")
        assert "loading the fleet" in screen_text(app)
        fake.listener.node_changed(node_view("node01", state="unreachable"))
        app.flush()  # what the flush timer does meanwhile: nothing, until the snapshot is in
        assert app.store.pending == 1
        fake.hold_snapshot.set()
        await until(pilot, lambda: column(app, "nodes", "node01", "state") == "unreachable", "the event on top")


async def test_shard_events_refetch_the_replicas_once_per_burst():
    fake = small_fleet()
    # Only settled replicas, so no poll of moving ones adds a refetch of its own.
    fake.replica_views = [replica_view("echo/0", "node01")]
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        before = fake.calls.count(("replicas",))
        new = [*fake.replica_views, replica_view("qwen/0", "node01", endpoint="http://10.0.0.1:8200")]
        for _ in range(20):
            fake.set_replicas(new)
        await until(pilot, lambda: column(app, "replicas", "qwen/0", "state") == "ready", "qwen/0 ready")
        # One event after the burst: its refetch is the second, had the burst made only one.
        fake.set_replicas([*new, replica_view("late/0", "node01")])
        await until(pilot, lambda: column(app, "replicas", "late/0", "state") == "ready", "late/0 ready")
        assert fake.calls.count(("replicas",)) - before == 2


async def test_last_seen_keeps_counting_between_events():
    now = [1000.0]
    app = DashboardApp(small_fleet(), clock=lambda: now[0], seen_tick_s=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        assert column(app, "nodes", "node01", "seen") == "1s ago"
        now[0] += 90
        await until(pilot, lambda: column(app, "nodes", "node01", "seen") == "2m ago", "91 s to show as 2m ago")


async def test_escape_on_the_table_clears_a_filter_that_enter_kept():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("slash", "n", "o", "d", "e", "0", "2", "enter")
        await until(pilot, lambda: list(rows(app, "nodes")) == ["node02"], "only node02 to match")
        assert app.focused is app.screen.query_one("#nodes").table
        await pilot.press("escape")
        await until(pilot, lambda: len(rows(app, "nodes")) == 3, "every node again")
        assert "filtered" not in screen_text(app)
        assert not app.screen.query_one("#nodes").filter_input.display


async def test_a_replicas_age_keeps_counting_between_fetches():
    now = [1000.0]
    # The fake's replicas say the same age whenever they are fetched, as no
    # server would; a refetch (a moving replica's poll) landing between the
    # clock's jump and the tick made this flake under load.  None comes here.
    app = DashboardApp(small_fleet(), clock=lambda: now[0], seen_tick_s=0.05, moving_poll_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        before = column(app, "replicas", "echo/0", "age")
        now[0] += 2 * 3600
        await until(pilot, lambda: column(app, "replicas", "echo/0", "age") != before, "echo/0's age to move on")
        assert column(app, "replicas", "echo/0", "age").endswith("h"), column(app, "replicas", "echo/0", "age")


async def test_question_mark_shows_the_keys_and_escape_closes_them():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        text = screen_text(app)
        for words in ("Tab", "filter the table", "drain the node", "cordon the node", "uncordon", "quit"):
            assert words in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "the help to close")


async def test_q_quits_and_stops_the_backend():
    fake = small_fleet()
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("q")
        await until(pilot, lambda: app._exit, "the app to exit")
    assert ("stop",) in fake.calls


async def test_everything_fits_80_by_24():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        text = screen_text(app)
        assert text.splitlines()[0].startswith(" Nodes 2/3 ready   Replicas 1/4 ready   Logs")
        assert "⏎ Details" in text and "? Keys" in text and "q Quit" in text
        assert all(len(line) <= 80 for line in text.splitlines())


def table_region(app, pane: str):
    return app.screen.query_one(f"#{pane}").table.region


async def test_at_80_by_24_a_small_fleet_shows_both_tables_sized_to_their_rows():
    app = DashboardApp(small_fleet(), clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        # Header, three rows and the scrollbar of a table wider than 80; then the replicas'.
        await until(pilot, lambda: table_region(app, "nodes").height == 5 and table_region(app, "replicas").height == 6,
                    "both tables as tall as their rows")
        text = screen_text(app)
        assert "node03" in text and "qwen" in text and "MODEL" in text
        assert table_region(app, "replicas").y == table_region(app, "nodes").bottom
        await pilot.press("tab")  # Tab moves to the replicas, both still shown
        assert app.focused is app.screen.query_one("#replicas").table
        assert "node03" in screen_text(app)


async def test_a_fleet_taller_than_the_screen_leaves_the_short_table_whole_and_scrolls_the_long_one():
    nodes = [node_view(f"node{i:02}") for i in range(1, 41)]
    fake = FakeBackend(nodes, [replica_view("echo/0", "node01", endpoint="http://10.0.0.1:8100")], {})
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        # The replicas' header and row (no scrollbar: it fits 80 columns); the nodes scroll in the rest.
        # The room is read as the layout settles, not once: right after loading it may not be final yet.
        def laid_out():
            room = app.screen.query_one("#panes").region.height
            heights = (table_region(app, "replicas").height, table_region(app, "nodes").height, room)
            return heights if heights[0] == 2 and heights[1] == room - 2 and room > 2 else False

        await until(pilot, laid_out, "the replica whole, the nodes in the rest")
        assert "echo" in screen_text(app)
