"""A replica slot's machine, pair by pair, and the reconciler driving it through a replica's life.

The table is written out again here rather than read from the module, so
that an edge added, dropped or redirected there fails here.
"""

from __future__ import annotations

import itertools

import pytest
from llmgw.control.slot import TABLE, Slot, SlotDesire, SlotInput, SlotState, replica_state, split_slot_id
from llmgw.states import ReplicaState, ShardState
from tests.control.test_reconciler import World, entry

S, I = SlotState, SlotInput

EXPECTED = {
    (S.EMPTY, I.PLACED): S.LAUNCHING,
    (S.EMPTY, I.SEEN): S.RUNNING,
    (S.EMPTY, I.FAILED): S.BROKEN,
    (S.EMPTY, I.HOLD): S.HELD,
    (S.LAUNCHING, I.STARTED): S.RUNNING,
    (S.LAUNCHING, I.REFUSED): S.BROKEN,
    (S.RUNNING, I.ALL_READY): S.READY,
    (S.RUNNING, I.FAILED): S.BROKEN,
    (S.RUNNING, I.GONE): S.EMPTY,
    (S.RUNNING, I.PLACED): S.LAUNCHING,
    (S.READY, I.NOT_READY): S.RUNNING,
    (S.READY, I.FAILED): S.BROKEN,
    (S.READY, I.GONE): S.EMPTY,
    (S.BROKEN, I.GONE): S.BACKING_OFF,
    (S.BACKING_OFF, I.RETRY_DUE): S.EMPTY,
    (S.BACKING_OFF, I.SEEN): S.RUNNING,
    (S.BACKING_OFF, I.FAILED): S.BROKEN,
    (S.HELD, I.HOLD_OVER): S.EMPTY,
    (S.HELD, I.SEEN): S.RUNNING,
    (S.HELD, I.FAILED): S.BROKEN,
    (S.EMPTY, I.SLEEP): S.SLEEPING,
    (S.BACKING_OFF, I.SLEEP): S.SLEEPING,
    (S.HELD, I.SLEEP): S.SLEEPING,
    (S.SLEEPING, I.WAKE): S.EMPTY,
    (S.SLEEPING, I.SEEN): S.RUNNING,
    (S.READY, I.DRAIN): S.DRAINING,
    (S.RUNNING, I.DRAIN): S.DRAINING,
    (S.DRAINING, I.WAKE): S.RUNNING,
    (S.DRAINING, I.DRAINED): S.STOPPING,
    (S.DRAINING, I.FAILED): S.BROKEN,
    (S.DRAINING, I.GONE): S.SLEEPING,
    (S.STOPPING, I.GONE): S.SLEEPING,
    (S.STOPPING, I.FAILED): S.BROKEN,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(SlotState, SlotInput)),
                         ids=lambda v: getattr(v, "name", v))
def test_each_input_moves_a_slot_where_the_table_says_or_leaves_it_alone(state, event):
    slot = Slot(state=state)
    target = slot.fire(event)
    if (state, event) in EXPECTED:
        assert target == EXPECTED[(state, event)] and slot.state == target
    else:
        assert target is None and slot.state == state


def test_the_table_is_the_one_written_here():
    assert TABLE == EXPECTED


def test_every_state_is_reached_from_empty_and_every_state_has_a_way_back_to_empty():
    reached, frontier = {S.EMPTY}, [S.EMPTY]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TABLE.items():
            if source == state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(SlotState)
    for start in SlotState:
        seen, frontier = {start}, [start]
        while frontier:
            state = frontier.pop()
            for (source, _), target in TABLE.items():
                if source == state and target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert S.EMPTY in seen, f"{start} never comes back to empty"


@pytest.mark.parametrize(("state", "retry_in", "expected"), [
    (S.EMPTY, None, ReplicaState.PENDING),
    (S.HELD, None, ReplicaState.PENDING),
    (S.LAUNCHING, None, ReplicaState.STARTING),
    (S.BACKING_OFF, 5.0, ReplicaState.FAILED),
    (S.BROKEN, 5.0, ReplicaState.FAILED),
    # The backoff is over but the next pass has not placed it yet: nothing is failing now.
    (S.BACKING_OFF, -1.0, ReplicaState.PENDING),
    (S.SLEEPING, None, ReplicaState.SLEEPING),
    # Its shards are gone and the next pass has not yet put the slot to sleep: asleep all the same.
    (S.STOPPING, None, ReplicaState.SLEEPING),
    (S.DRAINING, None, ReplicaState.SLEEPING),
])
def test_a_replica_with_no_shards_is_named_by_its_slot(state, retry_in, expected):
    slot = Slot(state=state, retry_at=None if retry_in is None else 100.0 + retry_in)
    assert replica_state(slot, [], whole=False, now=100.0) == expected


def test_a_replica_with_shards_is_named_by_them_and_ready_only_when_whole():
    running = Slot(state=S.RUNNING)
    assert replica_state(running, [ShardState.READY, ShardState.FETCHING], True, 0) == ReplicaState.FETCHING
    assert replica_state(running, [ShardState.READY], whole=False, now=0) == ReplicaState.STARTING
    assert replica_state(running, [ShardState.READY, ShardState.READY], True, 0) == ReplicaState.READY
    # Ranks still up while a broken replica is stopped are not its state: the slot's failure is.
    assert replica_state(Slot(state=S.BROKEN), [ShardState.READY], True, 0) == ReplicaState.FAILED


def test_slot_ids_split_into_model_and_index():
    assert split_slot_id("org/gemma/1") == ("org/gemma", 1)
    assert split_slot_id("gemma") == ("gemma", None)
    assert split_slot_id("gemma/x") == ("gemma/x", None)


# -- the reconciler, deciding by state --

def test_a_replica_goes_empty_launching_running_ready_then_broken_backing_off_and_placed_again():
    world = World()
    world.node("node01")
    world.held = []
    world.serve(entry())
    world.tick_for(1)
    slot = world.reconciler.slots["echo/0"]
    assert slot.state is S.LAUNCHING
    world.tick_for(1)  # a start in flight: the slot is left alone, nothing placed twice
    assert slot.state is S.LAUNCHING and len(world.starts) == 1
    world.held.pop().callback(None)
    assert slot.state is S.RUNNING
    world.report("echo/0/0", "ready")
    world.tick_for(1)
    assert slot.state is S.READY
    world.report("echo/0/0", "failed", reason="exited with status 1")
    world.tick_for(1)
    assert slot.state is S.BACKING_OFF and slot.failures == 1
    world.held = None
    world.tick_for(1)  # the first backoff is 1 s: placed again on the next pass
    assert slot.state is S.RUNNING and len(world.starts) == 2


def test_a_refused_start_breaks_the_slot_and_its_backoff_holds_it():
    world = World()
    world.node("node01")
    world.refusals["node01"] = "no engine sim on this node"
    world.serve(entry())
    world.tick_for(1)
    slot = world.reconciler.slots["echo/0"]
    assert slot.state is S.BROKEN and slot.failures == 1
    world.tick_for(1)  # gone, its 1 s backoff over: placed again, and refused again
    assert slot.state is S.BROKEN and slot.failures == 2 and len(world.starts) == 2


def test_a_restarted_control_plane_adopts_a_running_replica_as_running_without_starting_it():
    world = World()
    world.serve(entry())
    world.back_with_echo()
    world.tick_for(1)
    slot = world.reconciler.slots["echo/0"]
    assert slot.state is S.READY and world.starts == []


def test_a_slot_whose_starts_keep_being_undone_is_held_then_let_go():
    world = World()
    world.node("node01")
    world.serve(entry())
    world.tick_for(1)
    slot = world.reconciler.slots["echo/0"]
    slot.held_until, slot.held_reason = world.clock.seconds() + 10, "held back: a test"
    world.report("echo/0/0", "stopped")
    world.fleet.forget_shard("node01", "echo/0/0")
    world.tick_for(1)
    assert slot.state is S.HELD and slot.reason == "held back: a test"
    world.tick_for(10)
    assert slot.state is S.RUNNING and len(world.starts) == 2


def test_a_released_slot_is_marked_so_and_its_shards_stopped():
    world = World()
    world.node("node01")
    world.serve(entry(replicas=2))
    world.tick_for(1)
    world.serve(entry(replicas=1))
    world.tick_for(1)
    assert world.reconciler.slots["echo/1"].desired is SlotDesire.RELEASE
    assert world.reconciler.slots["echo/0"].desired is SlotDesire.RUN
    assert ("node01", "echo/1/0") in world.stops

