"""A replica slot's lifecycle in the control plane: its record, states, inputs and the table between them.

A slot is ``<model>/<index>``: room in the catalog for one replica.  What
the catalog wants of it (``SlotDesire``) is kept apart from where it stands
(``SlotState``), as Nomad keeps an allocation's desired status apart from
its client status: the catalog changes the first, the fleet's reports and
the reconciler's own starts the second.

- *empty*: nothing of the replica runs and nothing is being started; it is
  placed as soon as the reconciler may (the fleet has settled).
- *launching*: starts have been asked of nodes and not all answered; the
  reconciler leaves the slot alone until they are.
- *running*: shards of it run, not all ready (loading, draining, or rank 0
  of a multi-node replica waiting for the others).
- *ready*: every rank is ready.
- *broken*: it failed whole; what is left of it is being stopped.
- *backing off*: it failed; nothing is placed before ``retry_at``.
- *held*: its starts keep being undone (two agents on one state_dir);
  nothing is placed before ``held_until``.
- *sleeping*: an elastic model wants fewer replicas than this slot
  (``llmgw.control.scaler``) and nothing of it runs; *wake* empties it.
- *draining*: it was ready and is wanted no longer (scaled down, idle, or
  evicted to make room): out of the routers' table, its requests in flight
  finishing; *drained* once the routers report none left on it.
- *stopping*: drained, its shards asked to stop; asleep once they are gone.

Shards a slot did not start — a restarted control plane hearing its agents,
a lost node coming back — are *seen*: the slot is running from then on,
whatever it was waiting for.  An input a state does not list is ignored
and leaves the state alone, as in ``llmgw.agent.lifecycle``.

``replica_state`` derives the ``ReplicaState`` that ctl, the TUI and the
routers read from a slot's state and its shards' states.
"""

from __future__ import annotations

import enum

import attrs

from llmgw.control.startup import Startup
from llmgw.states import ReplicaState, ShardState


class SlotDesire(enum.Enum):
    """What the catalog wants of a slot."""

    RUN = "run"  # the model is in the catalog and the slot below its ``replicas``
    RELEASE = "release"  # the model left the catalog, or was scaled below the slot


class SlotState(enum.Enum):
    """Where a slot stands."""

    EMPTY = "empty"
    LAUNCHING = "launching"
    RUNNING = "running"
    READY = "ready"
    BROKEN = "broken"
    BACKING_OFF = "backing off"
    HELD = "held"
    SLEEPING = "sleeping"
    DRAINING = "draining"
    STOPPING = "stopping"


class SlotInput(enum.Enum):
    """What can happen to a slot."""

    PLACED = "placed"  # a placement was made and its starts asked of the nodes
    STARTED = "started"  # every node asked took its start (or the attempt ended otherwise)
    REFUSED = "refused"  # a node refused a start
    SEEN = "seen"  # shards of the replica are reported alive
    ALL_READY = "all ready"  # every rank reports ready
    NOT_READY = "not ready"  # a rank no longer does (draining, or a rank still loading)
    FAILED = "failed"  # a rank failed, was lost, or waited too long
    GONE = "gone"  # nothing of the replica is left alive
    RETRY_DUE = "retry due"
    HOLD = "hold"  # an empty slot whose starts keep being undone
    HOLD_OVER = "hold over"
    SLEEP = "sleep"  # the scaler wants fewer replicas than this slot, and nothing of it runs
    WAKE = "wake"  # the scaler wants this slot again
    DRAIN = "drain"  # the scaler wants fewer, and this slot's replica runs
    DRAINED = "drained"  # no router has a request left on it (or drain_timeout_s passed)


@attrs.define
class Slot:
    """One slot's state and what the reconciler remembers of it: data only; ``fire`` moves the state."""

    state: SlotState = SlotState.EMPTY
    desired: SlotDesire = SlotDesire.RUN
    failures: int = 0
    retry_at: float | None = None
    # Why the slot holds no ready replica, in words for ctl.  ``failed`` says
    # whether they are a failure's; the reconciler decides from its state,
    # never from the words.  Both are set together, by ``explain``.
    reason: str | None = None
    failed: bool = False
    counted: set = attrs.Factory(set)  # (node, shard id, grant order) of failures already counted
    # When the slot was last started, until a stop in it is counted: a stop
    # soon after a start is the reconciler undoing its own work.
    started_at: float | None = None
    undone: int = 0  # starts undone in a row
    undone_at: float | None = None
    held_until: float | None = None  # no start before this, while it keeps being undone
    held_reason: str | None = None
    # A multi-node replica: its ordered start while one is under way, and
    # the nodes of its last placement (rank order).
    startup: Startup | None = None
    nodes: tuple[str, ...] = ()
    # When it began draining, and (an eviction) the replica it makes room for.
    drain_at: float | None = None
    drain_for: str | None = None

    def fire(self, event: SlotInput) -> SlotState | None:
        """The state *event* leads to, now current; None when this state ignores it."""
        target = TABLE.get((self.state, event))
        if target is not None:
            self.state = target
        return target

    def explain(self, reason: str | None, *, failed: bool = False) -> None:
        self.reason, self.failed = reason, failed


#: A replica is in the first of these states any of its shards is in.
_SUMMED = ((ShardState.FAILED, ReplicaState.FAILED), (ShardState.DRAINING, ReplicaState.DRAINING),
           (ShardState.FETCHING, ReplicaState.FETCHING), (ShardState.STARTING, ReplicaState.STARTING))


def replica_state(slot: Slot, shard_states: list[ShardState], whole: bool, now: float) -> ReplicaState:
    """What ctl calls the replica: from its slot, and its shards on usable nodes (*whole*: one per rank)."""
    if shard_states and slot.state is SlotState.BROKEN:
        return ReplicaState.FAILED  # its other ranks are being stopped
    if shard_states and slot.state in (SlotState.DRAINING, SlotState.STOPPING):
        return ReplicaState.DRAINING  # out of the routers' table, being scaled down
    if not shard_states and slot.state in (SlotState.SLEEPING, SlotState.DRAINING, SlotState.STOPPING):
        return ReplicaState.SLEEPING  # stopped; the next pass moves the slot itself to sleeping
    if shard_states:
        for shard_state, summed in _SUMMED:
            if shard_state in shard_states:
                return summed
        # Ready only once every rank is.
        ready = whole and all(s == ShardState.READY for s in shard_states)
        return ReplicaState.READY if ready else ReplicaState.STARTING
    if slot.state is SlotState.LAUNCHING:
        return ReplicaState.STARTING
    # A start a node refused is a failure too, not a replica nobody tried.
    waiting = slot.retry_at is not None and slot.retry_at > now
    failing = slot.state in (SlotState.BROKEN, SlotState.BACKING_OFF)
    return ReplicaState.FAILED if waiting and failing else ReplicaState.PENDING


def split_slot_id(replica_id: str) -> tuple[str, int | None]:
    """"gemma/1" is ("gemma", 1); an id that ends in no index is all model, its index None."""
    model, _, index = replica_id.rpartition("/")
    try:
        return model, int(index)
    except ValueError:
        return replica_id, None


_S, _I = SlotState, SlotInput
TABLE: dict[tuple[SlotState, SlotInput], SlotState] = {
    (_S.EMPTY, _I.PLACED): _S.LAUNCHING,
    # A restarted control plane, or a lost node back with its copy: the
    # replica runs though this reconciler did not start it.
    (_S.EMPTY, _I.SEEN): _S.RUNNING,
    # A failed shard reported while nothing of it runs (heard after a restart).
    (_S.EMPTY, _I.FAILED): _S.BROKEN,
    (_S.EMPTY, _I.HOLD): _S.HELD,
    # The attempt ends either way: "started" is also how an attempt that
    # raised lets go of the slot, whose next pass sees what the nodes report.
    (_S.LAUNCHING, _I.STARTED): _S.RUNNING,
    (_S.LAUNCHING, _I.REFUSED): _S.BROKEN,
    (_S.RUNNING, _I.ALL_READY): _S.READY,
    (_S.RUNNING, _I.FAILED): _S.BROKEN,
    (_S.RUNNING, _I.GONE): _S.EMPTY,
    # Rank 0 of a multi-node replica reported its rendezvous: the other
    # ranks' starts are asked, and the slot waits for those answers.
    (_S.RUNNING, _I.PLACED): _S.LAUNCHING,
    (_S.READY, _I.NOT_READY): _S.RUNNING,
    (_S.READY, _I.FAILED): _S.BROKEN,
    (_S.READY, _I.GONE): _S.EMPTY,
    # Once what is left is stopped, the failure's backoff holds the slot.
    (_S.BROKEN, _I.GONE): _S.BACKING_OFF,
    (_S.BACKING_OFF, _I.RETRY_DUE): _S.EMPTY,
    (_S.BACKING_OFF, _I.SEEN): _S.RUNNING,
    # Another failure (a copy of an older grant) counts again.
    (_S.BACKING_OFF, _I.FAILED): _S.BROKEN,
    (_S.HELD, _I.HOLD_OVER): _S.EMPTY,
    (_S.HELD, _I.SEEN): _S.RUNNING,
    (_S.HELD, _I.FAILED): _S.BROKEN,
    # Elastic replicas: a slot above the scaler's count sleeps once nothing
    # of it runs; one that runs is drained first, so no request fails.
    (_S.EMPTY, _I.SLEEP): _S.SLEEPING,
    (_S.BACKING_OFF, _I.SLEEP): _S.SLEEPING,
    (_S.HELD, _I.SLEEP): _S.SLEEPING,
    (_S.SLEEPING, _I.WAKE): _S.EMPTY,
    # A copy still running (heard after a restart) is a replica like any other: drained if unwanted.
    (_S.SLEEPING, _I.SEEN): _S.RUNNING,
    (_S.READY, _I.DRAIN): _S.DRAINING,
    # Still loading: not in any table, so nothing is in flight on it.
    (_S.RUNNING, _I.DRAIN): _S.DRAINING,
    # Wanted again before it was stopped: back in the table as it is.
    (_S.DRAINING, _I.WAKE): _S.RUNNING,
    (_S.DRAINING, _I.DRAINED): _S.STOPPING,
    (_S.DRAINING, _I.FAILED): _S.BROKEN,
    (_S.DRAINING, _I.GONE): _S.SLEEPING,
    (_S.STOPPING, _I.GONE): _S.SLEEPING,
    (_S.STOPPING, _I.FAILED): _S.BROKEN,
}
