"""The journal and the figures on the admin page: the cluster's newest events and charts, a node's and a replica's own."""

from __future__ import annotations

import re

import pytest
import pytest_twisted

from llmgw.admin import history
from llmgw.history import JournalKind, Scope
from tests.admin.conftest import Client
from tests.support import histories

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")


def event_rows(body: str) -> list[tuple[str, str]]:
    """(seq, kind) of each events row, top to bottom."""
    return re.findall(r'<tr data-seq="(\d+)" data-kind="([^"]+)">', body)


@pytest_twisted.ensureDeferred
async def test_the_cluster_page_lists_the_newest_events_first_with_the_nodes_words_escaped(admin, source):
    body = (await Client(admin.url).get("/")).body
    assert body.index("<h2>Replicas") < body.index("<h2>Events") < body.index("<h2>Last hour")
    assert [int(seq) for seq, _ in event_rows(body)] == list(range(9, 0, -1))
    assert ("5", "exited") in event_rows(body)
    assert "exited 137 (killed): &lt;script&gt;alert('pwned')&lt;/script&gt;\\x1b[2J\\u202e" in body
    assert "\x1b" not in body and "\u202e" not in body
    assert '<span class="kind bad">node lost</span>' in body and '<span class="kind sleeping">slept</span>' in body
    assert source.asked_events[-1] == {"node": None, "model": None}


@pytest_twisted.ensureDeferred
async def test_the_cluster_page_shows_at_most_its_share_of_events_and_what_the_journal_let_go_of(admin, source):
    many = [histories.entry(i, 3600 - i, JournalKind.READY, "qwen/0", replica="qwen/0") for i in range(1, 41)]
    source.journal = histories.JournalPage(entries=many, newest_seq=40, dropped=7)
    body = (await Client(admin.url).get("/")).body
    rows = event_rows(body)
    assert len(rows) == 25 and rows[0][0] == "40" and rows[-1][0] == "16"
    assert "15 older not shown; llmgw ctl events lists them all" in body
    assert "the journal has let go of 7 older events (its bounds)" in body


@pytest_twisted.ensureDeferred
async def test_a_nodes_page_shows_its_own_events_and_charts_and_a_replicas_its_own(admin, source):
    client = Client(admin.url)
    node = (await client.get("/node?id=cpu07")).body
    assert [kind for _, kind in event_rows(node)] == ["slept", "node lost"]
    assert source.asked_events[-1] == {"node": "cpu07", "model": None}
    assert source.asked_figures[-1] == (Scope.NODE, "cpu07")
    assert "<figure" not in node  # cpu07 sent no figures: no empty charts
    gpu01 = (await client.get("/node?id=gpu01")).body
    assert gpu01.count('<figure class="chart" data-scope="node" data-subject="gpu01"') == 3
    assert gpu01.index("<h2>Events") < gpu01.index("<h2>Last hour") < gpu01.index("<h2>Log:")
    replica = (await client.get("/replica?id=qwen/0")).body
    assert [seq for seq, _ in event_rows(replica)] == ["6", "5", "4", "3"]
    assert source.asked_events[-1] == {"node": None, "model": "qwen"}
    assert replica.count('data-subject="qwen" data-series=') == 6
    assert "<h2>Last hour of model qwen</h2>" in replica


@pytest_twisted.ensureDeferred
async def test_a_journal_or_figures_the_control_plane_cannot_give_are_said_and_the_page_still_shows(admin, source):
    source.events_error = "no callee registered for procedure <llmgw.cp.events>"
    source.figures_error = "llmgw.cp.figures: buckets must be a whole number"
    client = Client(admin.url)
    for path in ("/", "/node?id=gpu01", "/replica?id=qwen/0"):
        answer = await client.get(path)
        assert answer.code == 200, path
        assert "the events could not be read: no callee registered for procedure &lt;llmgw.cp.events&gt;" in answer.body
        assert "the figures could not be read: llmgw.cp.figures: buckets" in answer.body, path


def test_an_entry_is_a_nodes_when_it_names_the_node_as_its_subject_or_its_node():
    page = histories.journal()
    assert [e.seq for e in history.mine(page, node="gpu01")] == [2, 3, 4, 5, 6]
    assert [e.seq for e in history.mine(page, replica="llama/0")] == [8]
    assert [e.seq for e in history.mine(page, model="qwen")] == [3, 4, 5, 6]
    assert history.stamp(histories.NOW - 60, histories.NOW) == "14:12:20"
    assert history.stamp(histories.NOW - 86_400, histories.NOW) == "2026-09-20 14:13"
