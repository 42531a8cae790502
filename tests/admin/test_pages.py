"""What the admin page shows, from views built by the real fleet out of recorded inventories."""

from __future__ import annotations

import json
import re

import attrs
import pytest
import pytest_twisted

from llmgw.records import EngineInfo
from llmgw.states import EngineState
from tests.admin.conftest import Client
from tests.support.reportedfleet import gpu_node

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")


def section(body: str, heading: str) -> str:
    start = body.index(f"<h2>{heading}")
    end = body.find("<h2>", start + 1)
    return body[start:end if end >= 0 else len(body)]


@pytest_twisted.ensureDeferred
async def test_the_cluster_page_puts_warnings_first_and_says_dash_for_what_was_not_reported(admin, clock, source):
    clock.advance(20)
    source.fleet.check()  # cpu07 has been silent: unreachable
    body = (await Client(admin.url).get("/")).body
    assert body.index("<h2>Warnings") < body.index("<h2>Nodes") < body.index("<h2>Replicas")
    warnings = section(body, "Warnings")
    assert "cpu07</a>: unreachable" in warnings
    assert "libgomp" in warnings  # gpu01's broken llama.cpp build, in its own words
    (cpu07,) = re.findall(r'<tr><td data-label="node"><a href="/node\?id=cpu07">.*?</tr>', body)
    for label in ("address", "memory", "gpus", "disk", "engines"):
        assert f'data-label="{label}">-</td>' in cpu07, label
    assert "busy 87%, -" in body  # gpu01's second card did not say how busy it is: no figure is made up


@pytest_twisted.ensureDeferred
async def test_a_node_that_does_not_answer_for_its_logs_still_has_its_page(admin):
    answer = await Client(admin.url).get("/node?id=cpu07")
    assert answer.code == 200
    assert "cpu07: agent too old or not answering (wamp.error.timeout)" in answer.body
    assert "aarch64" in answer.body


@pytest_twisted.ensureDeferred
async def test_the_node_page_offers_the_sources_the_node_listed_and_follow_mode(admin, source):
    body = (await Client(admin.url).get("/node?id=gpu01&source=qwen/0/0&follow=1&n=50")).body
    assert 'href="/node?id=gpu01&amp;source=agent&amp;n=50"' in body
    assert 'data-follow="/logs.json?node=gpu01&amp;source=qwen%2F0%2F0&amp;n=50"' in body
    assert source.asked[-1] == ("gpu01", "qwen/0/0", 50)
    logs = json.loads((await Client(admin.url).get("/logs.json?node=gpu01&source=qwen/0/0&n=1")).body)
    assert logs["lines"] == [source.lines[-1]] and logs["sources"] == ["agent", "qwen/0/0"]


@pytest_twisted.ensureDeferred
async def test_an_installing_engine_has_a_bar_the_script_can_follow(admin, source):
    installing = EngineInfo(name="llama.cpp", version="b7000", state=EngineState.INSTALLING, origin="server.yaml")
    inventory = gpu_node()
    source.fleet.register("gpu01", 1, attrs.evolve(inventory, engines=[*inventory.engines, installing]))
    client = Client(admin.url)
    body = (await client.get("/")).body
    assert '<progress data-progress="engine:gpu01:llama.cpp:b7000">' in body
    bars = json.loads((await client.get("/progress.json")).body)["bars"]
    assert bars == {"engine:gpu01:llama.cpp:b7000": {"done": None, "total": None, "words": "installing"}}


@pytest_twisted.ensureDeferred
async def test_the_replica_page_shows_its_ranks_and_rank_0s_log(admin, source):
    body = (await Client(admin.url).get("/replica?id=qwen/0")).body
    ranks = section(body, "Ranks")
    assert 'data-label="shard">qwen/0/0</td>' in ranks and 'href="/node?id=gpu01"' in ranks
    assert source.asked[-1][:2] == ("gpu01", "qwen/0/0")
    assert "http://10.0.0.5:8000" in body


@pytest_twisted.ensureDeferred
async def test_the_confirmation_names_what_a_drain_stops_and_carries_the_token(admin):
    answer = await Client(admin.url).get("/confirm?node=gpu01&action=drain")
    assert "Drain gpu01: cordon gpu01 and stop its shards" in answer.body
    assert "Shards on it now: qwen/0/0." in answer.body
    assert answer.csrf() and 'action="/action"' in answer.body and 'method="post"' in answer.body


def test_a_rank_not_started_says_so_and_what_it_waits_for():
    from twisted.web.template import flattenString

    from llmgw.admin import pages
    from llmgw.views import ReplicaView, ShardView

    replica = ReplicaView("big", "big/0", "starting", nodes=["node01", "node02"], shards=[
        ShardView("big/0/0", node="node01", state="starting", rank=0, started=True, reason="loading weights"),
        ShardView("big/0/1", node="node02", state="starting", rank=1, started=False,
                  waiting="waiting for rank 0's rendezvous on node01", reason="placed")])
    out = []
    flattenString(None, pages.replica_page("", None, replica, "", 10)).addCallback(out.append)
    ranks = section(out[0].decode(), "Ranks")
    assert '<td data-label="state">not started</td>' in ranks
    assert "waiting for rank 0&#x27;s rendezvous on node01" in ranks or "waiting for rank 0's rendezvous on node01" in ranks
    assert ">placed<" not in ranks and "loading weights" in ranks
