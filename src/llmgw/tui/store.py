"""What the dashboard knows of the fleet, and the events not yet shown.

Events are queued, not applied: a node's later view replaces its earlier one
in the queue, and the app applies the queue in passes.  A view that changes
what a node *is* (state, cordon, reason, engines...) is urgent and goes out
with the next pass, within ``FLUSH_S``; one that only moves its figures
(a heartbeat: memory, GPU use, free space) waits for the pass that also ages
"last seen", every couple of seconds.  Redrawing a table costs the same
whether one row changed or twenty, and a thousand nodes heartbeating every
five seconds would otherwise redraw it ten times a second.  A node forgotten
(offboarded) is queued the same way, as its leaving, and is urgent.

While a snapshot is being taken the queue is held, and applied after the
snapshot, which it is newer than.
"""

from __future__ import annotations

from typing import Callable

import attrs

from llmgw.states import NodeState, ReplicaState
from llmgw.views import NodeView, ReplicaView

FLUSH_S = 0.1

# What a heartbeat changes; a view that differs from the last only in these
# is not urgent.
FIGURES = frozenset({"last_seen", "seen_ago_s", "memory_available_bytes", "gpus", "filesystems"})
_WHAT_IT_IS = tuple(f.name for f in attrs.fields(NodeView) if f.name not in FIGURES)


def urgent(old: NodeView | None, new: NodeView) -> bool:
    if old is None:
        return True
    return any(getattr(old, name) != getattr(new, name) for name in _WHAT_IT_IS)


class FleetStore:
    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self.nodes: dict[str, NodeView] = {}
        self.replicas: dict[str, ReplicaView] = {}
        # The local time at which each node was last heard from: its view's
        # seen_ago_s subtracted from when the view arrived, so "last seen"
        # keeps counting between events without trusting the server's clock.
        self._heard_at: dict[str, float] = {}
        # Per node, its latest view not yet shown and when it arrived; None: the node was forgotten.
        self._pending: dict[str, tuple[NodeView | None, float]] = {}
        # When the replicas were fetched: their age_s counts on from there, as "last seen" does.
        self._replicas_at = 0.0
        self._urgent: set[str] = set()
        self._ready_nodes = 0
        self._ready_replicas = 0
        #: A shard event arrived since the replicas were last fetched.
        self.replicas_dirty = False
        #: No snapshot since the link came up: events wait in the queue.
        self.syncing = True
        self.loaded = False

    # -- arriving --

    def link_up(self) -> None:
        """A snapshot is about to be asked for: what is queued is older than its answer."""
        self._pending.clear()
        self._urgent.clear()
        self.replicas_dirty = False
        self.syncing = True

    def queue_node(self, view: NodeView) -> None:
        node_id = view.id
        if node_id not in self._urgent:
            queued = self._pending.get(node_id)
            if urgent(queued[0] if queued else self.nodes.get(node_id), view):
                self._urgent.add(node_id)
        self._pending[node_id] = (view, self._clock())

    def forget_node(self, node_id: str) -> None:
        """The node left the fleet (offboarded): it goes with the next pass, and a view queued before goes with it."""
        self._urgent.add(node_id)
        self._pending[node_id] = (None, self._clock())

    def heard(self, seen_ago_s: dict[str, float]) -> None:
        """Nodes heard from lately (``llmgw.event.heard``): "last seen" counts from then, shown at the next tick."""
        if self.syncing:
            return
        now = self._clock()
        for node_id, ago in seen_ago_s.items():
            if node_id in self.nodes:
                self._hear(node_id, now - ago)

    def mark_replicas(self) -> None:
        self.replicas_dirty = True

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- applying --

    def load(self, nodes: list[NodeView], replicas: list[ReplicaView]) -> None:
        """Replace everything with a snapshot."""
        now = self._clock()
        self.nodes = {}
        self._heard_at = {}
        self._ready_nodes = 0
        for view in nodes:
            self._put(view, now)
        self.set_replicas(replicas)
        self.syncing = False
        self.loaded = True

    def take_nodes(self, figures: bool = False) -> dict[str, NodeView | None]:
        """Apply the urgent queued node views (and, with *figures*, all of them); return them by id, None for one gone."""
        if self.syncing or not self._pending:
            return {}
        if figures:
            taken, self._pending = self._pending, {}
            self._urgent.clear()
        else:
            taken = {node_id: self._pending.pop(node_id) for node_id in self._urgent}
            self._urgent.clear()
        for node_id, (view, received) in taken.items():
            if view is None:
                self._drop(node_id)
            else:
                self._put(view, received)
        return {node_id: view for node_id, (view, _) in taken.items()}

    def set_replicas(self, replicas: list[ReplicaView]) -> None:
        # replicas_dirty is not cleared here: a shard event that arrived
        # after this answer left must still cause a fetch.
        self.replicas = {r.replica: r for r in replicas}
        self._replicas_at = self._clock()
        self._ready_replicas = sum(1 for r in replicas if r.state == ReplicaState.READY)

    def _put(self, view: NodeView, received: float) -> None:
        old = self.nodes.get(view.id)
        self._ready_nodes += (view.state == NodeState.READY) - (old is not None and old.state == NodeState.READY)
        self.nodes[view.id] = view
        if view.seen_ago_s is None:
            self._heard_at.pop(view.id, None)
        else:
            self._hear(view.id, received - view.seen_ago_s)

    def _drop(self, node_id: str) -> None:
        old = self.nodes.pop(node_id, None)
        self._ready_nodes -= old is not None and old.state == NodeState.READY
        self._heard_at.pop(node_id, None)

    def _hear(self, node_id: str, at: float) -> None:
        # A view queued before a batch of heard nodes arrived is older than it.
        heard = self._heard_at.get(node_id)
        self._heard_at[node_id] = at if heard is None else max(heard, at)

    # -- reading --

    def seen_ago(self, node_id: str) -> float | None:
        heard = self._heard_at.get(node_id)
        return None if heard is None else max(0.0, self._clock() - heard)

    def replica_age(self, replica_id: str) -> float | None:
        replica = self.replicas.get(replica_id)
        if replica is None or replica.age_s is None:
            return None
        return replica.age_s + max(0.0, self._clock() - self._replicas_at)

    def replicas_on(self, node_id: str) -> list[ReplicaView]:
        return [r for r in self.replicas.values() if node_id in r.nodes or any(s.node == node_id for s in r.shards)]

    def counts(self) -> tuple[int, int, int, int]:
        """(nodes, ready nodes, replicas, ready replicas)."""
        return len(self.nodes), self._ready_nodes, len(self.replicas), self._ready_replicas
