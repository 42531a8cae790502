"""A shard's lifecycle table, pair by pair: every (state, input) either moves where this file says or changes nothing."""

from __future__ import annotations

import itertools

import pytest

from llmgw.agent import lifecycle
from llmgw.agent.lifecycle import ShardInput, ShardLifecycle
from llmgw.states import ShardState

S, I = ShardState, ShardInput
STOPPING = lifecycle._AgentOnly.STOPPING
STATES = [*ShardState, STOPPING]

# Written out again rather than read from the module, so that an edge added,
# dropped or redirected there fails here.
EXPECTED = {
    (S.FETCHING, I.FETCHED): S.STARTING,
    (S.FETCHING, I.FETCH_FAILED): S.FAILED,
    (S.FETCHING, I.STOP): S.STOPPED,
    (S.STARTING, I.REFUSED): S.FAILED,
    (S.STARTING, I.HEALTHY): S.READY,
    (S.STARTING, I.TIMED_OUT): S.FAILED,
    (S.STARTING, I.EXITED): S.FAILED,
    (S.STARTING, I.DRAIN): S.DRAINING,
    (S.STARTING, I.STOP): STOPPING,
    (S.READY, I.DRAIN): S.DRAINING,
    (S.READY, I.EXITED): S.FAILED,
    (S.READY, I.STOP): STOPPING,
    (S.DRAINING, I.EXITED): S.FAILED,
    (S.DRAINING, I.STOP): STOPPING,
    (STOPPING, I.EXITED): S.STOPPED,
    (STOPPING, I.SURVIVED_KILL): S.FAILED,
}


def machine_in(state) -> ShardLifecycle:
    life = ShardLifecycle()
    life.state = state
    return life


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, ShardInput)),
                         ids=lambda v: getattr(v, "name", v))
def test_each_input_moves_a_state_where_the_table_says_or_leaves_it_alone(state, event):
    life = machine_in(state)
    target = life.fire(event)
    if (state, event) in EXPECTED:
        assert target == EXPECTED[(state, event)] and life.state == target
    else:
        assert target is None and life.state == state


def run(*events, initial=S.STARTING):
    life = ShardLifecycle(initial)
    for event in events:
        life.fire(event)
    return life.state, life.wire_state


def test_stopping_is_the_agents_own_and_the_wire_hears_draining():
    assert run(I.HEALTHY, I.STOP) == (STOPPING, S.DRAINING)
    assert machine_in(STOPPING).stopping and not machine_in(S.DRAINING).stopping
    assert {machine_in(state).wire_state for state in STATES} == set(ShardState)


def test_a_fetch_goes_through_the_same_machine_as_the_engine():
    assert run(I.FETCHED, I.HEALTHY, I.STOP, I.EXITED, initial=S.FETCHING) == (S.STOPPED, S.STOPPED)
    assert run(I.FETCH_FAILED, initial=S.FETCHING) == (S.FAILED, S.FAILED)
    # The engine's inputs mean nothing before the weights are here.
    assert run(I.HEALTHY, I.EXITED, I.TIMED_OUT, I.DRAIN, initial=S.FETCHING) == (S.FETCHING, S.FETCHING)


def test_stopping_a_fetch_is_stopped_at_once_since_no_engine_runs():
    life = ShardLifecycle(S.FETCHING)
    life.fire(I.STOP)
    assert life.state == S.STOPPED and life.finished
    assert life.fire(I.FETCHED) is None and life.state == S.STOPPED


def test_draining_a_shard_still_starting_is_allowed_and_it_can_still_fail():
    assert run(I.DRAIN) == (S.DRAINING, S.DRAINING)
    assert run(I.DRAIN, I.HEALTHY) == (S.DRAINING, S.DRAINING)
    assert run(I.HEALTHY, I.DRAIN, I.EXITED) == (S.FAILED, S.FAILED)


def test_exiting_is_what_a_stop_asked_for_even_before_ready():
    assert run(I.STOP, I.EXITED) == (S.STOPPED, S.STOPPED)
    assert run(I.STOP, I.HEALTHY, I.TIMED_OUT, I.DRAIN) == (STOPPING, S.DRAINING)


def test_a_group_that_survives_sigkill_has_failed():
    assert run(I.STOP, I.SURVIVED_KILL) == (S.FAILED, S.FAILED)


def test_a_refused_launch_fails_before_any_engine_runs():
    assert run(I.REFUSED) == (S.FAILED, S.FAILED)
    assert run(I.HEALTHY, I.REFUSED) == (S.READY, S.READY)


def test_an_adopted_engine_recorded_as_draining_begins_draining():
    assert run(I.EXITED, initial=S.DRAINING) == (S.FAILED, S.FAILED)


@pytest.mark.parametrize("state", [S.READY, S.STOPPED, S.FAILED])
def test_a_shard_cannot_begin_in_the_middle_of_its_life(state):
    with pytest.raises(ValueError, match=f"cannot begin {state}; it begins draining, fetching, starting"):
        ShardLifecycle(state)
