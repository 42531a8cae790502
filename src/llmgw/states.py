"""The states of what llmgw runs, named once and imported everywhere else.

The agent, the fleet, the reconciler, the collector, ctl and the dashboard
all speak of shards, replicas and nodes in these words; none of them writes
a state as a string literal.  Each enum is a ``str`` whose value is what
travels on the link, so an older peer that sends or reads plain strings
keeps working.  Behaviour is decided by these members, never by the wording
of a reason.

The machines that move between them live with their owner: a shard's
lifecycle in ``llmgw.agent.lifecycle`` (the node runs it), a node's in
``llmgw.control.nodemachine`` (the control plane decides it from heartbeats), and a
replica slot's in ``llmgw.control.slot`` (the reconciler's); an engine build's
in ``llmgw.agent.engines.buildlife``.
"""

from __future__ import annotations

import enum


class ShardState(enum.StrEnum):
    """One rank of one replica on its node, as the node reports it."""

    # Waiting for the node to fetch the model's weights.  (An engine install
    # will stand beside it here as INSTALLING.)
    FETCHING = "fetching"
    # The engine runs and has not yet answered its health probe.
    STARTING = "starting"
    READY = "ready"
    # Serving what it has, taking nothing new; the control plane stops it.
    DRAINING = "draining"
    # Gone because it was asked to go.  Never kept: the fleet forgets it.
    STOPPED = "stopped"
    # Gone by itself, or never came up; the reason and output tail say why.
    FAILED = "failed"


#: Shards that hold (or are about to hold) a slot, its GPUs and its memory.
SHARD_ALIVE = frozenset({ShardState.FETCHING, ShardState.STARTING, ShardState.READY, ShardState.DRAINING})
#: Shards that will not change again.
SHARD_TERMINAL = frozenset({ShardState.STOPPED, ShardState.FAILED})


class ReplicaState(enum.StrEnum):
    """A slot of a model, as the control plane sums its shards up."""

    # Nothing runs in the slot yet: not placed, waiting to settle, or unplaceable.
    PENDING = "pending"
    FETCHING = "fetching"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    # A shard failed, or a node refused to start one; retried after a backoff.
    FAILED = "failed"
    # Scaled to zero (or below the slot) while idle: started again on demand.
    SLEEPING = "sleeping"


class EngineState(enum.StrEnum):
    """One engine build on a node, as the node reports it (``EngineInfo.state``)."""

    # Being downloaded, checked or unpacked; ``reason`` says which, in the node's words.
    INSTALLING = "installing"
    # Unpacked, its libraries all found and ``--version`` answered: it can run.
    INSTALLED = "installed"
    # Tried and does not run here (a missing library, a bad checksum, a
    # failed --version); ``reason`` says why and what to do.
    BROKEN = "broken"
    # Not on this node, and not wanted: neither server.yaml's catalog nor
    # agent.yaml names it.
    ABSENT = "absent"


class NodeState(enum.StrEnum):
    """A node as the fleet sees it from its heartbeats."""

    READY = "ready"
    # Its link closed or its heartbeats stopped; its engines are left alone,
    # since its agent may only be restarting.
    UNREACHABLE = "unreachable"
    # Silent for long enough that its shards are placed elsewhere.
    LOST = "lost"
