"""Two servers' roles on one etcd in memory and a fake clock: the leader commands, the standby refuses and follows.

Each server is a real hub and control session, attached in process; the
election runs on ``task.Clock`` against ``tests/ha/fakeetcd.py``.  What a
node, an operator and a router worker meet on each server is asked through
its hub, as over the link.
"""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import ComponentConfig
from twisted.internet import defer, reactor, task

from llmgw.config.ha import HASettings
from llmgw.config.server import FleetSettings, ServerConfig
from llmgw.control.fleet import Fleet
from llmgw.control.plane import ControlSession
from llmgw.ha import members
from llmgw.ha.fence import NotLeading
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.process.ha import ENDPOINTS_KEY, Roles
from llmgw.records import Inventory
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER
from llmgw.views import EndpointEntry, EndpointTable, FleetStatus, ServerRole
from llmgw.wire import from_wire, to_wire
from tests.ha.fakeetcd import FakeEtcd
from tests.link.conftest import Joined
from tests.support.wait import until

LEASE_S = 6


class Catalog:
    """What the control session reads of a catalog here: the fleet's settings, and no models."""

    def __init__(self, fleet: FleetSettings):
        engines = attrs.fields(ServerConfig).engines.default
        self.config = type("Config", (), {"fleet": fleet, "profiles": {}, "engines": getattr(engines, "factory",
                                                                                          lambda: engines)()})()
        self.entries: dict = {}


class FakeRouter:
    def __init__(self):
        self.tables: list[EndpointTable] = []

    def apply_table(self, table):
        self.tables.append(table)


class Server:
    def __init__(self, clock, etcd, name, catalog=None):
        self.settings = HASettings(etcd=("http://127.0.0.1:1",), advertise=f"wss://{name}.example:7443/",
                                   lease_s=LEASE_S, name=name, api_advertise=f"http://{name}.example:8080")
        self.hub = Hub(reactor)
        self.router = FakeRouter()
        self.client = etcd.client()
        self.roles = Roles(clock, self.settings, self.hub, self.router, client=self.client)
        self.session = ControlSession(ComponentConfig(realm=uris.REALM), lambda emit: Fleet(clock, emit), catalog,
                                      clock=clock)
        self.ticks = 0
        self.session.reconciler.tick = self._ticked
        self.roles.attach(self.session)

    def _ticked(self):
        self.ticks += 1

    async def join(self):
        joined = defer.Deferred()
        self.session.on("ready", lambda *a: joined.called or joined.callback(None))
        self.hub.attach_local(self.session)
        await joined.addTimeout(5, reactor)

    async def attach(self, authid, role):
        client = Joined(ComponentConfig(realm=uris.REALM))
        self.hub.attach_local(client, authid=authid, role=role)
        return await client.ready.addTimeout(5, reactor)


def run(clock, seconds: float, step: float = 0.1) -> None:
    for _ in range(round(seconds / step)):
        clock.advance(step)


@pytest.fixture
def clock():
    return task.Clock()


@pytest_twisted.async_yield_fixture
async def pair(clock):
    etcd = FakeEtcd(clock)
    a, b = Server(clock, etcd, "serverA"), Server(clock, etcd, "serverB")
    await a.join()
    await b.join()
    a.roles.startService()
    clock.advance(0)
    b.roles.startService()
    clock.advance(0)
    yield etcd, a, b
    for server in (a, b):
        if server.roles.running:
            server.roles.stopService()


@pytest_twisted.ensureDeferred
async def test_the_leader_commands_with_its_epoch_and_the_standby_refuses_naming_it(pair, clock):
    etcd, a, b = pair
    assert a.roles.role is ServerRole.LEADER and b.roles.role is ServerRole.STANDBY
    epoch = a.roles.election.epoch
    assert a.session.command_epoch() == epoch
    with pytest.raises(NotLeading) as refused:
        b.session.command_epoch()
    assert refused.value.words == (f"serverB no longer leads: serverA at wss://serverA.example:7443/ does (epoch "
                                   f"{epoch}); run the command there")

    # An agent registers with the leader and is told the epoch; the standby sends it to the leader.
    node = await a.attach("node01", ROLE_NODE)
    answer = await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", fencing=True)))
    assert answer["epoch"] == epoch
    node_b = await b.attach("node02", ROLE_NODE)
    with pytest.raises(ApplicationError) as standby:
        await node_b.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node02", fencing=True)))
    assert standby.value.error == uris.ERROR_STANDBY
    assert standby.value.args[0].startswith("registration refused: standby; the leader is serverA at "
                                            "wss://serverA.example:7443/")
    assert standby.value.kwargs == {"leader_url": "wss://serverA.example:7443/"}
    assert b.session.fleet.nodes == {}


@pytest_twisted.ensureDeferred
async def test_the_standby_refuses_every_action_and_answers_reads_with_every_server(pair, clock):
    etcd, a, b = pair
    run(clock, LEASE_S)  # a renewal: each has read the list
    alice = await b.attach("alice", ROLE_OPERATOR)
    for uri, args in [(uris.CP_DRAIN, ["node01"]), (uris.CP_CORDON, ["node01"]), (uris.CP_UNCORDON, ["node01"]),
                      (uris.CP_RELOAD, []), (uris.CP_SCALE, ["m", 2])]:
        with pytest.raises(ApplicationError) as refused:
            await alice.call(uri, *args)
        assert refused.value.error == uris.ERROR_STANDBY, uri
        assert f"{uri} refused: standby; the leader is serverA" in refused.value.args[0]
        assert "llmgw ctl --hub wss://serverA.example:7443/" in refused.value.args[0]
    with pytest.raises(ApplicationError) as refused:
        await alice.call(uris.CP_WEIGHTS, collect=True)
    assert refused.value.error == uris.ERROR_STANDBY
    assert await alice.call(uris.CP_WEIGHTS) == {"unwanted": {}, "collected": None}
    assert await alice.call(uris.CP_NODES) == []
    status = from_wire(FleetStatus, await alice.call(uris.CP_STATUS))
    assert [(s.name, s.role, s.epoch, s.url, s.api_url) for s in status.servers] == [
        ("serverA", ServerRole.LEADER, a.roles.election.epoch, "wss://serverA.example:7443/",
         "http://serverA.example:8080"),
        ("serverB", ServerRole.STANDBY, None, "wss://serverB.example:7443/", "http://serverB.example:8080"),
    ]


@pytest_twisted.ensureDeferred
async def test_the_reconciler_ticks_only_on_the_leader(pair, clock):
    etcd, a, b = pair
    for _ in range(3):
        a.session.reconciler.tick()
        b.session.reconciler.tick()
    assert (a.ticks, b.ticks) == (3, 0)


@pytest_twisted.ensureDeferred
async def test_the_leaders_table_reaches_the_standbys_router_and_its_router_workers(pair, clock):
    etcd, a, b = pair
    worker = await b.attach("router01", ROLE_ROUTER)
    heard = []
    await worker.subscribe(lambda table: heard.append(table), uris.EVENT_ENDPOINTS)
    table = EndpointTable([EndpointEntry("m/0", "m", "http://10.0.0.5:8001", "node01")], {"q": "starting"})
    a.session.table_listeners.append(a.router.apply_table)
    a.session.endpoint_table = lambda: table
    a.session.publish_endpoints()
    clock.advance(0)
    assert ENDPOINTS_KEY in etcd.keys
    assert a.router.tables == [table]
    assert b.router.tables == [table]
    await until(lambda: heard == [to_wire(table)], "the worker on the standby's hub told the table")
    assert from_wire(EndpointTable, await worker.call(uris.ROUTER_ENDPOINTS)) == table
    # The standby's own (empty) fleet never reaches its router.
    b.session.table_listeners.append(b.router.apply_table)
    b.session.publish_endpoints()
    assert b.router.tables == [table]


@pytest_twisted.ensureDeferred
async def test_a_table_in_etcd_that_is_not_one_is_ignored(pair, clock):
    etcd, a, b = pair
    etcd.store(ENDPOINTS_KEY, b'{"endpoints": "nope"}', 0)
    etcd.store(ENDPOINTS_KEY, b"x" * (b.settings.max_response_bytes + 1), 0)
    etcd.store(ENDPOINTS_KEY, b"not json", 0)
    assert b.router.tables == []


@pytest_twisted.ensureDeferred
async def test_a_leader_cut_off_stops_commanding_at_its_deadline_closes_its_agents_and_the_standby_takes_over(pair, clock):
    etcd, a, b = pair
    node = await a.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", fencing=True)))
    old = a.roles.election.epoch
    a.client.down = True
    deadline = a.roles.election.deadline()
    run(clock, deadline - clock.seconds() - 0.2)
    assert a.session.command_epoch() == old  # still within its lease
    clock.advance(0.3)
    with pytest.raises(NotLeading):
        a.session.command_epoch()
    assert a.roles.role is not ServerRole.LEADER
    await until(lambda: not any(s.role == ROLE_NODE for s in a.hub.sessions.values()),
                "the old leader's agent sessions closed")
    run(clock, LEASE_S)  # the lease lapses in etcd; b campaigns and wins
    assert b.roles.role is ServerRole.LEADER and b.roles.election.epoch > old
    assert b.session.command_epoch() == b.roles.election.epoch
    a.client.down = False
    run(clock, LEASE_S)
    assert a.roles.role is ServerRole.STANDBY
    with pytest.raises(NotLeading) as refused:
        a.session.command_epoch()
    assert "serverB at wss://serverB.example:7443/ does" in refused.value.words


@pytest_twisted.ensureDeferred
async def test_the_new_leader_publishes_no_table_until_the_fleet_has_settled(clock):
    etcd = FakeEtcd(clock)
    b = Server(clock, etcd, "serverB", Catalog(FleetSettings(settle_s=15.0, settle_quiet_s=0.0)))
    published = []
    b.session.table_listeners.append(published.append)
    await b.join()
    b.roles.startService()
    clock.advance(0)
    assert b.roles.role is ServerRole.LEADER
    b.session.publish_endpoints()
    assert published == []
    run(clock, 15.5)
    b.session.publish_endpoints()
    assert len(published) == 1
    b.roles.stopService()


@pytest_twisted.ensureDeferred
async def test_the_leader_keeps_its_nodes_in_etcd_and_a_new_leader_waits_for_them_past_settle_s(clock):
    etcd = FakeEtcd(clock)
    settings = FleetSettings(settle_s=3.0, settle_quiet_s=0.0, settle_max_s=120.0)
    a, b = Server(clock, etcd, "serverA", Catalog(settings)), Server(clock, etcd, "serverB", Catalog(settings))
    for server in (a, b):
        await server.join()
        server.roles.startService()
        clock.advance(0)
    run(clock, 3.5)  # serverA's own settle (nothing listed yet: settle_s)
    a.session.publish_endpoints()
    node = await a.attach("node01", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", fencing=True)))
    run(clock, 1)
    assert etcd.keys[members.KEY].value == b'["node01"]'
    assert b.roles.members.known == frozenset({"node01"})  # the standby follows the list

    published = []
    b.session.table_listeners.append(published.append)
    a.client.down = True
    run(clock, 2 * LEASE_S)  # serverA stops commanding; the lease lapses; serverB leads
    assert b.roles.role is ServerRole.LEADER
    run(clock, 10)  # settle_s long past: node01 is not back, so nothing is placed and no table goes out
    b.session.publish_endpoints()
    assert published == []
    back = await b.attach("node01", ROLE_NODE)
    await back.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", fencing=True)))
    clock.advance(0.1)
    b.session.publish_endpoints()
    assert len(published) == 1
    run(clock, 1)
    assert etcd.keys[members.KEY].value == b'["node01"]'  # the new leader's own list, once settled
    for server in (a, b):
        server.roles.stopService()
