"""An in-process backend for Pilot tests and the benchmark, and a simulated fleet to fill it.

``FakeBackend`` keeps the view records it is given (``llmgw.views``, the
same records the real backend decodes from the hub) and hands them out;
tests drive it (``emit_node``, ``disconnect``...) and read what the app
asked of it in ``calls``.  It shares the ``Backend`` interface with
``WampBackend``, and the real-server tests exercise the same app code through
the real one.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from typing import Any, Iterable

import attrs

from llmgw.answers import CordonAnswer, DrainAnswer
from llmgw.history import Figures, JournalEntry, JournalKind, JournalPage
from llmgw.states import EngineState, NodeState, ReplicaState, ShardState
from llmgw.tui.backend import ActionFailed, Backend, LogsUnavailable, NotConnected
from llmgw.views import NodeView, ReplicaView, ServerView
from llmgw.wire import from_wire, to_wire


class FakeBackend(Backend):
    hub = "fake://fleet"

    def __init__(
        self,
        nodes: Iterable[NodeView] = (),
        replicas: Iterable[ReplicaView] = (),
        logs: dict[tuple[str, str | None], list[str]] | None = None,
        connected: bool = True,
    ):
        super().__init__()
        self.nodes: dict[str, NodeView] = {n.id: n for n in nodes}
        self.replica_views: list[ReplicaView] = list(replicas)
        #: (node, source) -> lines; a node missing here has no logs to give.
        self.log_lines: dict[tuple[str, str | None], list[str]] = dict(logs or {})
        #: Nodes whose logs fail as an agent too old to send them would.
        self.logs_unavailable: dict[str, str] = {}
        self.connected = connected
        #: Every request the app made, in order: ("snapshot",), ("drain", "node01")...
        self.calls: list[tuple] = []
        #: Set to make snapshot() wait until it is set (a slow hub).
        self.hold_snapshot: asyncio.Event | None = None
        #: What llmgw.cp.events and llmgw.cp.figures answer; an ActionFailed's words instead when set.
        self.journal = JournalPage(entries=[JournalEntry(1, time.time(), JournalKind.SERVER_STARTED, "server")],
                                   newest_seq=1)
        self.figured = Figures()
        self.history_error: str | None = None
        #: What llmgw.cp.status lists of the servers (ha:); none by default.
        self.server_views: list[ServerView] = []

    async def start(self) -> None:
        if self.connected:
            self.connect()

    async def stop(self) -> None:
        self.calls.append(("stop",))
        self.connected = False

    # -- what tests do to it --

    def connect(self) -> None:
        self.connected = True
        if self.listener is not None:
            self.listener.link_up()

    def disconnect(self, reason: str = "the hub at fake://fleet closed the connection") -> None:
        self.connected = False
        if self.listener is not None:
            self.listener.link_down(reason)

    def emit_node(self, view: NodeView) -> None:
        self.nodes[view.id] = view
        if self.listener is not None and self.connected:
            self.listener.node_changed(view)

    def emit_heard(self, seen_ago_s: dict[str, float]) -> None:
        """Say these nodes were heard from, so many seconds ago each (``llmgw.event.heard``)."""
        if self.listener is not None and self.connected:
            self.listener.nodes_heard(seen_ago_s)

    def emit_journal(self, entry: JournalEntry) -> None:
        """Record *entry* and publish it, as the control plane does (``llmgw.event.journal``)."""
        self.journal = attrs.evolve(self.journal, entries=[*self.journal.entries, entry], newest_seq=entry.seq)
        if self.listener is not None and self.connected:
            self.listener.journal_entry(entry)

    def set_replicas(self, views: Iterable[ReplicaView], shard_id: str = "any/0/0") -> None:
        """Replace the replica views and send the shard event that says they changed."""
        self.replica_views = list(views)
        if self.listener is not None and self.connected:
            self.listener.shard_changed(shard_id)

    # -- the Backend interface --

    def _need_link(self) -> None:
        if not self.connected:
            raise NotConnected("not connected to the hub; reconnecting")

    async def snapshot(self):
        self.calls.append(("snapshot",))
        if self.hold_snapshot is not None:
            await self.hold_snapshot.wait()
        self._need_link()
        return sorted(self.nodes.values(), key=lambda n: n.id), list(self.replica_views)

    async def replicas(self):
        self.calls.append(("replicas",))
        self._need_link()
        return list(self.replica_views)

    async def logs(self, node_id, source, n):
        self.calls.append(("logs", node_id, source, n))
        self._check_logs(node_id)
        lines = self.log_lines.get((node_id, source), [])
        return list(lines[-n:]) if n else []

    async def log_sources(self, node_id):
        self.calls.append(("log_sources", node_id))
        self._check_logs(node_id)
        return sorted({source or "agent" for node, source in self.log_lines if node == node_id})

    async def servers(self):
        self._need_link()  # not in calls: the app asks every few seconds
        return list(self.server_views)

    async def events(self, node=None, model=None):
        self.calls.append(("events", node, model))
        self._need_link()
        if self.history_error:
            raise ActionFailed(self.history_error)
        entries = [e for e in self.journal.entries if (node is None or node in (e.node, e.subject))
                   and (model is None or model in (e.model, e.subject))]
        return attrs.evolve(self.journal, entries=entries)

    async def figures(self, scope=None, subject=None):
        self.calls.append(("figures", scope, subject))
        self._need_link()
        if self.history_error:
            raise ActionFailed(self.history_error)
        return attrs.evolve(self.figured, series=[s for s in self.figured.series if (scope is None or s.scope == scope)
                                                  and (subject is None or s.subject == subject)])

    def _check_logs(self, node_id: str) -> None:
        if not self.connected:
            raise LogsUnavailable("not connected to the hub; reconnecting")
        if node_id in self.logs_unavailable:
            raise LogsUnavailable(self.logs_unavailable[node_id])

    async def _verb(self, verb: str, node_id: str, cordoned: bool) -> CordonAnswer | DrainAnswer:
        self.calls.append((verb, node_id))
        self._need_link()
        if node_id not in self.nodes:
            raise ActionFailed(f"no node {node_id!r}", error="llmgw.error.no_such_node")
        was = self.nodes[node_id].cordoned
        self.emit_node(attrs.evolve(self.nodes[node_id], cordoned=cordoned))
        if was != cordoned:  # the control plane's journal records the change, as llmgw.control.journalfeed does
            kind = JournalKind.NODE_CORDONED if cordoned else JournalKind.NODE_UNCORDONED
            self.emit_journal(JournalEntry(self.journal.newest_seq + 1, time.time(), kind, node_id, node=node_id))
        if verb == "drain":
            stopped = [s.shard for r in self.replica_views for s in r.shards if s.node == node_id]
            return DrainAnswer(node_id, cordoned, stopped)
        return CordonAnswer(node_id, cordoned)

    async def drain(self, node_id):
        return await self._verb("drain", node_id, True)

    async def cordon(self, node_id):
        return await self._verb("cordon", node_id, True)

    async def uncordon(self, node_id):
        return await self._verb("uncordon", node_id, False)


# -- a simulated fleet: the records Fleet.view and Reconciler.views make --

GB = 1_000_000_000

# The shard state a one-shard replica in each state has (a pending one has no shard).
_SHARD_STATE = {
    ReplicaState.READY: ShardState.READY,
    ReplicaState.FETCHING: ShardState.FETCHING,
    ReplicaState.STARTING: ShardState.STARTING,
    ReplicaState.DRAINING: ShardState.DRAINING,
    ReplicaState.FAILED: ShardState.FAILED,
}


def _build(kind, facts: dict[str, Any]):
    # Overrides may be written as the wire has them (cpu={"avx2": False}) or as records.
    return from_wire(kind, to_wire(facts))


def node_view(node_id: str, **overrides: Any) -> NodeView:
    """A ready node with one 80 GB GPU, as a current agent reports it; override any field."""
    view: dict[str, Any] = {
        "id": node_id,
        "state": NodeState.READY,
        "reason": None,
        "cordoned": False,
        "last_seen": 1_700_000_000.0,
        "seen_ago_s": 1.0,
        "state_since": 1_700_000_000.0,
        "registered_at": 1_700_000_000.0,
        "protocol": 1,
        "agent_version": "0.1.0",
        "address": "10.0.0.1",
        "hostname": f"{node_id}.example",
        "os": "Ubuntu 22.04",
        "kernel": "6.5.0",
        "arch": "x86_64",
        "cpu": {"model": "AMD EPYC 7763", "logical_cores": 128, "vector_flags": ["avx2"], "avx2": True},
        "memory_total_bytes": 512 * GB,
        "memory_available_bytes": 400 * GB,
        "nvidia_driver": "550.54",
        "gpus": [
            {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GB,
             "memory_used_bytes": 20 * GB, "utilization_pct": 35},
        ],
        "filesystems": [
            {"mountpoint": "/data", "fstype": "ext4", "shared": False, "total_bytes": 2000 * GB,
             "free_bytes": 1500 * GB, "weights_dirs": ["/data/weights"]},
        ],
        "infiniband": [],
        "labels": {},
        "engines": [SIM],
        "warnings": [],
    }
    view.update(overrides)
    return _build(NodeView, view)


def replica_view(replica_id: str, node_id: str | None = "node01", state: ReplicaState | None = None,
                 **overrides: Any) -> ReplicaView:
    """A one-shard replica on *node_id*, ready unless *state* says otherwise (None: pending, placed nowhere).

    Its shard and endpoint are what the control plane would show for that state:
    rank 0's endpoint only while ready or draining.  Override any field.
    """
    model, _, _ = replica_id.rpartition("/")
    state = state or (ReplicaState.READY if node_id else ReplicaState.PENDING)
    url = f"http://10.0.0.1:{8000 + (zlib.crc32(replica_id.encode()) % 1000)}" if node_id else None
    shard_state = _SHARD_STATE.get(state) if node_id else None
    serving = state in (ReplicaState.READY, ReplicaState.DRAINING)
    view: dict[str, Any] = {
        "model": model,
        "replica": replica_id,
        "state": state,
        "nodes": [node_id] if node_id else [],
        "endpoint": url if serving else None,
        "age_s": 300.0 if node_id else None,
        "stale": False if node_id else None,
        "fingerprint": "f1",
        "reason": "waiting for the reconciler" if state == ReplicaState.PENDING else None,
        "progress": None,
        "shards": (
            [{"shard": f"{replica_id}/0", "node": node_id, "state": shard_state,
              "pid": None if shard_state == ShardState.FETCHING else 4242,
              "endpoint": url if shard_state in (ShardState.READY, ShardState.DRAINING) else None, "reason": None}]
            if shard_state else []
        ),
    }
    view.update(overrides)
    return _build(ReplicaView, view)


SIM = {"name": "sim", "version": "0.1", "path": "/usr/bin/llmgw-sim", "state": EngineState.INSTALLED,
       "origin": "builtin"}


def llama_cpp(version: str, state: EngineState = EngineState.INSTALLED, reason: str | None = None) -> dict[str, Any]:
    """A llama.cpp build the node installed from the catalog, as its agent reports it."""
    path = f"/var/lib/llmgw/engines/llama.cpp/{version}/llama-server"
    return {"name": "llama.cpp", "version": version, "path": path if state == EngineState.INSTALLED else None,
            "state": state, "reason": reason, "origin": "server.yaml"}


def engines_while_upgrading(draw: float) -> list[dict[str, Any]]:
    """A node's engines in a fleet moving from llama.cpp b5000 to b6000: most done, some on the way, a few broken."""
    if draw < 0.6:
        return [llama_cpp("b6000"), SIM]
    if draw < 0.9:
        return [llama_cpp("b5000"), llama_cpp("b6000", EngineState.INSTALLING,
                                              "downloading llama-b6000-bin-ubuntu-x64.zip 12/16 MB"), SIM]
    return [llama_cpp("b6000", EngineState.BROKEN,
                      "needs libgomp.so.1, which this node does not have: apt-get install libgomp1"), SIM]


def simulated_fleet(n_nodes: int, n_replicas: int, seed: int = 1) -> tuple[list[NodeView], list[ReplicaView]]:
    """*n_nodes* nodes and *n_replicas* replicas of 50 models, in varied states."""
    rng = random.Random(seed)
    nodes = []
    for i in range(n_nodes):
        node_id = f"gpu{i:04d}"
        cards = rng.choice([0, 1, 2, 4, 8])
        state = rng.choices(list(NodeState), [95, 4, 1])[0]
        nodes.append(node_view(
            node_id,
            state=state,
            reason=None if state == NodeState.READY else "no heartbeat for 20 s",
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            seen_ago_s=round(rng.uniform(0, 5), 1),
            memory_available_bytes=rng.randrange(10, 500) * GB,
            gpus=[
                {"index": c, "uuid": f"GPU-{i}-{c}", "name": "NVIDIA H100 80GB HBM3",
                 "memory_total_bytes": 80 * GB, "memory_used_bytes": rng.randrange(0, 80) * GB,
                 "utilization_pct": rng.randrange(0, 100)}
                for c in range(cards)
            ],
            cpu={"model": "AMD EPYC 7763", "logical_cores": 128, "vector_flags": [], "avx2": rng.random() > 0.02},
            engines=engines_while_upgrading(rng.random()),
        ))
    replicas = []
    for i in range(n_replicas):
        model = f"model{i % 50:02d}"
        node = nodes[rng.randrange(n_nodes)].id if n_nodes else None
        replicas.append(replica_view(f"{model}/{i // 50}", node))
    return nodes, replicas
