"""The events pane and a node's or replica's last hour, against a FakeBackend: what an operator reads."""

from __future__ import annotations

import pytest

from llmgw.history import JournalKind, JournalPage
from llmgw.states import ReplicaState
from llmgw.tui.app import DashboardApp
from llmgw.tui.events import EventsPane, ShownEntries, event_line
from llmgw.tui.fake import replica_view
from tests.support import histories

from .tui_helpers import fixed_clock, screen_text, small_fleet, until

pytestmark = pytest.mark.asyncio(loop_scope="session")


def with_history(fake):
    fake.journal = histories.journal(node="node01", other="node03")
    fake.figured = histories.figures(node="node01")
    return fake


def events_text(app) -> str:
    log = app.screen.query_one(EventsPane).log_widget
    return "\n".join("".join(segment.text for segment in line) for line in log.lines)


def loaded(app) -> bool:
    return app.store.loaded and app.link_problem is None


async def test_e_shows_the_journal_newest_last_and_follows_new_entries_escaped():
    fake = with_history(small_fleet())
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        assert not [c for c in fake.calls if c[0] == "events"]  # hidden: it asks nothing
        await pilot.press("e")
        await until(pilot, lambda: "llama.cpp" not in screen_text(app) and "catalog" in events_text(app),
                    "the events pane with the journal")
        lines = events_text(app).splitlines()
        assert len(lines) == 9 and "server started" in lines[0] and "reload" in lines[-1]
        exited = next(line for line in lines if " exited " in line)
        assert exited.startswith("09-21 13:43:20  exited           qwen/0         node01  exited 137 (killed): ")
        assert exited.endswith("<script>alert('pwned')</script>\\x1b[2J\\u202e")
        assert "\x1b" not in events_text(app) and "\u202e" not in events_text(app)
        # A new entry arrives on llmgw.event.journal: appended, no fetch.
        asked = len(fake.calls)
        fake.emit_journal(histories.entry(10, -5, JournalKind.COLD_START, "llama/0",
                                          "starting on demand: 3 requests waiting, 12 s", model="llama",
                                          replica="llama/0"))
        await until(pilot, lambda: "starting on demand" in events_text(app).splitlines()[-1], "the new entry")
        assert fake.calls[asked:] == []
        assert " Events " in screen_text(app).splitlines()[0]


async def test_an_entry_that_came_both_ways_is_shown_once_and_a_journal_that_fails_says_why():
    fake = small_fleet()
    fake.history_error = "no callee registered for procedure <llmgw.cp.events>"
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        first = histories.entry(1, 60, JournalKind.NODE_LOST, "node03", "no heartbeat for 60 s", node="node03")
        fake.emit_journal(first)  # arrives while the pane is hidden
        await pilot.press("4")
        await until(pilot, lambda: "the journal could not be read: no callee" in screen_text(app), "the refusal")
        assert "no heartbeat for 60 s" in events_text(app)
        fake.history_error = None
        fake.journal = JournalPage(entries=[first], newest_seq=1, dropped=3)
        app.screen.query_one(EventsPane).fetch()
        await until(pilot, lambda: "let go of 3 older entries" in screen_text(app), "the journal's bounds said")
        assert events_text(app).count("no heartbeat for 60 s") == 1


async def test_a_sleeping_and_a_waking_replica_read_well_in_the_table():
    fake = small_fleet()
    fake.replica_views = [
        replica_view("llama/0", None, state=ReplicaState.SLEEPING, reason="idle: scaled to zero, last request 14 min ago"),
        replica_view("mistral/0", "node01", state=ReplicaState.STARTING,
                     reason="starting on demand: 3 requests waiting, 12 s"),
    ]
    app = DashboardApp(fake, clock=fixed_clock)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: loaded(app), "the fleet to load")
        await pilot.press("2")
        await until(pilot, lambda: "idle: scaled to zero, last request 14 min ago" in screen_text(app), "the sleeper")
        assert "starting on demand: 3 requests waiting, 12 s" in screen_text(app)
        table = app.screen.query_one("#replicas").table
        assert "blue" in str(table.get_cell("llama/0", "state").style)


def test_the_journal_keeps_each_entry_once_and_at_most_its_bound():
    journal = ShownEntries(keep=3)
    entries = histories.journal().entries
    assert all(journal.add(e) for e in entries[:3])
    assert journal.add(entries[0]) is False
    journal.merge(JournalPage(entries=entries))
    assert [e.seq for e in journal.ordered()] == [7, 8, 9]
    line = event_line(entries[4]).plain
    assert "\x1b" not in line and line.count("\n") == 0
