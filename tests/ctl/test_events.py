"""`llmgw ctl events`: ages, lines a node cannot steer, -f without gaps or repeats, and a real cluster's history."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal

import pytest
from twisted.internet import defer

from llmgw.ctl.events import cmd_events, line, seconds
from llmgw.errors import LlmgwError
from llmgw.history import JournalEntry, JournalKind, JournalPage
from llmgw.link import uris
from llmgw.wire import to_wire
from tests.support.wait import wait_for

K = JournalKind


@pytest.mark.parametrize("text, expected", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600)])
def test_an_age_in_its_units(text, expected):
    assert seconds(text) == expected


@pytest.mark.parametrize("text", ["", "2 hours", "-1h", "h", "1w"])
def test_an_age_that_is_not_one_says_how_to_write_it(text):
    with pytest.raises(LlmgwError, match="write it like 90s, 30m, 2h or 1d"):
        seconds(text)


def test_a_line_escapes_every_word_a_node_sent():
    entry = JournalEntry(1, 1_800_000_000, K.EXITED, "echo/0", "killed\x1b[2J by \u202esignal\n9", node="node01")
    shown = line(entry)
    assert shown.isprintable()
    assert "exited  echo/0 on node01: killed\\x1b[2J by \\u202esignal\\n9" in shown


def args(**kw):
    base = dict(node=None, model=None, since=None, limit=1000, follow=False, json=False)
    return argparse.Namespace(**{**base, **kw})


def entry(seq, node="node01", kind=K.NODE_LOST):
    return JournalEntry(seq, 1_800_000_000 + seq, kind, node, f"reason {seq}", node=node)


class Session:
    """A hub session's call and subscribe: an entry is published while the page is read."""

    def __init__(self, page: JournalPage, during: list[JournalEntry]):
        self.page, self.during = page, during
        self.calls, self.handler = [], None

    async def subscribe(self, handler, topic):
        assert topic == uris.EVENT_JOURNAL
        self.handler = handler

    async def call(self, uri, **query):
        self.calls.append((uri, query))
        for e in self.during:
            self.handler(to_wire(e))
        return to_wire(self.page)


def test_the_page_is_asked_for_with_the_filters_and_printed_as_json(capsys):
    session = Session(JournalPage([entry(1), entry(2)], 2), [])
    done = defer.ensureDeferred(cmd_events(session, args(node="node01", since="2h", json=True)))
    assert done.result == 0
    assert session.calls == [(uris.CP_EVENTS, {"limit": 1000, "node": "node01", "since": 7200.0})]
    assert [e["seq"] for e in json.loads(capsys.readouterr().out)] == [1, 2]


def test_follow_subscribes_first_and_prints_each_entry_once_in_order(capsys):
    # Entry 3 was published while the page was read and is in it; 4 and 5 came after; node02's is not asked for.
    session = Session(JournalPage([entry(2), entry(3)], 3), [entry(3), entry(5), entry(4), entry(6, "node02")])
    following = defer.ensureDeferred(cmd_events(session, args(node="node01", follow=True, json=True)))
    session.handler(to_wire(entry(5)))
    session.handler(to_wire(entry(7)))
    session.handler({"seq": "garbage"})  # what this ctl cannot read is skipped
    following.cancel()
    following.addErrback(lambda f: f.trap(defer.CancelledError))
    printed = [json.loads(text)["seq"] for text in capsys.readouterr().out.splitlines()]
    assert printed == [2, 3, 4, 5, 7]


CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 1}
"""


def events(cluster, *more) -> list[dict]:
    out = cluster.ctl("events", "--json", *more)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.integration
def test_a_killed_engine_shows_in_ctl_events_with_its_reason_and_survives_a_restart(cluster):
    cluster.write_server_config(CATALOG)
    cluster.start_server()
    cluster.start_agent("node01")

    def ready_pid():
        out = cluster.ctl("replicas", "--json")
        found = [r for r in json.loads(out.stdout or "[]") if r["state"] == "ready"] if out.returncode == 0 else []
        return found and found[0]["shards"][0]["pid"]

    pid = wait_for(ready_pid, 60, "echo/0 to be ready", interval=0.3, detail=cluster.logs)
    os.killpg(pid, signal.SIGKILL)

    def exited():
        return [e for e in events(cluster, "--model", "echo") if e["kind"] == "exited"]

    (gone,) = wait_for(exited, 30, "ctl events to show the engine exited", interval=0.3, detail=cluster.logs)
    assert (gone["subject"], gone["node"], gone["replica"]) == ("echo/0", "node01", "echo/0")
    assert gone["reason"].startswith("killed by signal 9 (SIGKILL) (it was ready)")
    before = events(cluster)
    kinds = [e["kind"] for e in before]
    assert kinds.index("server started") < kinds.index("node registered") < kinds.index("exited")
    assert [e["seq"] for e in before] == sorted(e["seq"] for e in before)
    text = cluster.ctl("events", "--node", "node01").stdout
    assert "exited  echo/0 on node01: killed by signal 9 (SIGKILL)" in text

    cluster.server.stop()
    cluster.start_server()

    def restarted():
        found = events(cluster)
        return sum(e["kind"] == "server started" for e in found) == 2 and found

    after = wait_for(restarted, 30, "the restarted server to answer ctl events", interval=0.3)
    assert after[:len(before)] == before  # what the first server recorded, as it recorded it
    started = [e for e in after if e["kind"] == "server started"][-1]
    assert started["seq"] > before[-1]["seq"]
    read_back = re.search(rf"(\d+) entries read back from {re.escape(str(cluster.base / 'history'))}$", started["reason"])
    assert read_back and int(read_back.group(1)) >= len(before), started["reason"]
