"""The reconciler, driven by a test clock: what it starts, stops and shows as the fleet and catalog change.

The fleet is a real ``Fleet`` fed what agents would report; the catalog is
real ``Entry`` records.  Only the two commands to agents are fakes, recording
each call: a start that succeeds reports the shard ``starting`` to the fleet,
as the control plane does with an agent's answer, and a start that a node
refuses raises its ``ApplicationError``.  Nothing sleeps: every start and stop
completes inside ``tick()``, unless a test holds the starts to see them in
flight.
"""

from __future__ import annotations

import attrs
import pytest
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer
from twisted.internet.task import Clock

from llmgw.config.catalog import Model, Profile
from llmgw.control.catalog import Entry, fingerprint
from llmgw.control.fleet import Fleet
from llmgw.control.reconciler import RESTOP_AFTER_S, Reconciler, Slot
from llmgw.link import uris
from llmgw.records import GPU, EngineInfo, Heartbeat, Inventory, ShardSpec, ShardStatus
from llmgw.states import EngineState, NodeState
from llmgw.wire import to_wire

GB = 1_000_000_000


def entry(name="echo", replicas=1, engine="sim", args=("--ttft-ms", "0"), gpus=0, min_memory_gb=None,
          source=None, node_selector=None, profile="sim-fast", engine_version=None):
    prof = Profile(name=profile, engine=engine, args=tuple(args), gpus=gpus, min_memory_gb=min_memory_gb,
                   node_selector=dict(node_selector or {}))
    model = Model(name=name, profile=profile, source=source, replicas=replicas)
    return Entry(model, prof, fingerprint(model, prof, engine_version), engine_version)


def inventory(node_id, memory_gb=32, gpus=None, engines=("sim",), shards=None, labels=None):
    return Inventory(
        node_id=node_id,
        address=f"10.0.0.{int(node_id[-2:])}",
        memory_total_bytes=int(memory_gb * GB),
        gpus=None if gpus is None else [GPU(index=i, memory_total_bytes=80 * GB) for i in range(gpus)],
        engines=[e if isinstance(e, EngineInfo) else EngineInfo(e) for e in engines],
        labels=dict(labels or {}),
        shards=shards,
    )


class World:
    """A fleet, a catalog and a reconciler, with agents' answers the test decides."""

    def __init__(self, settle_s=0.0, **settle):
        self.clock = Clock()
        self.fleet = Fleet(self.clock, lambda kind, ident, event: None, unreachable_after=15, lost_after=120)
        self.catalog: dict[str, Entry] = {}
        self.starts: list[tuple[str, ShardSpec]] = []
        self.stops: list[tuple[str, str]] = []
        self.refusals: dict[str, str] = {}  # node -> what it says when asked to start
        self.stop_reports_stopped = False
        self.held: list[defer.Deferred] | None = None  # starts in flight, when holding
        self.sessions: dict[str, int] = {}
        self.reconciler = Reconciler(self.clock, self.fleet, lambda: self.catalog,
                                     self.start_shard, self.stop_shard, settle_s=settle_s, **settle)

    # -- the fakes of the two commands to agents --

    async def start_shard(self, node_id, spec):
        self.starts.append((node_id, spec))
        if self.held is not None:
            d = defer.Deferred()
            self.held.append(d)
            await d
        if node_id in self.refusals:
            raise ApplicationError(uris.ERROR_REFUSED, self.refusals[node_id])
        status = ShardStatus(spec, "starting", pid=4242, since=self.clock.seconds())
        self.fleet.shard_status(node_id, status)
        return status

    async def stop_shard(self, node_id, shard_id):
        self.stops.append((node_id, shard_id))
        if self.stop_reports_stopped:
            self.fleet.shard_status(node_id, attrs.evolve(self.fleet.shards[(node_id, shard_id)].status,
                                                          state="stopped"))

    # -- what the world does --

    def serve(self, *entries):
        self.catalog = {e.model.name: e for e in entries}

    def node(self, node_id, **kw):
        self.sessions[node_id] = self.sessions.get(node_id, 0) + 1
        self.fleet.register(node_id, self.sessions[node_id], inventory(node_id, **kw))

    def back_with_echo(self):
        """node01 registers again with echo/0/0 still running, as an agent that adopted it after a restart reports it."""
        spec = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim",
                         fingerprint=self.catalog["echo"].fingerprint)
        self.node("node01", shards=[ShardStatus(spec, "ready", endpoint="http://10.0.0.1:40001", adopted=True)])

    def tick_for(self, seconds: int) -> None:
        """*seconds* of the control plane's once-a-second passes."""
        for _ in range(seconds):
            self.clock.advance(1)
            self.reconciler.tick()

    def shard(self, shard_id, node_id=None):
        """The one copy of *shard_id* the fleet holds (on *node_id*, when given)."""
        found = [s for (node, ident), s in self.fleet.shards.items()
                 if ident == shard_id and node_id in (None, node)]
        assert len(found) == 1, found
        return found[0]

    def report(self, shard_id, state, node_id=None, **kw):
        """The shard's node says it is now *state*."""
        shard = self.shard(shard_id, node_id)
        self.fleet.shard_status(shard.node_id, attrs.evolve(shard.status, state=state,
                                                            since=self.clock.seconds(), **kw))

    def silence(self, node_id, seconds):
        """Let *seconds* pass in which every node but *node_id* keeps sending heartbeats."""
        for _ in range(int(seconds)):
            self.clock.advance(1)
            for other, node in self.fleet.nodes.items():
                if other != node_id and node.state != NodeState.LOST:
                    self.fleet.heartbeat(other, self.sessions[other], Heartbeat())
            self.fleet.check()

    def started(self):
        """(node, shard id) of every start so far."""
        return [(node_id, spec.shard_id) for node_id, spec in self.starts]

    def view(self, replica_id):
        """The replica's view as ``ctl replicas --json`` shows it."""
        (found,) = [v for v in self.reconciler.views() if v.replica == replica_id]
        return to_wire(found)


@pytest.fixture
def world():
    return World()


# -- placing and starting --


def test_an_empty_slot_is_started_on_a_ready_node_with_everything_the_engine_needs(world):
    gemma = entry("gemma", engine="llama.cpp", args=("-c", "4096"), gpus=1,
                  source="/srv/models/gemma.gguf", profile="gemma-gpu")
    world.serve(gemma)
    world.node("node01", gpus=2, engines=("llama.cpp",))
    world.reconciler.tick()
    assert world.starts == [("node01", ShardSpec(
        shard_id="gemma/0/0", replica_id="gemma/0", model="gemma", engine="llama.cpp",
        fingerprint=gemma.fingerprint, source="/srv/models/gemma.gguf", args=["-c", "4096"],
        gpus=[0], rank=0, ranks=1, leader=None,
    ))]
    view = world.view("gemma/0")
    assert (view["state"], view["nodes"], view["stale"]) == ("starting", ["node01"], False)
    # The slot is filled now: ticking again starts nothing twice.
    world.reconciler.tick()
    world.clock.advance(5)
    world.reconciler.tick()
    assert len(world.starts) == 1


def test_two_replicas_placed_in_one_tick_go_to_different_nodes(world):
    world.serve(entry(replicas=2))
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    assert sorted(world.started()) == [("node01", "echo/0/0"), ("node02", "echo/1/0")]


def test_gpus_given_to_one_replica_are_not_given_again_in_the_same_tick(world):
    world.serve(entry(replicas=3, gpus=1))
    world.node("node01", gpus=2)
    world.reconciler.tick()
    assert [(spec.shard_id, spec.gpus) for _, spec in world.starts] == [("echo/0/0", [0]), ("echo/1/0", [1])]
    view = world.view("echo/2")
    assert view["state"] == "pending"
    assert view["reason"] == (
        "no node can hold it: node01: has no free GPUs, needs 1; echo/0 and echo/1 hold 2 of 2"
    )


def test_a_start_still_in_flight_counts_for_the_next_placement(world):
    world.held = []
    world.serve(entry(replicas=1, gpus=1))
    world.node("node01", gpus=1)
    world.node("node02", gpus=1)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]
    assert world.view("echo/0")["state"] == "starting"
    # The node has not answered yet, so the fleet does not show the shard;
    # the next tick must neither start the slot again nor hand out its GPU.
    world.serve(entry(replicas=2, gpus=1))
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0"), ("node02", "echo/1/0")]
    for d in world.held:
        d.callback(None)
    world.reconciler.tick()
    assert {s.id: s.node_id for s in world.fleet.shards.values()} == {"echo/0/0": "node01", "echo/1/0": "node02"}
    assert len(world.starts) == 2


def test_nothing_is_placed_until_the_fleet_has_had_settle_s_to_report():
    world = World(settle_s=15)
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    assert world.starts == []
    view = world.view("echo/0")
    assert view["state"] == "pending"
    assert view["reason"] == "waiting 15 s for the fleet to report before placing (fleet.settle_s)"
    world.clock.advance(14)
    world.reconciler.tick()
    assert world.starts == []
    assert world.view("echo/0")["reason"].startswith("waiting 1 s for the fleet")
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]


def test_a_replica_an_agent_reports_while_settling_is_not_started_twice():
    world = World(settle_s=15)
    world.serve(entry())
    world.clock.advance(3)
    world.back_with_echo()
    world.node("node02")
    world.clock.advance(12)
    world.reconciler.tick()
    assert world.starts == []
    view = world.view("echo/0")
    assert (view["state"], view["endpoint"]) == ("ready", "http://10.0.0.1:40001")


def test_after_settle_s_placing_waits_while_nodes_are_still_coming_back():
    world = World(settle_s=15, settle_quiet_s=5, settle_max_s=300)
    world.serve(entry())
    # A big fleet reconnecting: a node every 3 s, the replica's own node last of all, at 24 s.
    for i, at in enumerate((3, 6, 9, 12, 15, 18, 21), start=2):
        world.clock.advance(at - world.clock.seconds())
        world.node(f"node{i:02d}", engines=())  # none of them can run it: only node01 can
        world.reconciler.tick()
        assert world.starts == []
    assert world.view("echo/0")["reason"] == (
        "waiting for the fleet to finish coming back before placing: a node connected or registered 0 s ago "
        "(fleet.settle_quiet_s)")
    world.clock.advance(3)
    world.back_with_echo()
    world.tick_for(10)
    assert world.starts == []  # with settle_s alone, a second copy would have started at 15 s
    assert world.view("echo/0")["state"] == "ready"


def test_a_node_connected_but_not_yet_registered_holds_placing_back():
    """A hub busy registering thousands can go seconds between registrations while sessions keep joining.

    Seen at 5,000 nodes after a restart: no registration for 5 s while
    a thousand agents had joined and were registering their procedures;
    judged by registrations alone, the fleet was settled and 24 replicas
    were started a second time.
    """
    world = World(settle_s=15, settle_quiet_s=10, settle_max_s=300)
    world.serve(entry())
    world.node("node02")  # could run it, and is back first
    for at in (20, 28, 36):  # sessions join; none registers
        world.clock.advance(at - world.clock.seconds())
        world.fleet.node_joined()
        world.reconciler.tick()
        assert world.starts == []
    world.clock.advance(44 - world.clock.seconds())
    world.reconciler.tick()
    assert world.starts == []
    assert world.view("echo/0")["reason"] == (
        "waiting for the fleet to finish coming back before placing: a node connected or registered 8 s ago "
        "(fleet.settle_quiet_s)")
    world.back_with_echo()
    world.tick_for(15)
    assert world.starts == []
    assert world.view("echo/0")["state"] == "ready"


def test_connections_still_in_their_handshakes_hold_placing_back():
    """A hub too busy to finish any handshake for settle_quiet_s is not a quiet one.

    Seen at 10,000 nodes after a restart: the reactor spent 9 s taking a
    batch of handshakes, and its overdue tick ran before the joins of that
    same turn reached the control plane; judged by arrivals alone the fleet
    had been quiet for 11 s, and 161 replicas were started a second time.
    """
    world = World(settle_s=15, settle_quiet_s=10, settle_max_s=300)
    world.serve(entry())
    world.node("node02")  # could run it, and is back first
    pending = [64]
    world.fleet.handshaking = lambda: pending[0]
    world.clock.advance(40)  # 40 s without an arrival heard, the link's handshakes all in flight
    world.reconciler.tick()
    assert world.starts == []
    assert world.view("echo/0")["reason"] == (
        "waiting for the fleet to finish coming back before placing: the hub has 64 connections still in "
        "handshakes (fleet.settle_quiet_s)")
    pending[0] = 1
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.view("echo/0")["reason"].endswith("the hub has 1 connection still in handshakes (fleet.settle_quiet_s)")
    world.back_with_echo()
    pending[0] = 0
    world.tick_for(15)
    assert world.starts == []
    assert world.view("echo/0")["state"] == "ready"


def test_handshakes_do_not_hold_placing_past_settle_max_s():
    """A peer that opens connections and never finishes one cannot keep placing back for ever."""
    world = World(settle_s=15, settle_quiet_s=10, settle_max_s=60)
    world.serve(entry())
    world.node("node01")
    world.fleet.handshaking = lambda: 3
    world.clock.advance(59)
    world.reconciler.tick()
    assert world.starts == []
    world.clock.advance(2)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]


def test_a_fleet_with_no_node_yet_is_not_settled_by_settle_s():
    world = World(settle_s=5, settle_quiet_s=5, settle_max_s=300)
    world.serve(entry())
    world.clock.advance(10)
    world.reconciler.tick()
    assert world.view("echo/0")["reason"] == (
        "waiting for the fleet to come back before placing: no node has registered yet")
    world.node("node01")  # the first of a fleet arriving late: the others follow within seconds
    world.clock.advance(1)
    world.node("node02", engines=())
    world.reconciler.tick()
    assert world.starts == []
    world.clock.advance(5)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]


def test_a_fleet_that_keeps_arriving_is_placed_on_at_settle_max_s():
    world = World(settle_s=15, settle_quiet_s=5, settle_max_s=60)
    world.serve(entry())
    world.node("node01")
    for i in range(2, 70):
        world.clock.advance(1)
        world.node(f"node{i:02d}", engines=())
        world.reconciler.tick()
        if world.clock.seconds() < 60:
            assert world.starts == []
    assert world.started() == [("node01", "echo/0/0")]


def test_once_settled_a_late_registration_does_not_hold_placing_back():
    world = World(settle_s=15, settle_quiet_s=5)
    world.serve(entry(replicas=1))
    world.node("node01")
    world.clock.advance(20)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]
    world.report("echo/0/0", "failed", reason="exited with code 1")
    world.node("node02")  # arrives just now
    world.reconciler.tick()  # the failure counted: retried in 1 s
    world.clock.advance(1)
    world.reconciler.tick()
    assert len(world.starts) == 2  # after its backoff, not after another quiet spell


# -- failures and backoff --


def test_a_failed_shard_is_counted_once_and_retried_after_1_2_4_s(world):
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    for backoff in (1, 2, 4):
        world.report("echo/0/0", "failed", reason="exited with code 1")
        starts = len(world.starts)
        # However often it ticks before then, no start comes before the backoff has passed.
        for _ in range(backoff * 2 - 1):
            world.reconciler.tick()
            world.clock.advance(0.5)
        world.reconciler.tick()
        assert len(world.starts) == starts, f"started before {backoff} s had passed"
        world.clock.advance(0.5)
        world.reconciler.tick()
        world.reconciler.tick()
        assert len(world.starts) == starts + 1
        assert world.starts[-1][1].shard_id == "echo/0/0"


def test_the_backoff_starts_again_from_1_s_once_the_replica_has_been_ready(world):
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    for _ in range(3):  # three failures: the next wait would be 8 s
        world.report("echo/0/0", "failed", reason="exited with code 1")
        world.reconciler.tick()
        world.clock.advance(10)
        world.reconciler.tick()
    world.report("echo/0/0", "ready", endpoint="http://10.0.0.1:40001")
    world.reconciler.tick()
    world.clock.advance(3600)
    world.report("echo/0/0", "failed", reason="killed by signal 9")
    world.reconciler.tick()
    assert world.view("echo/0")["reason"] == "node01: killed by signal 9 (next try in 1 s)"
    starts = len(world.starts)
    world.clock.advance(1)
    world.reconciler.tick()
    assert len(world.starts) == starts + 1


def test_a_single_rank_replica_that_failed_and_is_started_on_another_node_is_not_stopped_for_the_old_failure(world):
    world.serve(entry())
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.report("echo/0/0", "failed", reason="exited with code 1")
    world.reconciler.tick()
    world.fleet.set_cordoned("node01", True)
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0"), ("node02", "echo/0/0")]
    world.reconciler.tick()
    assert world.stops == []
    assert world.view("echo/0")["state"] == "starting"


def test_a_failed_replica_shows_the_nodes_reason_and_when_it_is_tried_again(world):
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    world.report("echo/0/0", "failed", reason="exited with code 1: CUDA out of memory")
    world.reconciler.tick()
    view = world.view("echo/0")
    assert view["state"] == "failed"
    assert view["reason"] == "node01: exited with code 1: CUDA out of memory (next try in 1 s)"
    assert view["shards"][0]["reason"] == "exited with code 1: CUDA out of memory"
    assert view["endpoint"] is None


def test_a_node_refusing_the_start_makes_the_slot_wait_and_say_why(world):
    world.serve(entry())
    world.node("node01")
    world.refusals["node01"] = "node01 has no room: its disk is full"
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]
    assert world.fleet.shards == {}
    reason = world.view("echo/0")["reason"]
    assert reason.startswith("failed: node01: node01 has no room: its disk is full")
    assert "next try in 1 s" in reason
    world.clock.advance(0.5)
    world.reconciler.tick()
    assert len(world.starts) == 1
    world.clock.advance(0.5)
    world.reconciler.tick()
    assert len(world.starts) == 2
    # Refused again: the wait doubles.
    assert "next try in 2 s" in world.view("echo/0")["reason"]
    del world.refusals["node01"]
    world.clock.advance(2)
    world.reconciler.tick()
    assert len(world.starts) == 3
    assert world.view("echo/0")["state"] == "starting"


def test_a_refused_starts_countdown_follows_the_clock(world):
    world.serve(entry())
    world.node("node01")
    world.refusals["node01"] = "no room"
    world.reconciler.tick()
    world.clock.advance(1)
    world.reconciler.tick()
    world.clock.advance(2)
    world.reconciler.tick()
    assert "next try in 4 s" in world.view("echo/0")["reason"]
    world.clock.advance(3)
    assert "next try in 1 s" in world.view("echo/0")["reason"]


def test_rewording_a_failure_changes_what_ctl_reads_and_nothing_the_reconciler_does(monkeypatch):
    def run():
        world = World()
        world.serve(entry())
        world.node("node01")
        world.refusals["node01"] = "no room"
        seen = []
        for _ in range(5):
            world.reconciler.tick()
            view = world.view("echo/0")
            seen.append((view["state"], len(world.starts)))
            world.clock.advance(1)
        return seen, view["reason"]

    as_written, written_reason = run()
    explain = Slot.explain

    def reworded(slot, reason, *, failed=False):
        explain(slot, f"could not go on: {reason.removeprefix('failed: ')}" if failed else reason, failed=failed)

    monkeypatch.setattr(Slot, "explain", reworded)
    after_rewording, new_reason = run()
    assert after_rewording == as_written
    assert [state for state, _ in as_written] == ["failed"] * 5
    assert written_reason.startswith("failed: node01: no room")
    assert new_reason.startswith("could not go on: node01: no room")


# -- stopping --


def test_a_model_that_left_the_catalog_is_stopped_and_asked_again_after_30_s(world):
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    world.report("echo/0/0", "ready", endpoint="http://10.0.0.1:40001")
    world.serve()
    world.reconciler.tick()
    assert world.stops == [("node01", "echo/0/0")]
    (view,) = world.reconciler.views()
    assert (view.replica, view.reason) == ("echo/0", "its model left the catalog")
    # The node has not said it stopped: wait before asking again.
    world.clock.advance(RESTOP_AFTER_S - 1)
    world.reconciler.tick()
    assert world.stops == [("node01", "echo/0/0")]
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.stops == [("node01", "echo/0/0")] * 2
    assert world.starts == [world.starts[0]]


def test_a_stopped_shard_is_not_asked_again(world):
    world.stop_reports_stopped = True
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    world.serve()
    world.reconciler.tick()
    assert world.fleet.shards == {}
    world.clock.advance(RESTOP_AFTER_S * 3)
    world.reconciler.tick()
    assert world.stops == [("node01", "echo/0/0")]
    assert world.reconciler.views() == []


def test_scaling_down_from_two_to_one_stops_slot_1_only(world):
    world.serve(entry(replicas=2))
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.report("echo/0/0", "ready")
    world.report("echo/1/0", "ready")
    world.serve(entry(replicas=1))
    world.reconciler.tick()
    assert world.stops == [("node02", "echo/1/0")]
    assert world.view("echo/1")["reason"] == "the model was scaled down"
    assert len(world.starts) == 2


def test_a_lost_node_that_comes_back_with_a_copy_of_a_replaced_slot_has_the_extra_copy_stopped(world):
    world.serve(entry())
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.report("echo/0/0", "ready", endpoint="http://10.0.0.1:40001")
    old_copy = world.shard("echo/0/0").status
    world.silence("node01", 120)
    assert world.fleet.nodes["node01"].state == NodeState.LOST
    world.reconciler.tick()
    assert world.started()[-1] == ("node02", "echo/0/0")
    # node01's agent comes back with its engine still running and says so.
    world.node("node01", shards=[old_copy])
    world.reconciler.tick()
    # The ready copy is kept; the one still starting is stopped.
    assert world.stops == [("node02", "echo/0/0")]


def test_shards_on_a_lost_node_are_placed_again_elsewhere(world):
    world.serve(entry())
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.report("echo/0/0", "ready")
    assert world.started() == [("node01", "echo/0/0")]
    world.silence("node01", 120)
    assert world.fleet.nodes["node01"].state == NodeState.LOST
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0"), ("node02", "echo/0/0")]
    view = world.view("echo/0")
    assert (view["state"], view["nodes"]) == ("starting", ["node02"])


def test_shards_on_an_unreachable_node_are_left_alone(world):
    world.serve(entry())
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.report("echo/0/0", "ready")
    world.silence("node01", 60)
    assert world.fleet.nodes["node01"].state == NodeState.UNREACHABLE
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]
    assert world.stops == []
    assert world.view("echo/0")["nodes"] == ["node01"]


def test_a_cordoned_node_gets_no_new_replicas(world):
    world.serve(entry(replicas=2))
    world.node("node01")
    world.node("node02")
    world.fleet.set_cordoned("node01", True)
    world.reconciler.tick()
    assert world.started() == [("node02", "echo/0/0"), ("node02", "echo/1/0")]
    world.fleet.set_cordoned("node02", True)
    world.serve(entry(replicas=3))
    world.reconciler.tick()
    assert len(world.starts) == 2
    view = world.view("echo/2")
    assert view["state"] == "pending"
    assert view["reason"] == "no node can hold it: node01: is cordoned; node02: is cordoned"


def test_an_unplaceable_replica_stays_pending_and_says_why_for_each_node(world):
    world.serve(entry(min_memory_gb=64))
    world.node("node01", memory_gb=32)
    world.node("node02", memory_gb=16)
    for _ in range(3):
        world.reconciler.tick()
        world.clock.advance(1)
    assert world.starts == []
    view = world.view("echo/0")
    assert (view["state"], view["nodes"], view["endpoint"]) == ("pending", [], None)
    assert view["reason"] == (
        "no node can hold it: node01: has 32 GB of memory, needs 64; node02: has 16 GB of memory, needs 64"
    )
    # A bigger node arrives: it is placed there.
    world.node("node03", memory_gb=128)
    world.reconciler.tick()
    assert world.started() == [("node03", "echo/0/0")]


# -- engine versions --


def llama(version, state=EngineState.INSTALLED, reason=None):
    return EngineInfo("llama.cpp", version, state=state, reason=reason, origin="server.yaml")


def test_a_shard_is_started_on_the_build_the_catalog_names_and_only_where_it_is_installed(world):
    world.serve(entry("gemma", engine="llama.cpp", profile="gemma-cpu", engine_version="b6000"))
    world.node("node01", engines=[llama("b5000"), llama("b6000", EngineState.INSTALLING, "downloading x.zip (16 MB)")])
    world.node("node02", engines=[llama("b6000")])
    world.reconciler.tick()
    ((node_id, spec),) = world.starts
    assert (node_id, spec.engine_version) == ("node02", "b6000")


def test_a_slot_no_node_has_the_build_for_says_what_each_node_is_doing_about_it(world):
    world.serve(entry("gemma", engine="llama.cpp", profile="gemma-cpu", engine_version="b6000"))
    world.node("node01", engines=[llama("b5000"), llama("b6000", EngineState.INSTALLING, "downloading x.zip (16 MB)")])
    world.node("node02", engines=[llama("b6000", EngineState.BROKEN, "needs libgomp.so.1")])
    world.reconciler.tick()
    assert world.starts == []
    assert world.view("gemma/0")["reason"] == (
        "no node can hold it: node01: has llama.cpp b5000, needs b6000: installing; "
        "node02: llama.cpp broken: needs libgomp.so.1"
    )
    # The install finishes and the next heartbeat says so: placed there.
    world.fleet.heartbeat("node01", world.sessions["node01"], Heartbeat(engines=[llama("b5000"), llama("b6000")]))
    world.reconciler.tick()
    assert [(n, s.engine_version) for n, s in world.starts] == [("node01", "b6000")]


def test_a_version_bump_leaves_the_old_build_serving_until_the_replica_moves(world):
    world.serve(entry("gemma", engine="llama.cpp", profile="gemma-cpu", engine_version="b5000"))
    world.node("node01", engines=[llama("b5000")])
    world.node("node02", engines=[llama("b5000")])
    world.reconciler.tick()
    world.report("gemma/0/0", "ready", endpoint="http://10.0.0.1:40001")
    world.serve(entry("gemma", engine="llama.cpp", profile="gemma-cpu", engine_version="b6000"))
    # Both nodes install the new build beside the old one, which keeps serving throughout.
    for engines in ([llama("b5000"), llama("b6000", EngineState.INSTALLING, "downloading x.zip")],
                    [llama("b5000"), llama("b6000")]):
        for node_id in ("node01", "node02"):
            world.fleet.heartbeat(node_id, world.sessions[node_id], Heartbeat(engines=engines))
        for _ in range(3):
            world.reconciler.tick()
            world.clock.advance(10)
        view = world.view("gemma/0")
        assert (view["state"], view["endpoint"], view["stale"]) == ("ready", "http://10.0.0.1:40001", True)
        assert world.stops == [] and world.started() == [("node01", "gemma/0/0")]
    # The replica moves (its node drained, here lost): the new one runs on the new build.
    world.silence("node01", 120)
    world.reconciler.tick()
    assert [(n, s.engine_version) for n, s in world.starts] == [("node01", "b5000"), ("node02", "b6000")]


# -- what ctl shows --


def test_a_replica_is_stale_once_its_profile_changes(world):
    world.serve(entry(args=("--ttft-ms", "0")))
    world.node("node01")
    world.reconciler.tick()
    world.report("echo/0/0", "ready", endpoint="http://10.0.0.1:40001")
    assert world.view("echo/0")["stale"] is False
    world.serve(entry(args=("--ttft-ms", "50")))
    view = world.view("echo/0")
    assert view["stale"] is True
    assert view["fingerprint"] == world.catalog["echo"].fingerprint
    assert world.reconciler.status()[0].stale == 1


def test_a_replica_from_an_agent_too_old_to_report_a_fingerprint_is_neither_stale_nor_current(world):
    world.serve(entry())
    spec = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim")
    world.node("node01", shards=[ShardStatus(spec, "ready", endpoint="http://10.0.0.1:40001")])
    world.reconciler.tick()
    assert world.starts == []
    assert world.view("echo/0")["stale"] is None
    assert world.reconciler.status()[0].stale == 0


def test_the_endpoint_is_shown_only_while_the_replica_serves(world):
    world.serve(entry())
    world.node("node01")
    world.reconciler.tick()
    world.report("echo/0/0", "starting", endpoint="http://10.0.0.1:40001")
    view = world.view("echo/0")
    assert (view["state"], view["endpoint"]) == ("starting", None)
    assert view["shards"][0]["endpoint"] == "http://10.0.0.1:40001"
    world.report("echo/0/0", "ready")
    assert world.view("echo/0")["endpoint"] == "http://10.0.0.1:40001"
    world.report("echo/0/0", "draining")
    view = world.view("echo/0")
    assert (view["state"], view["endpoint"]) == ("draining", "http://10.0.0.1:40001")


def test_views_list_every_slot_of_the_catalog_and_the_age_of_what_runs(world):
    world.serve(entry("echo", replicas=2), entry("tiny", min_memory_gb=1000))
    world.node("node01")
    world.clock.advance(100)
    world.reconciler.tick()
    world.report("echo/0/0", "ready")
    world.clock.advance(30)
    views = world.reconciler.views()
    assert [v.replica for v in views] == ["echo/0", "echo/1", "tiny/0"]
    assert [v.age_s for v in views] == [30.0, 30.0, None]
    assert [v.state for v in views] == ["ready", "starting", "pending"]


def test_status_says_desired_against_ready_for_each_model(world):
    world.serve(entry("echo", replicas=2), entry("tiny", replicas=1, min_memory_gb=1000, profile="big"))
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.report("echo/0/0", "ready")
    assert to_wire(world.reconciler.status()) == [
        {"model": "echo", "profile": "sim-fast", "engine": "sim", "desired": 2, "ready": 1,
         "states": {"ready": 1, "starting": 1}, "stale": 0, "weights_by_fabric": {}},
        {"model": "tiny", "profile": "big", "engine": "sim", "desired": 1, "ready": 0,
         "states": {"pending": 1}, "stale": 0, "weights_by_fabric": {}},
    ]


def test_a_replica_started_again_after_a_stop_is_stopped_at_once_when_scaled_down_again(world):
    world.stop_reports_stopped = True
    world.serve(entry(replicas=2))
    world.node("node01")
    world.node("node02")
    world.reconciler.tick()
    world.serve(entry(replicas=1))
    world.reconciler.tick()
    assert world.stops == [("node02", "echo/1/0")]
    world.clock.advance(5)
    world.serve(entry(replicas=2))
    world.reconciler.tick()
    assert world.started()[-1] == ("node02", "echo/1/0")
    world.clock.advance(5)
    world.serve(entry(replicas=1))
    world.reconciler.tick()
    assert world.stops == [("node02", "echo/1/0")] * 2
