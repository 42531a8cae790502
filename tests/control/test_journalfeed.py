"""What the journal records of the fleet's events, driven through a real Fleet, and what llmgw.cp.events answers."""

from __future__ import annotations

import attrs
import pytest
from autobahn.wamp.exception import ApplicationError
from twisted.internet.task import Clock

from llmgw.config.history import HistorySettings
from llmgw.control.fleet import Fleet
from llmgw.control.journal import Journal
from llmgw.control.journalfeed import JournalFeed, JournalProcedures, attach
from llmgw.history import PAGE_MOST, JournalKind, JournalPage
from llmgw.link import uris
from llmgw.records import EngineInfo, Heartbeat, Inventory, ShardSpec, ShardStatus
from llmgw.states import EngineState, ShardState
from llmgw.wire import from_wire

K = JournalKind


@pytest.fixture
def clock():
    c = Clock()
    c.advance(1_800_000_000)
    return c


@pytest.fixture
def journal(clock):
    return Journal(clock, HistorySettings(journal_refill_s=0), None)


@pytest.fixture
def fleet(clock, journal):
    return Fleet(clock, JournalFeed(journal).observe, unreachable_after=15, lost_after=60)


def inventory(**kw):
    return Inventory(node_id="node01", address="10.0.0.5", agent_version="0.1.0", **kw)


def said(journal, **query):
    return [(e.kind, e.subject, e.reason) for e in journal.page(**query).entries]


def test_a_node_registered_unreachable_lost_and_back(fleet, clock, journal):
    fleet.register("node01", 1, inventory())
    clock.advance(16)
    fleet.check()
    clock.advance(50)
    fleet.check()
    fleet.register("node01", 2, inventory())
    fleet.heartbeat("node01", 2, Heartbeat())  # nothing new: nothing recorded
    fleet.link_closed(2)
    fleet.register("node01", 3, inventory())
    assert said(journal) == [
        (K.NODE_REGISTERED, "node01", "from 10.0.0.5, agent 0.1.0"),
        (K.NODE_UNREACHABLE, "node01", "no heartbeat for 16 s"),
        (K.NODE_LOST, "node01", "no heartbeat for 66 s"),
        (K.NODE_BACK, "node01", "registered again after being lost, from 10.0.0.5, agent 0.1.0"),
        (K.NODE_UNREACHABLE, "node01", "its link to the hub closed"),
        (K.NODE_BACK, "node01", "registered again after being unreachable, from 10.0.0.5, agent 0.1.0"),
    ]
    assert {e.node for e in journal.page().entries} == {"node01"}


def test_a_node_heard_again_by_its_heartbeat_is_back(fleet, clock, journal):
    fleet.register("node01", 1, inventory())
    clock.advance(16)
    fleet.check()
    fleet.heartbeat("node01", 1, Heartbeat())
    assert said(journal)[-1] == (K.NODE_BACK, "node01", "heard again after being unreachable")


def test_cordon_uncordon_and_forgotten(fleet, journal):
    fleet.register("node01", 1, inventory())
    fleet.set_cordoned("node01", True)
    fleet.set_cordoned("node01", False)
    fleet.forget_node("node01")
    assert [k for k, _, _ in said(journal)] == [K.NODE_REGISTERED, K.NODE_CORDONED, K.NODE_UNCORDONED,
                                                K.NODE_FORGOTTEN]
    fleet.register("node01", 2, inventory())  # a machine onboarded again is new
    assert said(journal)[-1][0] == K.NODE_REGISTERED


def test_engine_builds_broken_and_installed_in_the_nodes_words(fleet, journal):
    sim = EngineInfo("sim", "0.1.0", state=EngineState.INSTALLED)
    llama = EngineInfo("llama.cpp", "b6000", state=EngineState.INSTALLING, reason="downloading (16 MB)")
    fleet.register("node01", 1, inventory(engines=[sim, llama]))
    assert said(journal) == [(K.NODE_REGISTERED, "node01", "from 10.0.0.5, agent 0.1.0")]  # what it had is no news
    broken = attrs.evolve(llama, state=EngineState.BROKEN, reason="needs libgomp.so.1: apt-get install libgomp1")
    fleet.heartbeat("node01", 1, Heartbeat(engines=[sim, broken]))
    fleet.heartbeat("node01", 1, Heartbeat(engines=[sim, attrs.evolve(llama, state=EngineState.INSTALLED,
                                                                      reason=None)]))
    vllm = EngineInfo("vllm", "0.9.1", state=EngineState.INSTALLED)
    fleet.heartbeat("node01", 1, Heartbeat(engines=[sim, attrs.evolve(llama, state=EngineState.INSTALLED), vllm]))
    assert said(journal)[1:] == [
        (K.ENGINE_BROKEN, "node01", "llama.cpp b6000: needs libgomp.so.1: apt-get install libgomp1"),
        (K.ENGINE_INSTALLED, "node01", "llama.cpp b6000 (was broken)"),
        (K.ENGINE_INSTALLED, "node01", "vllm 0.9.1"),
    ]


def spec(replica="echo/0"):
    return ShardSpec(shard_id=f"{replica}/0", replica_id=replica, model=replica.split("/")[0], engine="sim")


def test_a_shard_that_exited_while_serving_and_one_that_never_came_up(fleet, journal):
    fleet.register("node01", 1, inventory())
    for s in (spec("echo/0"), spec("echo/1")):
        fleet.place("node01", s)
    fleet.shard_status("node01", ShardStatus(spec("echo/0"), ShardState.STARTING, pid=4242))
    fleet.shard_status("node01", ShardStatus(spec("echo/0"), ShardState.READY, pid=4242,
                                             endpoint="http://10.0.0.5:20001"))
    fleet.shard_status("node01", ShardStatus(spec("echo/0"), ShardState.FAILED, pid=4242,
                                             reason="killed by signal 9 (SIGKILL)",
                                             output_tail=["loading", "", "serving on :20001"]))
    fleet.shard_status("node01", ShardStatus(spec("echo/0"), ShardState.FAILED, reason="again"))  # still failed
    fleet.shard_status("node01", ShardStatus(spec("echo/1"), ShardState.FAILED, reason="exited with code 2",
                                             output_tail=["\x1b[31merror: bad flag\x1b[0m"]))
    entries = journal.page(model="echo").entries
    assert [(e.kind, e.subject, e.node, e.replica, e.reason) for e in entries] == [
        (K.EXITED, "echo/0", "node01", "echo/0",
         "killed by signal 9 (SIGKILL) (it was ready); last output: loading | serving on :20001"),
        (K.FAILED, "echo/1", "node01", "echo/1", "exited with code 2; last output: \x1b[31merror: bad flag\x1b[0m"),
    ]
    fleet.forget_shard("node01", "echo/0/0")  # removed: a new shard of the slot starts afresh
    fleet.place("node01", spec("echo/0"))
    fleet.shard_status("node01", ShardStatus(spec("echo/0"), ShardState.FAILED, reason="exited with code 1"))
    assert journal.page().entries[-1].kind == K.FAILED


class FakeSession:
    """What ``attach`` and ``JournalProcedures`` use of a control session."""

    def __init__(self, catalog=None):
        self.event_listeners, self.extensions, self.reload_listeners = [], [], []
        self.catalog = catalog
        self.registered, self.published = {}, []
        self.attached = True

    async def register(self, procedure, uri):
        self.registered[uri] = procedure

    def is_attached(self):
        return self.attached

    def publish(self, topic, payload):
        self.published.append((topic, payload))


def test_attach_records_the_start_answers_pages_and_publishes_each_entry(clock, tmp_path):
    from twisted.internet import defer

    journal = Journal(clock, HistorySettings(), str(tmp_path))
    session = FakeSession()
    attach(session, journal)
    assert session.journal is journal
    (start,) = journal.page().entries
    assert (start.kind, start.reason) == (K.SERVER_STARTED, f"llmgw 0.1.0; 0 entries read back from {tmp_path}")
    (extension,) = session.extensions
    defer.ensureDeferred(extension.register(session))
    defer.ensureDeferred(extension.register(session))  # a session that joins again publishes each entry once
    session.event_listeners[0]("node", "node01", "not an event")  # ignored
    entry = journal.record(K.NODE_LOST, "node01", "silent", node="node01")
    assert session.published == [(uris.EVENT_JOURNAL, {**_wire(entry)})]
    session.attached = False
    journal.record(K.NODE_BACK, "node01", node="node01")  # not attached: not published, still kept
    assert len(session.published) == 1
    page = from_wire(JournalPage, session.registered[uris.CP_EVENTS](node="node01"))
    assert [e.kind for e in page.entries] == [K.NODE_LOST, K.NODE_BACK] and page.newest_seq == 3


def _wire(entry):
    from llmgw.wire import to_wire

    return to_wire(entry)


@pytest.mark.parametrize("query, field", [
    ({"node": 5}, "node"), ({"node": "n" * 2000}, "node"), ({"model": ["a"]}, "model"),
    ({"since": -1}, "since"), ({"since": "2h"}, "since"), ({"since": True}, "since"), ({"since": 2**41}, "since"),
    ({"after_seq": -1}, "after_seq"), ({"after_seq": 1.5}, "after_seq"),
    ({"limit": 0}, "limit"), ({"limit": PAGE_MOST + 1}, "limit"), ({"limit": "all"}, "limit"),
])
def test_a_query_out_of_bounds_is_refused_naming_its_field(journal, query, field):
    with pytest.raises(ApplicationError) as refused:
        JournalProcedures(journal).events(**query)
    assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
    assert refused.value.args[0].startswith(f"llmgw.cp.events: {field} ")


def test_a_reload_is_recorded_with_what_it_changed(clock, tmp_path):
    from llmgw.config.server import load_server_config
    from llmgw.control.catalog import Catalog
    from llmgw.control.reload import reload_all

    (tmp_path / "pki").mkdir()
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / "pki" / name).write_text("")
    path = tmp_path / "server.yaml"
    base = 'listen: {link: "ssl:7443"}\ntls: {ca: pki/ca.crt, cert: pki/server.crt, key: pki/server.key}\n'
    path.write_text(base)
    catalog = Catalog(load_server_config(path))
    journal = Journal(clock, HistorySettings(), None)
    session = FakeSession(catalog)
    attach(session, journal)
    path.write_text(base + "profiles: {fast: {engine: sim}}\nmodels: {echo: {profile: fast}}\n")
    assert reload_all(catalog, session.reload_listeners).refused is None
    entry = journal.page().entries[-1]
    assert (entry.kind, entry.subject, entry.reason) == (K.RELOAD, "server.yaml", f"{path}: model echo added")
    assert reload_all(catalog, session.reload_listeners).refused is None
    assert journal.page().entries[-1].reason == f"{path}: no changes"


def test_the_feed_lets_go_of_forgotten_nodes_and_removed_shards(fleet, journal):
    feed = JournalFeed(journal)
    fleet._emit = feed.observe
    fleet.register("node01", 1, inventory())
    fleet.place("node01", spec())
    fleet.shard_status("node01", ShardStatus(spec(), ShardState.STARTING))
    assert feed._shards and feed._nodes
    fleet.forget_node("node01")
    assert (feed._shards, feed._nodes) == ({}, {})
