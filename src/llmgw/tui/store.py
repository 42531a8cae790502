"""What the dashboard knows of the fleet, and the events not yet shown.

Events are queued, not applied: a node's later view replaces its earlier one
in the queue, and the app applies the queue in passes.  A view that changes
what a node *is* (state, cordon, reason, engines...) is urgent and goes out
with the next pass, within ``FLUSH_S``; one that only moves its figures
(a heartbeat: memory, GPU use, free space) waits for the pass that also ages
"last seen", every couple of seconds.  Redrawing a table costs the same
whether one row changed or twenty, and a thousand nodes heartbeating every
five seconds would otherwise redraw it ten times a second.

While a snapshot is being taken the queue is held, and applied after the
snapshot, which it is newer than.
"""

from __future__ import annotations

from typing import Any, Callable

FLUSH_S = 0.1

# What a heartbeat changes; a view that differs from the last only in these
# is not urgent.
FIGURES = frozenset({"last_seen", "seen_ago_s", "memory_available_bytes", "gpus", "filesystems"})


def urgent(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    if old is None:
        return True
    keys = old.keys() | new.keys()
    return any(old.get(k) != new.get(k) for k in keys - FIGURES)


class FleetStore:
    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self.nodes: dict[str, dict[str, Any]] = {}
        self.replicas: dict[str, dict[str, Any]] = {}
        # The local time at which each node was last heard from: its view's
        # seen_ago_s subtracted from when the view arrived, so "last seen"
        # keeps counting between events without trusting the server's clock.
        self._heard_at: dict[str, float] = {}
        self._pending: dict[str, tuple[dict[str, Any], float]] = {}
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

    def queue_node(self, view: dict[str, Any]) -> None:
        node_id = view["id"]
        if node_id not in self._urgent:
            queued = self._pending.get(node_id)
            if urgent(queued[0] if queued else self.nodes.get(node_id), view):
                self._urgent.add(node_id)
        self._pending[node_id] = (view, self._clock())

    def mark_replicas(self) -> None:
        self.replicas_dirty = True

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- applying --

    def load(self, nodes: list[dict[str, Any]], replicas: list[dict[str, Any]]) -> None:
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

    def take_nodes(self, figures: bool = False) -> dict[str, dict[str, Any]]:
        """Apply the urgent queued node views (and, with *figures*, all of them); return them by id."""
        if self.syncing or not self._pending:
            return {}
        if figures:
            taken, self._pending = self._pending, {}
            self._urgent.clear()
        else:
            taken = {node_id: self._pending.pop(node_id) for node_id in self._urgent}
            self._urgent.clear()
        for view, received in taken.values():
            self._put(view, received)
        return {node_id: view for node_id, (view, _) in taken.items()}

    def set_replicas(self, replicas: list[dict[str, Any]]) -> None:
        # replicas_dirty is not cleared here: a shard event that arrived
        # after this answer left must still cause a fetch.
        self.replicas = {r["replica"]: r for r in replicas}
        self._ready_replicas = sum(1 for r in replicas if r.get("state") == "ready")

    def _put(self, view: dict[str, Any], received: float) -> None:
        old = self.nodes.get(view["id"])
        self._ready_nodes += (view.get("state") == "ready") - (old is not None and old.get("state") == "ready")
        self.nodes[view["id"]] = view
        ago = view.get("seen_ago_s")
        if ago is None:
            self._heard_at.pop(view["id"], None)
        else:
            self._heard_at[view["id"]] = received - ago

    # -- reading --

    def seen_ago(self, node_id: str) -> float | None:
        heard = self._heard_at.get(node_id)
        return None if heard is None else max(0.0, self._clock() - heard)

    def replicas_on(self, node_id: str) -> list[dict[str, Any]]:
        return [r for r in self.replicas.values() if node_id in (r.get("nodes") or [])
                or any(s.get("node") == node_id for s in r.get("shards") or [])]

    def counts(self) -> tuple[int, int, int, int]:
        """(nodes, ready nodes, replicas, ready replicas)."""
        return len(self.nodes), self._ready_nodes, len(self.replicas), self._ready_replicas
