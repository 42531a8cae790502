"""One contract, run against the FakeBackend and against WampBackend on a real hub, so the fake cannot drift."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from llmgw.answers import CordonAnswer, DrainAnswer
from llmgw.history import Figures, JournalEntry, JournalKind, JournalPage, Scope
from llmgw.huburl import parse_hub_url
from llmgw.states import NodeState, ReplicaState
from llmgw.tlsfiles import TLSFiles
from llmgw.tui.backend import ActionFailed, LogsUnavailable, NotConnected, WampBackend
from llmgw.tui.fake import FakeBackend, node_view, replica_view
from llmgw.views import ReplicaView
from tests.support.wait import until_async

pytestmark = pytest.mark.asyncio(loop_scope="session")

CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 1}
"""


class Recorder:
    def __init__(self):
        self.events: list[tuple] = []

    def link_up(self):
        self.events.append(("up",))

    def link_down(self, reason):
        self.events.append(("down", reason))

    def node_changed(self, view):
        self.events.append(("node", view))

    def shard_changed(self, shard_id):
        self.events.append(("shard", shard_id))

    def journal_entry(self, entry):
        self.events.append(("journal", entry))

    async def until(self, predicate, what: str, timeout: float = 20.0):
        """The latest event that satisfies *predicate*, once there is one."""
        found = await until_async(lambda: [e for e in self.events if predicate(e)], what, timeout,
                                  detail=lambda: f"events: {self.events[-10:]}")
        return found[-1]


@pytest_asyncio.fixture(loop_scope="session", params=["fake", pytest.param("wamp", marks=pytest.mark.integration)])
async def backend(request, cluster, reactor):
    if request.param == "fake":
        yield FakeBackend([node_view("node01")], [replica_view("echo/0", "node01")],
                          logs={("node01", None): ["a line"]})
        return

    def start():
        cluster.write_server_config(CATALOG)
        cluster.start_server()
        cluster.start_agent("node01")
        cluster.wait_node("node01", "ready")

    await asyncio.to_thread(start)
    pki = cluster.pki
    yield WampBackend(reactor, parse_hub_url(cluster.hub),
                      TLSFiles(str(pki / "ca.crt"), str(pki / "alice.crt"), str(pki / "alice.key")))


async def test_the_link_comes_up_and_a_snapshot_has_the_views(backend):
    listener = Recorder()
    backend.subscribe(listener)
    await backend.start()
    try:
        await listener.until(lambda e: e[0] == "up", "link_up")
        nodes, replicas = await backend.snapshot()
        (node,) = [n for n in nodes if n.id == "node01"]
        assert type(node.state) is NodeState and node.state == NodeState.READY
        assert node.seen_ago_s is not None and node.address and node.engines
        assert [r.replica for r in replicas] == ["echo/0"]
        assert all(isinstance(r, ReplicaView) and type(r.state) is ReplicaState for r in replicas)
        assert all(isinstance(r, ReplicaView) for r in await backend.replicas())
    finally:
        await backend.stop()


async def test_cordon_and_uncordon_answer_and_send_the_nodes_new_view(backend):
    listener = Recorder()
    backend.subscribe(listener)
    await backend.start()
    try:
        await listener.until(lambda e: e[0] == "up", "link_up")
        assert await backend.cordon("node01") == CordonAnswer("node01", True)
        await listener.until(lambda e: e[0] == "node" and e[1].id == "node01" and e[1].cordoned, "a cordoned view")
        assert await backend.uncordon("node01") == CordonAnswer("node01", False)
        await listener.until(lambda e: e[0] == "node" and e[1].cordoned is False, "an uncordoned view")
        drained = await backend.drain("node01")
        assert isinstance(drained, DrainAnswer) and drained.node == "node01" and drained.cordoned is True
        assert isinstance(drained.stopped, list)
        with pytest.raises(ActionFailed, match="nope"):
            await backend.cordon("nope")
    finally:
        await backend.stop()


async def test_the_journal_and_figures_are_records_and_a_cordon_is_recorded_and_published(backend):
    listener = Recorder()
    backend.subscribe(listener)
    await backend.start()
    try:
        await listener.until(lambda e: e[0] == "up", "link_up")
        page = await backend.events()
        assert isinstance(page, JournalPage) and all(isinstance(e, JournalEntry) for e in page.entries)
        assert JournalKind.SERVER_STARTED in [e.kind for e in page.entries]
        assert await backend.cordon("node01") == CordonAnswer("node01", True)
        _, entry = await listener.until(lambda e: e[0] == "journal" and e[1].kind == JournalKind.NODE_CORDONED,
                                        "the cordon on llmgw.event.journal")
        assert entry.subject == "node01" and entry.seq > max(e.seq for e in page.entries)
        mine = await backend.events(node="node01")
        assert entry.seq in [e.seq for e in mine.entries] and all("node01" in (e.node, e.subject) for e in mine.entries)
        figures = await backend.figures(Scope.NODE, "node01")
        assert isinstance(figures, Figures) and figures.bucket_s > 0
        assert all(s.scope == Scope.NODE and s.subject == "node01" for s in figures.series)
    finally:
        await backend.stop()


async def test_logs_are_lines_or_a_reason(backend):
    listener = Recorder()
    backend.subscribe(listener)
    await backend.start()
    try:
        await listener.until(lambda e: e[0] == "up", "link_up")
        try:
            lines = await backend.logs("node01", None, 10)
        except LogsUnavailable as e:
            assert str(e)
        else:
            assert lines and all(isinstance(line, str) for line in lines)
    finally:
        await backend.stop()


async def test_after_stop_requests_say_not_connected(backend):
    listener = Recorder()
    backend.subscribe(listener)
    await backend.start()
    await listener.until(lambda e: e[0] == "up", "link_up")
    await backend.stop()
    with pytest.raises(NotConnected):
        await backend.snapshot()
