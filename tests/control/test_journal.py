"""The journal in memory: numbered entries, pages by node, model and age, bounds, listeners, and a node's rate."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from llmgw.config.history import HistorySettings
from llmgw.control.journal import PAGE_CHARS, Journal
from llmgw.history import PAGE_MOST, REASON_CHARS, JournalEntry, JournalKind, JournalPage
from llmgw.wire import from_wire, to_wire

K = JournalKind


@pytest.fixture
def clock():
    c = Clock()
    c.advance(1_800_000_000)
    return c


def journal(clock, directory=None, **settings) -> Journal:
    return Journal(clock, HistorySettings(**{"journal_refill_s": 0, **settings}), directory)


def test_entries_are_numbered_timed_and_told_to_every_listener(clock):
    j = journal(clock)
    heard, broken = [], []
    j.listeners.append(lambda e: broken.append(1 / 0))  # a listener that fails stops no other
    j.listeners.append(heard.append)
    first = j.record(K.NODE_LOST, "node01", "no heartbeat for 120 s", node="node01")
    clock.advance(5)
    second = j.record(K.EXITED, "echo/0", "killed by signal 9 (SIGKILL)", node="node01", model="echo",
                      replica="echo/0")
    assert (first.seq, second.seq) == (1, 2)
    assert second.at == first.at + 5 == 1_800_000_005
    assert heard == [first, second]
    assert j.page() == JournalPage([first, second], newest_seq=2, dropped=0)


def test_a_page_filters_by_node_model_and_age_oldest_first(clock):
    j = journal(clock)
    a = j.record(K.NODE_REGISTERED, "node01", node="node01")
    clock.advance(3600)
    b = j.record(K.PLACED, "echo/0", "on node01", node="node01", model="echo", replica="echo/0")
    c = j.record(K.PLACED, "qwen/0", "on node02", node="node02", model="qwen", replica="qwen/0")
    clock.advance(10)
    d = j.record(K.RELOAD, "server.yaml", "model qwen added")
    assert j.page(node="node01").entries == [a, b]
    assert j.page(model="qwen").entries == [c]
    assert j.page(since=60).entries == [b, c, d]
    assert j.page(since=5).entries == [d]
    assert j.page(node="node09").entries == []


def test_a_page_is_the_newest_entries_or_those_after_a_seq(clock):
    j = journal(clock)
    made = [j.record(K.NODE_BACK, f"node{i:02d}", node=f"node{i:02d}") for i in range(10)]
    assert j.page(limit=3).entries == made[-3:]
    assert j.page(after_seq=2, limit=3).entries == made[2:5]
    assert j.page(after_seq=10).entries == []
    assert j.page(after_seq=0, limit=PAGE_MOST + 5).entries == made  # a limit past the most is the most


def test_a_page_stops_short_of_what_the_link_carries(clock):
    j = journal(clock, journal_entries=5000, journal_reason_chars=64 * 1024 * 1024)
    for i in range(4000):
        j.record(K.FAILED, f"m/{i}", "x" * 3000, node="node01")
    page = j.page(limit=PAGE_MOST)
    assert 0 < len(page.entries) < 4000
    assert sum(len(e.reason) for e in page.entries) <= PAGE_CHARS
    assert page.entries[-1].seq == 4000  # the newest are the ones kept
    assert len(to_wire(page)["entries"]) == len(page.entries)


def test_memory_holds_at_most_journal_entries_and_counts_the_rest(clock):
    j = journal(clock, journal_entries=100)
    for i in range(250):
        j.record(K.NODE_LOST, f"node{i}", node=f"node{i}")
    assert len(j) == 100
    page = j.page(limit=PAGE_MOST)
    assert [e.seq for e in page.entries] == list(range(151, 251))
    assert (page.newest_seq, page.dropped) == (250, 150)


def test_the_reasons_together_are_bounded_too(clock):
    j = journal(clock, journal_entries=10_000, journal_reason_chars=10_000)
    for i in range(50):
        j.record(K.FAILED, "m/0", "y" * 1000)
    assert len(j) == 10
    assert j.page().dropped == 40


def test_a_reason_is_cut_to_its_bound_and_every_entry_fits_its_record(clock):
    j = journal(clock)
    entry = j.record(K.ENGINE_BROKEN, "n" * 5000, "\ud800" + "z" * (REASON_CHARS * 3), node="n" * 900)
    assert len(entry.reason) == REASON_CHARS and entry.reason.endswith("…")
    assert from_wire(JournalEntry, to_wire(entry)) == entry


def test_a_flooding_node_is_counted_not_kept_and_its_next_entry_says_so(clock):
    j = journal(clock, journal_burst=5, journal_refill_s=10)
    kept = [j.record(K.NODE_UNREACHABLE, "bad", node="bad") for _ in range(1000)]
    other = j.record(K.NODE_LOST, "good", node="good")
    assert sum(e is not None for e in kept) == 5
    assert other is not None  # another node's history is not crowded out
    assert j.page().dropped == 995
    clock.advance(10)
    after = j.record(K.NODE_BACK, "bad", "heard again", node="bad")
    assert after.reason == "heard again (995 earlier entries of bad were not kept: more than history.journal_burst)"
    assert j.record(K.NODE_LOST, "bad", node="bad") is None  # one token grew back, and it is spent


def test_the_rate_is_per_node_whatever_the_subject(clock):
    j = journal(clock, journal_burst=2, journal_refill_s=60)
    assert j.record(K.FAILED, "echo/0", node="node01") is not None
    assert j.record(K.FAILED, "echo/1", node="node01") is not None
    assert j.record(K.FAILED, "echo/2", node="node01") is None
    assert j.record(K.RELOAD, "server.yaml") is not None
