"""The control plane's procedures, reached through the hub as a node and an operator would.

Sessions are attached in process (the hub's authorization looks only at the
role, the same rules as over TLS), so these tests are about what the control
plane does with what it is sent — including what a misbehaving agent sends.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import ComponentConfig
from twisted.internet import defer, reactor, task
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from llmgw.answers import WeightsAnswer
from llmgw.config.catalog import Model, Profile
from llmgw.control.catalog import Entry
from llmgw.control.fleet import Fleet
from llmgw.control.plane import ControlSession
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.records import CollectResult, Inventory, ShardSpec, ShardStatus, WeightsFile, WeightsReport
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER
from llmgw.states import NodeState
from llmgw.views import EndpointEntry, EndpointTable
from llmgw.weightnames import cache_name
from llmgw.wire import from_wire, to_wire
from tests.link.conftest import Joined
from tests.support.wait import until


@pytest.fixture
def clock():
    return task.Clock()


@pytest_twisted.async_yield_fixture
async def plane(clock):
    hub = Hub(reactor)
    control = ControlSession(ComponentConfig(realm=uris.REALM), lambda emit: Fleet(clock, emit))
    joined = defer.Deferred()
    control.on("ready", lambda *a: joined.called or joined.callback(None))  # after onJoin has registered
    hub.attach_local(control)
    await joined.addTimeout(5, reactor)

    async def attach(authid, role):
        client = Joined(ComponentConfig(realm=uris.REALM))
        hub.attach_local(client, authid=authid, role=role)
        return await client.ready.addTimeout(5, reactor)

    control.attach = attach
    yield control


@pytest_twisted.ensureDeferred
async def test_a_node_registers_under_its_own_name_whatever_the_payload_says(plane):
    node = await plane.attach("node01", ROLE_NODE)
    result = await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node99", memory_total_bytes=8)))
    assert result == {"node_id": "node01"}
    assert list(plane.fleet.nodes) == ["node01"]
    assert plane.fleet.nodes["node01"].inventory.node_id == "node01"


@pytest_twisted.ensureDeferred
async def test_a_node_session_joining_counts_as_an_arrival_before_it_registers(plane, clock):
    """The hub's on_join for a node moves the fleet's last arrival (what a restart's settling waits on); others' do not."""
    assert plane.fleet.last_arrival is None
    clock.advance(7)
    alice = await plane.attach("alice", ROLE_OPERATOR)
    await alice.call(uris.CP_STATUS)  # answered after the control plane has had the hub's on_join for alice
    assert plane.fleet.last_arrival is None
    await plane.attach("node01", ROLE_NODE)
    await until(lambda: plane.fleet.last_arrival == 7.0, "node01's join counted")
    assert plane.fleet.nodes == {}
    clock.advance(3)
    node = await plane.attach("node02", ROLE_NODE)
    await until(lambda: plane.fleet.last_arrival == 10.0, "node02's join counted")
    clock.advance(1)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node02")))
    assert plane.fleet.last_arrival == 11.0


@pytest.mark.parametrize(
    "payload, message",
    [
        ("not a mapping", "Inventory: expected a mapping, got str"),
        ({"node_id": "node01", "memory_total_bytes": "lots"}, "Inventory.memory_total_bytes: expected an integer, got str"),
        ({"node_id": "node01", "gpus": [{"index": "0"}]}, "Inventory.gpus[0].index: expected an integer, got str"),
        ({"node_id": "node01", "gpus": {"index": 0}}, "Inventory.gpus: expected a list, got dict"),
        ({"node_id": "node01", "cpu": {"avx2": "yes"}}, "Inventory.cpu.avx2: expected bool, got str"),
        ({"node_id": "node01", "labels": {"rack": 5}}, "Inventory.labels.rack: expected str, got int"),
        ({"memory_total_bytes": 1}, "Inventory.node_id: missing"),
        ({"node_id": "node01", "memory_total_bytes": True}, "Inventory.memory_total_bytes: expected an integer, got bool"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_malformed_register_is_refused_naming_the_field_and_changes_nothing(plane, payload, message):
    node = await plane.attach("node01", ROLE_NODE)
    with pytest.raises(ApplicationError) as refused:
        await node.call(uris.AGENT_REGISTER, payload)
    assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
    assert refused.value.args[0].startswith(message)
    assert plane.fleet.nodes == {}


@pytest_twisted.ensureDeferred
async def test_a_heartbeat_before_register_asks_the_agent_to_register(plane):
    node = await plane.attach("node01", ROLE_NODE)
    warnings = []

    def observe(event):
        if event.get("log_level") in (LogLevel.warn, LogLevel.error, LogLevel.critical):
            warnings.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        with pytest.raises(ApplicationError) as refused:
            await node.call(uris.AGENT_HEARTBEAT, {"memory_available_bytes": 1})
    finally:
        globalLogPublisher.removeObserver(observe)
    assert refused.value.error == uris.ERROR_NOT_REGISTERED
    # What every node of a fleet hears once after a restart: an answer, not a warning per node.
    assert warnings == []
    await node.call(uris.AGENT_REGISTER, {"node_id": "node01"})
    await node.call(uris.AGENT_HEARTBEAT, {"memory_available_bytes": 1})
    assert plane.fleet.nodes["node01"].inventory.memory_available_bytes == 1


@pytest_twisted.ensureDeferred
async def test_a_malformed_heartbeat_is_refused_and_keeps_the_last_figures(plane):
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, {"node_id": "node01", "memory_available_bytes": 5})
    with pytest.raises(ApplicationError) as refused:
        await node.call(uris.AGENT_HEARTBEAT, {"memory_available_bytes": "5"})
    assert "Heartbeat.memory_available_bytes" in refused.value.args[0]
    assert plane.fleet.nodes["node01"].inventory.memory_available_bytes == 5


@pytest_twisted.ensureDeferred
async def test_an_operator_cannot_register_as_a_node(plane):
    alice = await plane.attach("alice", ROLE_OPERATOR)
    with pytest.raises(ApplicationError) as refused:
        await alice.call(uris.AGENT_REGISTER, {"node_id": "alice"})
    assert refused.value.error == uris.ERROR_NOT_AUTHORIZED
    assert plane.fleet.nodes == {}


@pytest_twisted.ensureDeferred
async def test_operators_see_nodes_and_their_events(plane):
    alice = await plane.attach("alice", ROLE_OPERATOR)
    events = []
    got = defer.Deferred()

    def on_node(ident, event):
        events.append((ident, event["change"], event["node"]["state"]))
        got.called or got.callback(None)

    await alice.subscribe(on_node, uris.EVENT_NODE)
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, {"node_id": "node01", "address": "10.1.2.3"})
    await got
    assert events == [("node01", "registered", "ready")]
    (view,) = await alice.call(uris.CP_NODES)
    assert (view["id"], view["state"], view["address"]) == ("node01", "ready", "10.1.2.3")


@pytest_twisted.ensureDeferred
async def test_an_operator_asks_for_briefs_and_a_brief_that_is_not_true_or_false_is_refused_in_words(plane):
    alice = await plane.attach("alice", ROLE_OPERATOR)
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, {"node_id": "node01", "address": "10.1.2.3", "gpus": []})
    assert await alice.call(uris.CP_NODES, brief=True) == [
        {"id": "node01", "state": "ready", "cordoned": False, "seen_ago_s": 0.0, "address": "10.1.2.3",
         "gpu_summary": {}}]
    (view,) = await alice.call(uris.CP_NODES, brief=False)
    assert view["gpus"] == [] and view["hostname"] is None
    with pytest.raises(ApplicationError) as refused:
        await alice.call(uris.CP_NODES, brief="yes")
    assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
    assert refused.value.args[0] == "llmgw.cp.nodes: brief 'yes' is not true or false"


@pytest_twisted.ensureDeferred
async def test_a_node_whose_session_ends_is_unreachable_at_once(plane):
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, {"node_id": "node01"})
    left = defer.Deferred()
    plane.fleet._emit = lambda kind, ident, event: event.change == "state" and left.callback(event)
    node.leave()
    event = await left.addTimeout(5, reactor)
    assert event.node.state == NodeState.UNREACHABLE


@pytest_twisted.ensureDeferred
async def test_a_router_is_answered_the_table_and_told_when_it_changes_in_its_wire_form(plane):
    router = await plane.attach("router01", ROLE_ROUTER)
    published = defer.Deferred()
    await router.subscribe(lambda table: published.called or published.callback(table), uris.EVENT_ENDPOINTS)
    # New fields are only ever added (docs/link.rst): "elastic" came with elastic replicas,
    # "no_continuation" with continued answers.
    assert await router.call(uris.ROUTER_ENDPOINTS) == {"endpoints": [], "unavailable": {}, "elastic": {},
                                                        "no_continuation": []}
    spec = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim")
    ready = ShardStatus(spec, "ready", endpoint="http://10.0.0.1:4001")
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", address="10.0.0.1", shards=[ready])))
    echo = Entry(Model(name="echo", profile="sim"), Profile(name="sim", engine="sim"), "f1")
    plane.catalog = type("Catalog", (), {"entries": {"echo": echo}})()
    plane.publish_endpoints()
    table = from_wire(EndpointTable, await published.addTimeout(5, reactor))
    assert table.endpoints == [EndpointEntry("echo/0", "echo", "http://10.0.0.1:4001", "node01")]
    assert await router.call(uris.ROUTER_ENDPOINTS) == to_wire(table)


@pytest_twisted.ensureDeferred
async def test_a_shard_becoming_ready_reaches_the_routers_table_without_waiting_for_a_tick(plane, clock):
    # ctl replicas reads the fleet live; the table followed only at the next tick, so
    # "ready" in ctl and "its replica is starting" from the router could meet.
    tables = []
    plane.table_listeners.append(tables.append)
    spec = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim")
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", address="10.0.0.1",
                                                           shards=[ShardStatus(spec, "starting")])))
    echo = Entry(Model(name="echo", profile="sim"), Profile(name="sim", engine="sim"), "f1")
    plane.catalog = type("Catalog", (), {"entries": {"echo": echo}})()
    clock.advance(0)
    assert tables and tables[-1].endpoints == []
    await node.call(uris.AGENT_SHARD_STATUS,
                    to_wire(ShardStatus(spec, "ready", endpoint="http://10.0.0.1:4001")))
    clock.advance(0)  # the same turn's end: no tick (the server's once a second) ran
    assert tables[-1].endpoints == [EndpointEntry("echo/0", "echo", "http://10.0.0.1:4001", "node01")]


@pytest_twisted.ensureDeferred
async def test_operators_are_answered_the_unwanted_weights_and_what_each_node_collected_in_their_wire_form(plane):
    fetched = "/data/weights/" + cache_name("https://example.org/dropped.gguf")
    node = await plane.attach("node01", ROLE_NODE)
    asked = []

    def collect(paths):
        asked.append(paths)
        return to_wire(CollectResult(removed=paths))

    await node.register(collect, uris.node_uri("node01", uris.NODE_COLLECT_WEIGHTS))
    report = WeightsReport(files=[WeightsFile(fetched, 7), WeightsFile("/data/weights/mine.gguf", 3)],
                           listed=True, cache_dir="/data/weights")
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", weights=report)))
    alice = await plane.attach("alice", ROLE_OPERATOR)

    listed = {"node01": [{"path": fetched, "size_bytes": 7}]}
    assert await alice.call(uris.CP_WEIGHTS) == {"unwanted": listed, "collected": None}
    assert asked == []
    answer = await alice.call(uris.CP_WEIGHTS, True)
    assert answer == {"unwanted": listed, "collected": {"node01": {"removed": [fetched], "refused": {}}}}
    assert asked == [[fetched]]
    assert from_wire(WeightsAnswer, answer).collected["node01"] == CollectResult(removed=[fetched])


# -- engine builds: the plan at register, and again after a reload that changes it --

def server_yaml(tmp_path, version):
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    path = tmp_path / "server.yaml"
    path.write_text(f"""\
listen: {{link: "ssl:7443", api: "tcp:0:interface=127.0.0.1"}}
tls: {{ca: ca.crt, cert: server.crt, key: server.key}}
engines:
  llama.cpp:
    version: {version}
    base_url: http://127.0.0.1:9/mirror
    sha256: {{llama-{version}-bin-ubuntu-x64.zip: "{'a' * 64}"}}
profiles:
  gemma-cpu: {{engine: llama.cpp}}
models:
  gemma: {{profile: gemma-cpu, source: /srv/models/gemma.gguf}}
""")
    return path


@pytest_twisted.async_yield_fixture
async def planned(tmp_path, clock):
    from llmgw.config.server import load_server_config
    from llmgw.control.catalog import Catalog

    catalog = Catalog(load_server_config(server_yaml(tmp_path, "b5000")))
    hub = Hub(reactor)
    control = ControlSession(ComponentConfig(realm=uris.REALM), lambda emit: Fleet(clock, emit), catalog, clock)
    joined = defer.Deferred()
    control.on("ready", lambda *a: joined.called or joined.callback(None))
    hub.attach_local(control)
    await joined.addTimeout(5, reactor)

    async def attach(authid):
        client = Joined(ComponentConfig(realm=uris.REALM))
        hub.attach_local(client, authid=authid, role=ROLE_NODE)
        await client.ready.addTimeout(5, reactor)
        # engines=[]: refused by placement, so the reconciler asks these nodes for nothing.
        await client.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id=authid, engines=[])))
        return client

    control.attach_node = attach
    control.yaml = lambda version: server_yaml(tmp_path, version)
    yield control


def plan_of(version):
    return {
        "builds": [{"name": "llama.cpp", "version": version, "base_url": "http://127.0.0.1:9/mirror/",
                    "sha256": {f"llama-{version}-bin-ubuntu-x64.zip": "a" * 64},
                    "python": None, "pip": None, "index_url": None}],
        "install_os_packages": False,
    }


@pytest_twisted.ensureDeferred
async def test_a_node_is_answered_the_engine_builds_the_catalog_runs_when_it_registers(planned):
    client = await planned.attach_node("node01")
    answer = await client.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01")))
    assert answer == {"node_id": "node01", "engines": plan_of("b5000")}


@pytest_twisted.ensureDeferred
async def test_a_reload_that_changes_the_builds_tells_every_ready_node_and_survives_those_that_cannot_take_it(
    planned, clock,
):
    told: dict[str, defer.Deferred] = {"node01": defer.Deferred(), "node02": defer.Deferred()}
    nodes = {}
    for node_id in ("node01", "node02", "old03", "lost04"):
        nodes[node_id] = await planned.attach_node(node_id)
    for node_id, d in told.items():
        await nodes[node_id].register(lambda plan, d=d: d.callback(plan), uris.node_uri(node_id, uris.NODE_SET_ENGINES))

    def refuse(plan):
        raise ApplicationError(uris.ERROR_REFUSED, "lost04 is shutting down")

    await nodes["lost04"].register(refuse, uris.node_uri("lost04", uris.NODE_SET_ENGINES))
    planned.yaml("b6000")
    lines = []
    observer = lambda event: lines.append(formatEvent(event))  # noqa: E731
    globalLogPublisher.addObserver(observer)
    try:
        outcome = planned.apply_reload()
        assert outcome.refused is None and "model gemma changed" in outcome.changes
        got = await defer.gatherResults([d.addTimeout(5, reactor) for d in told.values()])
        assert got == [plan_of("b6000"), plan_of("b6000")]
        await planned.pushing.addTimeout(5, reactor)
    finally:
        globalLogPublisher.removeObserver(observer)
    # old03 has no such procedure and lost04 refused: both said, neither fails the push.
    assert ("old03 has no set_engines (an agent older than engine installs, or one that has just left); "
            "it keeps what it has until it registers again") in lines
    assert ("lost04 did not take the new engine plan (lost04 is shutting down); "
            "it is sent again when it next registers") in lines
    # A reload that leaves the builds as they are tells nobody anything.
    planned.pushing = None
    assert planned.apply_reload().refused is None
    assert planned.pushing is None


@pytest_twisted.ensureDeferred
async def test_a_nodes_certificate_expiry_from_the_hub_is_in_its_view_and_a_refused_twin_is_a_warning(plane):
    node = await plane.attach("node01", ROLE_NODE)
    plane._session_joined({"session": node._session_id, "authid": "node01", "authrole": ROLE_NODE,
                           "certificate": {"not_after": 1_900_000_000.0}})
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01")))
    (view,) = plane.fleet.views()
    assert view.certificate_not_after == 1_900_000_000.0 and view.link_warnings == []
    sentence = "node01 is already connected from 127.0.0.1:1; a second agent with its certificate from 127.0.0.1:2 was refused"
    plane.fleet.duplicate_refused("node01", sentence)
    plane.fleet.duplicate_refused("node01", sentence)  # the same refusal again is no news
    (view,) = plane.fleet.views()
    assert view.link_warnings == [sentence]
    # A node registering again (its agent restarted) keeps the warning: the twin is still out there.
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01")))
    assert plane.fleet.views()[0].link_warnings == [sentence]
    plane._session_left({"session": node._session_id, "authid": "node01", "authrole": ROLE_NODE})
    assert plane._expiry == {}


@pytest_twisted.ensureDeferred
async def test_a_refused_report_is_logged_once_until_the_node_sends_a_good_one(plane):
    node = await plane.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, {"node_id": "node01"})
    lines = []

    def observe(event):
        text = formatEvent(event)
        if text.startswith("refused a Heartbeat from node01"):
            lines.append(text)
        elif "onUserError" in text:  # autobahn's own line for an error a handler raised
            lines.append(text)

    globalLogPublisher.addObserver(observe)
    try:
        for _ in range(3):
            with pytest.raises(ApplicationError) as refused:
                await node.call(uris.AGENT_HEARTBEAT, {"memory_available_bytes": 10**400})
            assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
        assert len(lines) == 1 and "Heartbeat.memory_available_bytes" in lines[0], lines
        await node.call(uris.AGENT_HEARTBEAT, {"memory_available_bytes": 1})
        with pytest.raises(ApplicationError):
            await node.call(uris.AGENT_HEARTBEAT, {"memory_available_bytes": -1})
        assert len(lines) == 2, lines
    finally:
        globalLogPublisher.removeObserver(observe)
