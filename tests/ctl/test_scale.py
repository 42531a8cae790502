"""`llmgw ctl scale`: its words, its refusals, and a real cluster woken, pinned and let sleep again."""

from __future__ import annotations

import argparse
import json

import pytest
from twisted.internet import defer

from llmgw.answers import ScaleAnswer
from llmgw.ctl.scale import cmd_scale, text
from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.wire import to_wire
from tests.support.wait import wait_for


class Session:
    def __init__(self, answer):
        self.answer, self.calls = answer, []

    async def call(self, uri, *args):
        self.calls.append((uri, args))
        return to_wire(self.answer)


def args(**kw):
    return argparse.Namespace(**{**dict(model="qwen", count=None, auto=False, json=False), **kw})


def test_a_pin_is_asked_and_said_in_words(capsys):
    session = Session(ScaleAnswer("qwen", 0, 3, 2, True, 1, "pinned at 2 until the next reload"))
    assert defer.ensureDeferred(cmd_scale(session, args(count=2))).result == 0
    assert session.calls == [(uris.CP_SCALE, ("qwen", 2))]
    assert capsys.readouterr().out == ("qwen: 2 replica(s) wanted (min 0, max 3), 1 ready; "
                                       "pinned at 2 until the next reload\n")


def test_auto_asks_with_no_count():
    session = Session(ScaleAnswer("qwen", 0, 3, 0, False, 0, "scaled by its policy again, now 0"))
    defer.ensureDeferred(cmd_scale(session, args(auto=True)))
    assert session.calls == [(uris.CP_SCALE, ("qwen", None))]


@pytest.mark.parametrize("kw", [{}, {"count": 2, "auto": True}, {"count": -1}])
def test_a_count_and_auto_together_or_neither_or_negative_is_refused_before_asking(kw):
    session = Session(None)
    failed = defer.ensureDeferred(cmd_scale(session, args(**kw)))
    assert isinstance(failed.result.value, LlmgwError) and session.calls == []
    failed.addErrback(lambda f: None)


def test_a_model_name_from_the_server_is_escaped():
    assert "\\x1b" in text(ScaleAnswer("q\x1b[31m", 0, 1, 0, False, 0, ""))


CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo:
    profile: sim-fast
    replicas: {min: 0, max: 2}
    scale: {idle_s: 2}
"""


def replicas(cluster) -> list[dict]:
    out = cluster.ctl("replicas", "--json")
    return json.loads(out.stdout) if out.returncode == 0 else []


@pytest.mark.slow
@pytest.mark.integration
def test_a_sleeping_model_pinned_wakes_and_given_back_sleeps_again(cluster):
    cluster.write_server_config(CATALOG)
    cluster.start_server()
    cluster.start_agent("node01")

    def sleeping():
        found = replicas(cluster)
        return found and found[0]["state"] == "sleeping" and found[0]

    asleep = wait_for(sleeping, 60, "echo to be asleep", interval=0.3, detail=cluster.logs)
    assert asleep["replica"] == "echo/0" and asleep["reason"].startswith("idle: scaled to zero")
    pinned = cluster.ctl("scale", "echo", "2", "--json")
    assert pinned.returncode == 0, pinned.stderr
    assert json.loads(pinned.stdout)["target"] == 2
    wait_for(lambda: [r["state"] for r in replicas(cluster)] == ["ready", "ready"], 60, "two ready replicas",
             interval=0.3, detail=cluster.logs)
    refused = cluster.ctl("scale", "echo", "3")
    assert refused.returncode != 0 and "between 0 and 2" in refused.stderr
    assert cluster.ctl("scale", "echo", "--auto").returncode == 0
    wait_for(sleeping, 60, "echo to sleep again after idle_s", interval=0.3, detail=cluster.logs)
    kinds = [e["kind"] for e in json.loads(cluster.ctl("events", "--json", "--model", "echo").stdout)]
    assert "scaled up" in kinds and "slept" in kinds
