"""A node's machine in the fleet: what each thing the fleet learns does to its state.

A node is ``ready`` while its heartbeats arrive, ``unreachable`` once they
have stopped for ``unreachable_after`` seconds (or its link closed), and
``lost`` after ``lost_after``; hearing from it again makes it ready.  Those
transitions are the table at the bottom of this module, on ``NodeState``
members; nothing else decides a node's state.  The fleet
(``llmgw.control.fleet``) feeds it and stores what it answers.
"""

from __future__ import annotations

import enum

from llmgw.states import NodeState


class NodeInput(enum.Enum):
    """What the fleet learns about a node."""

    HEARD = "heard"  # it registered, or a heartbeat arrived on its session
    LINK_CLOSED = "link closed"  # the hub says its session ended
    SILENT = "silent"  # no heartbeat for unreachable_after
    SILENT_LONG = "silent long"  # no heartbeat for lost_after


def node_after(state: NodeState, event: NodeInput) -> NodeState:
    """The state a node in *state* is in after *event*: itself, when its state ignores it."""
    return _NODE_TABLE.get((state, event), state)


_N, _NI = NodeState, NodeInput
_NODE_TABLE: dict[tuple[NodeState, NodeInput], NodeState] = {
    (_N.READY, _NI.LINK_CLOSED): _N.UNREACHABLE,
    (_N.READY, _NI.SILENT): _N.UNREACHABLE,
    # A check that came late (a stalled control plane), or lost_after set no
    # longer than unreachable_after: silence long enough is lost from ready too.
    (_N.READY, _NI.SILENT_LONG): _N.LOST,
    (_N.UNREACHABLE, _NI.SILENT_LONG): _N.LOST,
    (_N.UNREACHABLE, _NI.HEARD): _N.READY,
    # A lost node that comes back is simply ready: its shards were placed
    # elsewhere meanwhile, and the reconciler stops whichever copy is extra.
    (_N.LOST, _NI.HEARD): _N.READY,
}
