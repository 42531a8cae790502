"""A shard's lifecycle on its node: states, inputs and the table between them, and nothing else.

The states are the wire's, ``llmgw.states.ShardState``, and one the agent
keeps to itself: *stopping*, between SIGTERM and the engine's whole group
being gone, which the node reports as draining because that is what it
means to a router.  One machine runs from the first state a shard is in on
this node to its last: fetching its weights, starting its engine, serving,
draining, and stopped or failed.  An input a state does not list is ignored
and leaves the state alone: a health probe that answers after a stop was
asked, a second stop.  (An engine install will stand before fetching, as
``installing --installed--> fetching``.)

Carrying a transition out is someone else's job: ``llmgw.agent.shard``'s
``ShardFetch`` while the weights come, its ``ShardRunner`` once an engine
runs.  The machine is a plain table, not automat: what a runner does depends
on the state it arrives in (every state but starting cancels the start
deadline; every terminal one removes the record), not on the edge taken, so
it needs the state, not an output per edge; and a dict is something a test
can walk pair by pair.
"""

from __future__ import annotations

import enum

from llmgw.states import SHARD_TERMINAL, ShardState


class ShardInput(enum.Enum):
    """What can happen to a shard on its node."""

    FETCHED = "fetched"  # its weights are on this node now
    FETCH_FAILED = "fetch failed"
    REFUSED = "refused"  # the node could not plan or launch its engine
    HEALTHY = "healthy"  # the health probe answered, or a worker rank ran a poll interval
    TIMED_OUT = "timed out"  # not healthy within the spec's start_timeout_s
    EXITED = "exited"  # the engine's leader, and with it its group, is gone
    DRAIN = "drain"
    STOP = "stop"
    SURVIVED_KILL = "survived kill"  # the group still runs kill_wait_s after SIGKILL


class _AgentOnly(enum.Enum):
    # Between SIGTERM and the group being gone.  The control plane never
    # hears of it: it is reported as draining.
    STOPPING = "stopping"


State = ShardState | _AgentOnly

#: The states a shard can begin in on this node: fetching its weights, starting
#: its engine (weights present, or an adopted engine probed again), or an
#: adopted engine its record says was draining.
BEGINNINGS = frozenset({ShardState.FETCHING, ShardState.STARTING, ShardState.DRAINING})


class ShardLifecycle:
    def __init__(self, initial: ShardState = ShardState.STARTING):
        if initial not in BEGINNINGS:
            raise ValueError(f"a shard cannot begin {initial}; it begins {', '.join(sorted(BEGINNINGS))}")
        self.state: State = initial

    @property
    def wire_state(self) -> ShardState:
        """The state as the control plane hears it."""
        return ShardState.DRAINING if self.state is _AgentOnly.STOPPING else self.state

    @property
    def stopping(self) -> bool:
        """A stop was asked and the engine's group is not yet gone."""
        return self.state is _AgentOnly.STOPPING

    @property
    def finished(self) -> bool:
        return self.state in SHARD_TERMINAL

    def fire(self, event: ShardInput) -> State | None:
        """The state *event* leads to, now current; None when this state ignores it."""
        target = _TABLE.get((self.state, event))
        if target is not None:
            self.state = target
        return target


_S, _I, _STOPPING = ShardState, ShardInput, _AgentOnly.STOPPING
_TABLE: dict[tuple[State, ShardInput], State] = {
    (_S.FETCHING, _I.FETCHED): _S.STARTING,
    (_S.FETCHING, _I.FETCH_FAILED): _S.FAILED,
    # No engine runs yet, so there is nothing to wait for: stopped at once,
    # never stopping.
    (_S.FETCHING, _I.STOP): _S.STOPPED,
    # Weights present, but the node cannot run the engine (no such engine,
    # arguments it refuses, a spawn that failed): failed before any process.
    (_S.STARTING, _I.REFUSED): _S.FAILED,
    (_S.STARTING, _I.HEALTHY): _S.READY,
    (_S.STARTING, _I.TIMED_OUT): _S.FAILED,
    (_S.STARTING, _I.EXITED): _S.FAILED,
    # Draining a shard that is still loading: it never gets traffic, but
    # stopping it stays the control plane's call.
    (_S.STARTING, _I.DRAIN): _S.DRAINING,
    (_S.STARTING, _I.STOP): _STOPPING,
    (_S.READY, _I.DRAIN): _S.DRAINING,
    (_S.READY, _I.EXITED): _S.FAILED,
    (_S.READY, _I.STOP): _STOPPING,
    # A drained engine that dies before anyone stops it has still failed.
    (_S.DRAINING, _I.EXITED): _S.FAILED,
    (_S.DRAINING, _I.STOP): _STOPPING,
    # Exiting is what stopping asked for.
    (_STOPPING, _I.EXITED): _S.STOPPED,
    (_STOPPING, _I.SURVIVED_KILL): _S.FAILED,
}
