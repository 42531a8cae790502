"""What a node may claim: only shards placed on it or adopted by rule, at endpoints on its own address.

The world is test_reconciler's (a real Fleet and Reconciler, a test clock,
fake commands to agents); the plane's tests go through the hub as a node
would.  Each rule has its test; test_rogue_node.py is the whole attack
against real processes.
"""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.logger import LogLevel, capturedLogs, formatEvent

from llmgw.control.claims import (
    ClaimRefused, ModelSlots, Why, endpoint_refusal, host_of, peer_host, rendezvous_refusal,
)
from llmgw.link import uris
from llmgw.records import Inventory, ShardSpec, ShardStatus
from llmgw.roles import ROLE_NODE
from llmgw.states import NodeState
from llmgw.wire import to_wire
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.control.test_reconciler import World, entry

VICTIM = "echo/0/0"
CATALOG = {"echo": ModelSlots(replicas=1, ranks=1)}


def spec(shard_id=VICTIM, **kw):
    replica_id, _, rank = shard_id.rpartition("/")
    fields = dict(shard_id=shard_id, replica_id=replica_id, model=replica_id.rpartition("/")[0], engine="sim",
                  rank=int(rank))
    fields.update(kw)
    return ShardSpec(**fields)


@pytest.fixture
def served():
    """echo/0 placed on node01 and ready; node03 is another node with a certificate of its own."""
    world = World()
    world.serve(entry())
    world.node("node01")
    world.node("node03", engines=())  # nothing is ever placed there
    world.reconciler.tick()
    world.report(VICTIM, "ready", endpoint="http://10.0.0.1:40001")
    return world


def refusal(world, node_id, status) -> ClaimRefused:
    with pytest.raises(ClaimRefused) as caught:
        world.fleet.shard_status(node_id, status)
    return caught.value


# -- only what was placed on it --

def test_a_node_cannot_report_a_shard_placed_on_another_node(served):
    claim = ShardStatus(served.shard(VICTIM).status.spec, "ready", endpoint="http://10.0.0.3:40001", since=0.0)
    refused = refusal(served, "node03", claim)
    assert refused.why == Why.NOT_PLACED
    assert str(refused).startswith(f"node03 may not report {VICTIM}: the control plane did not place it on node03")
    assert served.shard(VICTIM).node_id == "node01"
    served.reconciler.tick()
    assert served.stops == []  # the real replica is left alone
    assert served.view("echo/0")["endpoint"] == "http://10.0.0.1:40001"


def test_a_refusal_is_logged_once_per_node_and_shard_and_counted_each_time(served):
    claim = ShardStatus(spec(), "ready", endpoint="http://10.0.0.3:40001")
    with capturedLogs() as events:
        for _ in range(3):
            refusal(served, "node03", claim)
        refusal(served, "node03", attrs.evolve(claim, spec=spec("echo/1/0")))
    lines = [formatEvent(e) for e in events if e["log_level"] == LogLevel.warn]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"refused: node03 may not report {VICTIM}: ")
    assert served.fleet.claims.refused[("node03", Why.NOT_PLACED)] == 4


def test_a_stop_for_a_shard_the_node_does_not_hold_changes_nothing(served):
    served.fleet.shard_status("node03", ShardStatus(spec(), "stopped"))
    assert served.shard(VICTIM).node_id == "node01"


def test_a_placed_shard_reported_as_another_slots_is_refused(served):
    mine = served.shard(VICTIM).status
    # Its id is the one placed; its fields say another model's slot, which is what routing reads.
    other = attrs.evolve(mine, spec=attrs.evolve(mine.spec, replica_id="victim/0", model="victim"))
    assert refusal(served, "node01", other).why == Why.SPEC
    served.fleet.place("node01", spec("other/0/0"))
    moved = ShardStatus(spec("other/0/0", replica_id="echo/0", model="echo"), "ready")
    assert refusal(served, "node01", moved).why == Why.SPEC
    assert served.fleet.replicas().keys() == {"echo/0"}


def test_a_placed_shard_with_another_rank_count_is_refused(served):
    mine = served.shard(VICTIM).status
    refused = refusal(served, "node01", attrs.evolve(mine, spec=attrs.evolve(mine.spec, ranks=2)))
    assert refused.why == Why.SPEC
    assert "it was placed as rank 0 of 1 of echo/0 (echo), and is reported as rank 0 of 2" in str(refused)


def test_a_start_that_never_happened_leaves_no_grant(served):
    served.refusals["node01"] = "no such engine"
    served.serve(entry(replicas=2))
    served.reconciler.tick()
    assert served.started()[-1] == ("node01", "echo/1/0")
    assert ("node01", "echo/1/0") not in served.fleet.claims.grants
    assert refusal(served, "node01", ShardStatus(spec("echo/1/0"), "ready")).why == Why.NOT_PLACED


def test_a_forgotten_shard_cannot_be_reported_again_under_its_old_grant(served):
    served.report(VICTIM, "stopped")
    assert refusal(served, "node01", ShardStatus(spec(), "ready", endpoint="http://10.0.0.1:40001")).why \
        == Why.NOT_PLACED


# -- endpoints on the node's own address --

@pytest.mark.parametrize("endpoint, words", [
    ("http://10.0.0.3:40001", "is not on node01's own address 10.0.0.1"),
    ("http://169.254.169.254:8080", "is not on node01's own address 10.0.0.1"),
    ("https://10.0.0.1:40001", "http://HOST:PORT"),
    ("http://10.0.0.1:40001/v1", "http://HOST:PORT"),
    ("http://user:pw@10.0.0.1:40001", "http://HOST:PORT"),
    ("http://10.0.0.1:40001?x=1", "http://HOST:PORT"),
    ("http://10.0.0.1", "does not name a port from 1024 to 65535"),
    ("http://10.0.0.1:22", "does not name a port from 1024 to 65535"),
    ("http://10.0.0.1:99999", "http://HOST:PORT"),
    ("gopher://10.0.0.1:40001", "http://HOST:PORT"),
])
def test_an_endpoint_off_the_nodes_own_address_or_of_another_shape_is_refused(endpoint, words):
    assert words in endpoint_refusal(endpoint, "node01", "10.0.0.1")


@pytest.mark.parametrize("endpoint, address", [
    ("http://10.0.0.1:40001", "10.0.0.1"),
    ("http://[::1]:40001", "::1"),
    ("http://127.0.0.1:40001", "::ffff:127.0.0.1"),
    ("http://node01.lab:40001", "NODE01.lab"),
])
def test_an_endpoint_on_the_nodes_own_address_is_accepted(endpoint, address):
    assert endpoint_refusal(endpoint, "node01", address) is None


def test_a_node_with_no_known_address_has_its_endpoints_refused():
    assert endpoint_refusal("http://10.0.0.1:40001", "node01", None) == \
        "node01 has no known address to check http://10.0.0.1:40001 against"


# -- rank 0's rendezvous, where the other ranks of its replica are sent --

LEADER = spec("big/0/0", ranks=2, model="big", replica_id="big/0")


@pytest.mark.parametrize("rendezvous, words", [
    ("10.0.0.3:29500", "10.0.0.3:29500 is not on node01's own address 10.0.0.1"),
    ("169.254.169.254:6379", "is not on node01's own address 10.0.0.1"),
    ("10.0.0.1", "HOST:PORT"),
    ("10.0.0.1:", "HOST:PORT"),
    (":29500", "HOST:PORT"),
    ("10.0.0.1:29500/x", "HOST:PORT"),
    ("user@10.0.0.1:29500", "HOST:PORT"),
    ("fd00::1:29500", "[V6]:PORT"),
    ("[10.0.0.1]:29500", "HOST:PORT"),
    ("10.0.0.1:+2950", "HOST:PORT"),
    ("10.0.0.1:\u0662\u0669\u0665\u0660\u0660", "HOST:PORT"),
    ("10.0.0.1:0029500", "HOST:PORT"),
    ("10.0.0.1:22", "does not name a port from 1024 to 65535"),
    ("10.0.0.1:70000", "does not name a port from 1024 to 65535"),
])
def test_a_rendezvous_off_rank_0s_node_or_of_another_shape_is_refused(rendezvous, words):
    assert words in rendezvous_refusal(rendezvous, LEADER, "node01", "10.0.0.1")


@pytest.mark.parametrize("rendezvous, address", [
    ("10.0.0.1:29500", "10.0.0.1"),
    ("[fd00::1]:6379", "fd00::1"),
    ("127.0.0.1:29500", "::ffff:127.0.0.1"),
    ("node01.lab:29500", "NODE01.lab"),
])
def test_a_rendezvous_on_rank_0s_own_address_is_accepted(rendezvous, address):
    assert rendezvous_refusal(rendezvous, LEADER, "node01", address) is None


def test_only_rank_0_reports_a_rendezvous():
    worker = spec("big/0/1", ranks=2, model="big", replica_id="big/0")
    assert rendezvous_refusal("10.0.0.1:29500", worker, "node01", "10.0.0.1") == (
        "only rank 0 of a replica reports a rendezvous, and this is rank 1")


def test_a_placed_rank_0_whose_rendezvous_is_off_its_node_is_kept_failed_counted_and_logged_once(served):
    big = attrs.evolve(entry("big"), profile=attrs.evolve(entry().profile, ranks=2))
    served.serve(entry(), big)
    placed = spec("big/0/0", ranks=2, model="big", replica_id="big/0")
    served.fleet.place("node01", placed)
    claim = ShardStatus(placed, "starting", pid=7, rendezvous="10.0.0.9:29500")
    with capturedLogs() as events:
        for _ in range(3):
            assert refusal(served, "node01", claim).why == Why.RENDEZVOUS
    kept = served.shard("big/0/0").status
    assert (kept.state, kept.rendezvous) == ("failed", None)
    assert kept.reason.startswith("the control plane refused its rendezvous: node01 may not report big/0/0: "
                                  "10.0.0.9:29500 is not on node01's own address 10.0.0.1")
    assert served.fleet.claims.refused[("node01", Why.RENDEZVOUS)] == 3
    assert len([e for e in events if "refused:" in formatEvent(e)]) == 1


def test_a_node_registering_with_a_rank_0_whose_rendezvous_is_off_its_node_has_it_refused():
    world = World()
    world.serve(attrs.evolve(entry("big"), profile=attrs.evolve(entry().profile, ranks=2)))
    offered = ShardStatus(spec("big/0/0", ranks=2, model="big", replica_id="big/0"), "ready", pid=7,
                          rendezvous="10.0.0.9:29500")
    world.sessions["node01"] = 1
    refused = world.fleet.register("node01", 1, attrs.evolve(Inventory(node_id="node01", address="10.0.0.1"),
                                                             shards=[offered]),
                                   catalog={"big": ModelSlots(replicas=1, ranks=2)})
    assert "10.0.0.9:29500 is not on node01's own address" in refused["big/0/0"]
    assert world.fleet.shards == {}


def test_a_placed_shard_ready_at_another_hosts_endpoint_is_kept_failed_and_stopped(served):
    served.serve(entry(replicas=2))
    served.reconciler.tick()
    placed = served.shard("echo/1/0").status
    refused = refusal(served, "node01", attrs.evolve(placed, state="ready", endpoint="http://10.0.0.9:40002"))
    assert refused.why == Why.ENDPOINT
    kept = served.shard("echo/1/0").status
    assert (kept.state, kept.endpoint) == ("failed", None)
    assert kept.reason.startswith("the control plane refused its endpoint: node01 may not report echo/1/0: "
                                  "http://10.0.0.9:40002 is not on node01's own address 10.0.0.1")
    assert all(e.url != "http://10.0.0.9:40002" for e in _table(served).endpoints)


def _table(world):
    from llmgw.control.routing import endpoint_table

    return endpoint_table(world.fleet, {name: entry.model.replicas for name, entry in world.catalog.items()},
                          world.reconciler.views)


def test_the_address_a_nodes_link_comes_from_wins_over_the_one_it_reports(served):
    served.fleet.register("node04", 1, Inventory(node_id="node04", address="10.0.0.1"), peer="10.0.0.4")
    assert served.fleet.nodes["node04"].inventory.address == "10.0.0.4"
    served.fleet.register("node05", 1, Inventory(node_id="node05", address="10.0.0.5"))
    assert served.fleet.address("node05") == "10.0.0.5"


@pytest.mark.parametrize("peer, host", [
    ("tcp4:10.0.0.5:51234", "10.0.0.5"), ("tcp6:::1:51234", "::1"), ("tcp6:::ffff:10.0.0.5:4", "10.0.0.5"),
    ("unix:/tmp/s", None), ("process:42", None), (None, None), ("tcp4:nonsense", None),
])
def test_the_hub_peer_is_read_as_a_host(peer, host):
    assert peer_host(peer) == host


def test_hosts_compare_in_one_spelling():
    assert host_of("[0:0:0:0:0:0:0:1]") == host_of("::1") == "::1"


# -- adoption at register --

def test_a_node_registering_with_a_shard_of_an_empty_slot_has_it_adopted():
    world = World()
    world.serve(entry())
    shard = ShardStatus(spec(), "ready", endpoint="http://10.0.0.2:40001", adopted=True)
    refused = world.fleet.register("node02", 1, Inventory(node_id="node02", address="10.0.0.2", shards=[shard]),
                                   catalog=CATALOG)
    assert refused == {}
    grant = world.fleet.claims.grants[("node02", VICTIM)]
    assert grant.adopted and world.shard(VICTIM).order == grant.order
    world.reconciler.tick()
    assert world.starts == []
    # Reported again later under the grant it was adopted on.
    world.fleet.shard_status("node02", attrs.evolve(shard, state="draining"))
    assert world.shard(VICTIM).status.state == "draining"


def test_a_node_registering_with_a_copy_of_a_served_slot_is_refused_and_the_real_replica_kept(served):
    claim = ShardStatus(spec(), "ready", endpoint="http://10.0.0.3:40001", since=0.0)
    refused = served.fleet.register("node03", 2, Inventory(node_id="node03", address="10.0.0.3", shards=[claim]),
                                    catalog=CATALOG)
    assert refused == {VICTIM: f"node03 may not report {VICTIM}: node01 already serves it, and the control "
                                "plane placed it there first"}
    assert [s.node_id for s in served.fleet.shards.values()] == ["node01"]
    served.reconciler.tick()
    assert served.stops == []


def test_a_shard_of_a_model_outside_the_catalog_is_not_adopted(served):
    claim = ShardStatus(spec("ghost/0/0"), "ready", endpoint="http://10.0.0.3:40001")
    refused = served.fleet.register("node03", 2, Inventory(node_id="node03", address="10.0.0.3", shards=[claim]),
                                    catalog=CATALOG)
    assert "the catalog has no model 'ghost'" in refused["ghost/0/0"]


def test_an_adopted_rank_must_agree_with_the_ranks_its_replica_runs_with(served):
    # echo/0 runs with one rank on node01: a second rank offered by node03 would make it unroutable.
    claim = ShardStatus(spec("echo/0/1", ranks=2), "starting")
    # (No catalog here, which would refuse two ranks first: this is the rule for what the others run.)
    refused = served.fleet.register("node03", 2, Inventory(node_id="node03", address="10.0.0.3", shards=[claim]))
    assert "its replica echo/0 runs with 1 rank(s) (node01 serves echo/0/0), not 2" in refused["echo/0/1"]
    assert served.view("echo/0")["state"] == "ready"


@pytest.mark.parametrize("shard", [spec("echo/1/0"), spec("echo/0/1", ranks=2), spec("echo/7000/0")])
def test_only_a_slot_and_rank_the_catalog_asks_for_is_adopted(shard):
    world = World()
    refused = world.fleet.register("node02", 1, Inventory(node_id="node02", address="10.0.0.2", shards=[
        ShardStatus(shard, "starting")]), catalog=CATALOG)
    assert "the catalog asks for 1 replica(s) of echo with 1 rank(s) each, and this is rank" in refused[shard.shard_id]
    assert world.fleet.shards == {}


def test_an_adoption_is_held_to_the_endpoint_rule_too():
    world = World()
    claim = ShardStatus(spec(), "ready", endpoint="http://10.0.0.9:40001")
    refused = world.fleet.register("node02", 1, Inventory(node_id="node02", address="10.0.0.2", shards=[claim]))
    assert "is not on node02's own address 10.0.0.2" in refused[VICTIM]
    assert ("node02", VICTIM) not in world.fleet.claims.grants


def test_a_slot_whose_holder_is_lost_may_be_adopted_elsewhere(served):
    served.silence("node01", 120)
    assert served.fleet.nodes["node01"].state == NodeState.LOST
    served.held = []  # the reconciler's own start stays in flight: its grant is not yet a shard
    claim = ShardStatus(spec(), "ready", endpoint="http://10.0.0.3:40001")
    assert served.fleet.register("node03", 2, Inventory(node_id="node03", address="10.0.0.3", shards=[claim]),
                                 catalog=CATALOG) == {}


# -- copies decided by the control plane's facts --

def test_of_two_ready_copies_the_one_placed_first_is_kept_whatever_since_they_send():
    world = World()
    world.clock.advance(1000)
    world.serve(entry())
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    [(first, _)] = world.starts
    second = "node02" if first == "node01" else "node01"
    world.report(VICTIM, "ready", endpoint=f"http://{world.fleet.nodes[first].inventory.address}:40001")
    old_copy = world.shard(VICTIM).status
    world.silence(first, 120)
    world.reconciler.tick()
    assert world.started() == [(first, VICTIM), (second, VICTIM)]
    # The replacement says it has been ready since the epoch, older than anything.
    world.report(VICTIM, "ready", node_id=second, endpoint=f"http://{world.fleet.nodes[second].inventory.address}:40002")
    world.fleet.shard_status(second, attrs.evolve(world.shard(VICTIM, second).status, since=0.0))
    world.node(first, shards=[old_copy])  # back, its engine still running
    world.reconciler.tick()
    assert world.stops == [(second, VICTIM)]


# -- the plane answers refusals in words --

@pytest_twisted.ensureDeferred
async def test_the_plane_refuses_a_claim_with_the_sentence_and_a_register_says_what_it_did_not_adopt(plane):
    node = await plane.attach("node03", ROLE_NODE)
    answer = await node.call(uris.AGENT_REGISTER, to_wire(Inventory(
        node_id="node03", address="10.0.0.3",
        shards=[ShardStatus(spec(), "ready", endpoint="http://10.0.0.9:40001")])))
    assert "is not on node03's own address 10.0.0.3" in answer["refused"][VICTIM]
    with pytest.raises(ApplicationError) as caught:
        await node.call(uris.AGENT_SHARD_STATUS, to_wire(ShardStatus(spec(), "ready",
                                                                     endpoint="http://10.0.0.3:40001")))
    assert caught.value.error == uris.ERROR_REFUSED
    assert caught.value.args[0].startswith(f"node03 may not report {VICTIM}: the control plane did not place it")
    assert plane.fleet.shards == {}


@pytest_twisted.ensureDeferred
async def test_the_address_the_hub_saw_a_node_connect_from_is_the_one_its_endpoints_are_held_to(plane):
    node = await plane.attach("node03", ROLE_NODE)
    plane._session_joined({"session": node._session_id, "authid": "node03", "authrole": ROLE_NODE,
                           "transport": {"peer": "tcp4:10.9.9.9:51234"}})
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node03", address="10.0.0.3")))
    assert plane.fleet.address("node03") == "10.9.9.9"
    plane._session_left({"session": node._session_id, "authid": "node03", "authrole": ROLE_NODE})
    assert plane._peers == {}
