"""A new leader's settle: it waits for exactly the nodes the last leader listed, however long one of them takes.

The failover it guards against: an agent refused by the standby while it
still stood by backs off, and comes back after a short ``settle_s`` has
passed; the new leader must not have placed that node's replica elsewhere
(docs/operations.rst, "Two servers, one fleet").
"""

from __future__ import annotations

from llmgw.control.settle import Settle
from llmgw.records import ShardSpec, ShardStatus
from llmgw.states import NodeState
from tests.control.test_reconciler import World, entry


def back_with(world: World, node: str, replica: int) -> None:
    """*node* registers again, its engine of echo/<replica> still running (adopted)."""
    spec = ShardSpec(shard_id=f"echo/{replica}/0", replica_id=f"echo/{replica}", model="echo", engine="sim",
                     fingerprint=world.catalog["echo"].fingerprint)
    endpoint = f"http://10.0.0.{int(node[-2:])}:40001"
    world.node(node, shards=[ShardStatus(spec, "ready", endpoint=endpoint, adopted=True)])


def leader_world(**settle) -> World:
    """A control plane that led once (settled long ago), whose nodes are gone with the old leader's sessions."""
    world = World(settle_s=3, settle_quiet_s=2, settle_max_s=60, **settle)
    world.serve(entry(replicas=2))
    world.tick_for(1)
    return world


def test_a_new_leader_waits_for_every_node_the_last_one_listed_past_settle_s_and_starts_nothing_twice():
    world = leader_world()
    taken = world.clock.seconds()
    world.reconciler.restart_settle(taken, {"node01", "node02", "node03"})
    back_with(world, "node01", 0)
    world.tick_for(1)
    assert world.view("echo/1")["reason"] == ("waiting for node02 and 1 more to come back after the failover before "
                                              "placing (fleet.settle_max_s)")
    world.node("node03")  # an idle node: its registration is all that is awaited of it
    world.tick_for(11)  # settle_s and settle_quiet_s long past: without the list, echo/1 went to node01 or node03
    assert world.starts == []
    assert world.view("echo/1")["reason"] == ("waiting for node02 to come back after the failover before placing "
                                              "(fleet.settle_max_s)")
    back_with(world, "node02", 1)  # its agent backed off while the standby refused it
    world.tick_for(1)
    assert world.starts == [] and world.stops == []
    assert [world.view(r)["state"] for r in ("echo/0", "echo/1")] == ["ready", "ready"]


def test_once_every_listed_node_is_back_placing_begins_without_waiting_out_settle_s():
    world = World(settle_s=30, settle_quiet_s=10, settle_max_s=300)
    world.serve(entry(replicas=2))
    world.reconciler.restart_settle(world.clock.seconds(), {"node01"})
    back_with(world, "node01", 0)
    world.tick_for(1)
    assert world.started() == [("node01", "echo/1/0")]  # the fleet is back: the missing replica is placed at once


def test_a_listed_node_that_never_comes_back_holds_placing_until_settle_max_s_and_no_longer():
    world = leader_world()
    world.reconciler.restart_settle(world.clock.seconds(), {"node01", "node09"})
    back_with(world, "node01", 0)
    world.tick_for(59)
    assert world.starts == []
    world.tick_for(1)
    assert world.started() == [("node01", "echo/1/0")]


def test_a_registration_from_before_the_failover_is_not_a_node_back_and_a_lost_one_is_not_awaited():
    world = leader_world()
    world.node("node01")  # registered with this server when it led before
    world.clock.advance(5)
    settle = Settle(world.fleet, world.clock.seconds(), 3, 2, 60, {"node01"})
    assert settle.missing() == ["node01"]
    world.clock.advance(world.fleet.lost_after + 1)
    world.fleet.check()
    assert world.fleet.nodes["node01"].state is NodeState.LOST
    assert settle.missing() == []


def test_connections_in_handshakes_hold_placing_once_every_listed_node_is_back():
    world = leader_world()
    handshaking = [1]
    world.fleet.handshaking = lambda: handshaking[0]
    world.reconciler.restart_settle(world.clock.seconds(), {"node01"})
    back_with(world, "node01", 0)
    world.tick_for(1)
    assert world.view("echo/1")["reason"].endswith("the hub has 1 connection still in handshakes "
                                                   "(fleet.settle_quiet_s)")
    handshaking[0] = 0
    world.tick_for(1)
    assert world.started() == [("node01", "echo/1/0")]


def test_without_a_list_a_new_leader_waits_as_after_a_restart_and_again_keeps_the_settings():
    world = leader_world()
    settle = world.reconciler.restart_settle(world.clock.seconds(), ())
    assert settle.expected == frozenset()
    world.tick_for(1)
    assert world.view("echo/0")["reason"] == "waiting 2 s for the fleet to report before placing (fleet.settle_s)"
    world.tick_for(1)
    world.node("node01")
    world.tick_for(1)  # settle_s is over, and node01 registered 1 s ago: not quiet yet (settle_quiet_s 2)
    assert world.starts == []
    world.tick_for(1)
    assert {node for node, _ in world.started()} == {"node01"}
