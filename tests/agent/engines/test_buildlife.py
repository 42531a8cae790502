"""An engine build's table, pair by pair: every (state, input) either moves where this file says or changes nothing."""

from __future__ import annotations

import itertools

import pytest

from llmgw.agent.engines.buildlife import BuildInput, BuildLifecycle
from llmgw.states import EngineState

S, I = EngineState, BuildInput
# A build this node holds is never absent: absent is the control plane's word.
STATES = [S.INSTALLING, S.INSTALLED, S.BROKEN]

# Written out again rather than read from the module, so that an edge added,
# dropped or redirected there fails here.
EXPECTED = {
    (S.INSTALLING, I.ATTEMPT): S.INSTALLING,
    (S.INSTALLING, I.STEP): S.INSTALLING,
    (S.INSTALLING, I.REPAIR): S.INSTALLING,
    (S.INSTALLING, I.REFUSED): S.BROKEN,
    (S.INSTALLING, I.RUNS): S.INSTALLED,
    (S.INSTALLING, I.FAILS): S.BROKEN,
    (S.INSTALLED, I.RUNS): S.INSTALLED,
    (S.INSTALLED, I.FAILS): S.BROKEN,
    (S.INSTALLED, I.REPAIR): S.INSTALLING,
    (S.INSTALLED, I.REFUSED): S.BROKEN,
    (S.BROKEN, I.ATTEMPT): S.INSTALLING,
    (S.BROKEN, I.RUNS): S.INSTALLED,
    (S.BROKEN, I.FAILS): S.BROKEN,
    (S.BROKEN, I.REPAIR): S.INSTALLING,
    (S.BROKEN, I.REFUSED): S.BROKEN,
}


def machine_in(state) -> BuildLifecycle:
    life = BuildLifecycle()
    life.state = state
    return life


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, BuildInput)),
                         ids=lambda v: getattr(v, "name", v))
def test_each_input_moves_a_state_where_the_table_says_or_leaves_it_alone(state, event):
    life = machine_in(state)
    target = life.fire(event)
    if (state, event) in EXPECTED:
        assert target == EXPECTED[(state, event)] and life.state == target
    else:
        assert target is None and life.state == state


def run(*events, initial=S.INSTALLING):
    life = BuildLifecycle(initial)
    for event in events:
        life.fire(event)
    return life.state


def test_an_install_steps_on_and_ends_broken_when_refused():
    assert run(I.ATTEMPT, I.STEP, I.STEP, I.REPAIR, I.STEP) == S.INSTALLING
    assert run(I.ATTEMPT, I.STEP, I.REFUSED) == S.BROKEN


def test_a_broken_build_is_installed_again_only_by_an_attempt_or_a_check():
    assert run(I.ATTEMPT, I.REFUSED, I.STEP) == S.BROKEN
    assert run(I.ATTEMPT, I.REFUSED, I.ATTEMPT, I.STEP) == S.INSTALLING


def test_a_check_moves_an_installed_build_between_installed_and_broken():
    assert run(I.FAILS, initial=S.INSTALLED) == S.BROKEN
    assert run(I.FAILS, I.RUNS, initial=S.INSTALLED) == S.INSTALLED
    # Installing OS packages for it in the check: installing meanwhile, then the check's answer.
    assert run(I.REPAIR, initial=S.INSTALLED) == S.INSTALLING
    assert run(I.FAILS, I.REPAIR, I.RUNS, initial=S.INSTALLED) == S.INSTALLED


def test_an_installed_build_takes_no_step_of_an_install_nor_an_attempt():
    assert run(I.ATTEMPT, I.STEP, initial=S.INSTALLED) == S.INSTALLED


@pytest.mark.parametrize("state", [S.BROKEN, S.ABSENT])
def test_a_build_cannot_begin_broken_or_absent(state):
    with pytest.raises(ValueError, match=f"cannot begin {state}; it begins installed, installing"):
        BuildLifecycle(state)
