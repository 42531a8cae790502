"""Elastic replicas through the reconciler: asleep, woken by a held request, drained before a stop, room made.

The fleet and catalog are real, the agents' two commands fakes (``World``);
the routers are their reports, fed to the reconciler's ``Demand`` as the
control plane does with ``llmgw.cp.router.load``.
"""

from __future__ import annotations

import attrs

from llmgw.config.catalog import Model, Profile
from llmgw.config.scale import Scale
from llmgw.control.catalog import Entry, fingerprint
from llmgw.control.slot import SlotState
from llmgw.history import JournalKind
from llmgw.states import ReplicaState
from llmgw.traffic import EndpointLoad, ModelLoad, RouterLoad
from tests.control.test_reconciler import World


def elastic(name, low=0, high=1, gpus=1, priority=0, **policy):
    prof = Profile(name="gpu", engine="sim", gpus=gpus)
    scale = Scale(min=low, max=high, priority=priority, **{"idle_s": 60, **policy})
    model = Model(name=name, profile="gpu", replicas=high, scale=scale)
    return Entry(model, prof, fingerprint(model, prof, None))


class Fleet(World):
    def __init__(self):
        super().__init__()
        self.said = {}
        self.notes = []
        self.reconciler.elastic.set_note(lambda kind, subject, reason="", **w: self.notes.append((kind, subject, reason)))

    def traffic(self, model, router=None, inflight=0, held=0, queued=0, idle_s=0.0, endpoints=()):
        """*router* (one per model unless named) says this now, and again every second as routers do."""
        router = router or f"router-{model}"
        self.said[router] = (model, inflight, held, queued, idle_s, tuple(endpoints), self.clock.seconds())
        self._send(router)

    def _send(self, router):
        model, inflight, held, queued, idle_s, endpoints, at = self.said[router]
        idle = idle_s + self.clock.seconds() - at
        load = RouterLoad(router, [ModelLoad(model, inflight, queued, held, idle)],
                          [EndpointLoad(e, n) for e, n in endpoints])
        self.reconciler.elastic.demand.report(load, router, self.clock.seconds())

    def tick_for(self, seconds):
        for _ in range(seconds):
            self.clock.advance(1)
            for router in getattr(self, "said", {}):
                self._send(router)
            self.reconciler.tick()

    def ready(self, replica_id):
        self.report(f"{replica_id}/0", "ready", endpoint="http://10.0.0.1:40001")

    def state(self, replica_id):
        return self.reconciler.slots[replica_id].state


def test_a_model_with_min_0_sleeps_until_a_request_is_held_for_it_then_starts_once():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("qwen"))
    world.tick_for(5)
    assert world.starts == [] and world.state("qwen/0") is SlotState.SLEEPING
    view = world.view("qwen/0")
    assert view["state"] == ReplicaState.SLEEPING and view["reason"].startswith("idle: scaled to zero")
    world.traffic("qwen", held=3)
    world.tick_for(3)
    assert world.started() == [("node01", "qwen/0/0")]
    assert world.view("qwen/0")["reason"].startswith("starting on demand: 3 request(s) waiting")
    assert [n[0] for n in world.notes] == [JournalKind.COLD_START, JournalKind.PLACED]


def test_a_scaled_down_replica_leaves_the_table_drains_its_requests_then_stops_and_sleeps():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("qwen", idle_s=30))
    world.traffic("qwen", held=1)
    world.tick_for(1)
    world.ready("qwen/0")
    world.traffic("qwen", inflight=1, endpoints=[("qwen/0", 1)], idle_s=0)
    world.tick_for(1)
    assert world.state("qwen/0") is SlotState.READY and world.reconciler.withdrawn() == set()
    # A stream still open, its request long ago: idle by the clock, but busy.
    world.tick_for(40)
    assert world.state("qwen/0") is SlotState.READY
    world.traffic("qwen", inflight=0, endpoints=[("qwen/0", 0)], idle_s=0)
    world.tick_for(29)
    assert world.state("qwen/0") is SlotState.READY
    world.tick_for(1)
    assert world.state("qwen/0") is SlotState.DRAINING and world.reconciler.withdrawn() == {"qwen/0"}
    assert world.stops == []  # the router's last report is older than the drain
    world.traffic("qwen", endpoints=[("qwen/0", 1)], idle_s=30)  # a request sent just before it heard
    world.tick_for(3)
    assert world.stops == []
    world.traffic("qwen", endpoints=[("qwen/0", 0)], idle_s=33)
    world.tick_for(1)
    assert world.stops == [("node01", "qwen/0/0")] and world.state("qwen/0") is SlotState.STOPPING
    world.report("qwen/0/0", "stopped")
    world.tick_for(1)
    assert world.state("qwen/0") is SlotState.SLEEPING
    assert world.view("qwen/0")["state"] == ReplicaState.SLEEPING


def test_a_drain_that_never_ends_is_stopped_after_drain_timeout_s():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("qwen", idle_s=5, drain_timeout_s=20))
    world.traffic("qwen", held=1)
    world.tick_for(1)
    world.ready("qwen/0")
    # The model's last request was answered; one stream on the replica never ends.
    world.traffic("qwen", endpoints=[("qwen/0", 1)], idle_s=0)
    world.tick_for(6)  # idle_s (5) from when it was ready
    assert world.state("qwen/0") is SlotState.READY
    world.tick_for(1)
    assert world.state("qwen/0") is SlotState.DRAINING
    world.tick_for(19)
    assert world.stops == []
    world.tick_for(1)
    assert world.stops == [("node01", "qwen/0/0")]


def test_wanted_again_while_draining_it_goes_back_in_the_table_without_a_restart():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("qwen", idle_s=5))
    world.traffic("qwen", held=1)
    world.tick_for(1)
    world.ready("qwen/0")
    world.traffic("qwen", endpoints=[("qwen/0", 1)], idle_s=0)
    world.tick_for(7)
    assert world.state("qwen/0") is SlotState.DRAINING
    world.traffic("qwen", held=2, endpoints=[("qwen/0", 1)], idle_s=0)
    world.tick_for(2)
    assert world.state("qwen/0") is SlotState.READY and world.reconciler.withdrawn() == set()
    assert world.stops == [] and len(world.starts) == 1


def test_room_is_made_by_draining_the_least_recently_used_idle_replica_of_no_higher_priority():
    world = Fleet()
    world.node("node01", gpus=2)
    world.serve(elastic("a", idle_s=10_000), elastic("b", idle_s=10_000), elastic("c", priority=5, idle_s=10_000))
    world.traffic("a", held=1)
    world.tick_for(1)
    world.ready("a/0")
    world.traffic("a")
    world.tick_for(540)
    world.traffic("b", held=1)
    world.tick_for(1)
    world.ready("b/0")
    world.traffic("b")
    world.tick_for(59)
    world.traffic("c", held=2)
    world.tick_for(1)
    assert world.state("a/0") is SlotState.DRAINING and world.state("b/0") is SlotState.READY
    words = world.view("c/0")["reason"]
    assert "making room: stopping a/0 on node01 (idle 10m, priority 0 ≤ 5)" in words
    (evicted,) = [n for n in world.notes if n[0] is JournalKind.EVICTED]
    assert evicted[2] == "stopped a/0 on node01 to make room for c/0: idle 10m, priority 0 ≤ 5"
    world.tick_for(2)
    assert ("node01", "a/0/0") in world.stops
    world.report("a/0/0", "stopped")
    world.tick_for(1)
    assert ("node01", "c/0/0") in world.started() and world.state("a/0") is SlotState.SLEEPING


def test_nothing_is_evicted_for_a_lower_priority_or_past_a_min_and_the_refusal_says_why():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("a", low=1, high=1), elastic("c", idle_s=10_000))
    world.tick_for(1)
    world.ready("a/0")
    world.traffic("c", held=1)
    world.tick_for(1)
    assert world.state("a/0") is SlotState.READY
    words = world.view("c/0")["reason"]
    assert "nothing can be stopped to make room: a/0 on node01: a is at its min" in words


def test_a_request_in_flight_keeps_its_replica_from_being_evicted():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("a", idle_s=10_000), elastic("c", priority=1, idle_s=10_000))
    world.traffic("a", held=1)
    world.tick_for(1)
    world.ready("a/0")
    world.traffic("a", inflight=1, endpoints=[("a/0", 1)], idle_s=900)
    world.traffic("c", held=1)
    world.tick_for(1)
    assert world.state("a/0") is SlotState.READY
    assert "a/0 on node01: 1 request(s) in flight" in world.view("c/0")["reason"]


def test_a_model_without_waiting_requests_makes_no_room():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("a", idle_s=10_000), attrs.evolve(elastic("c", low=1, high=1)))
    world.traffic("a", held=1)
    world.tick_for(1)
    world.ready("a/0")
    world.tick_for(3)
    assert world.state("a/0") is SlotState.READY
    assert "making room" not in (world.view("c/0")["reason"] or "")


def test_a_model_with_two_replicas_gives_back_its_highest_slot_the_one_its_count_drains():
    world = Fleet()
    world.node("node01", gpus=2)
    world.serve(elastic("a", low=0, high=2, idle_s=10_000, up_after_s=0, target_inflight=1),
                elastic("c", idle_s=10_000))
    world.traffic("a", inflight=5)
    world.tick_for(3)
    world.ready("a/0")
    world.ready("a/1")
    world.traffic("a", idle_s=100)
    world.tick_for(1)
    world.traffic("c", held=1)
    world.tick_for(1)
    assert world.state("a/1") is SlotState.DRAINING and world.state("a/0") is SlotState.READY
    world.tick_for(3)
    assert world.state("a/0") is SlotState.READY  # not woken back by the count it lost
