"""An in-process backend for Pilot tests and the benchmark, and a simulated fleet to fill it.

``FakeBackend`` keeps the views it is given and hands out copies, as the hub
would; tests drive it (``emit_node``, ``disconnect``...) and read what the app
asked of it in ``calls``.  It shares the ``Backend`` interface with
``WampBackend``, and the real-server tests exercise the same app code through
the real one.
"""

from __future__ import annotations

import asyncio
import copy
import random
import zlib
from typing import Any, Iterable

from llmgw.tui.backend import ActionFailed, Backend, LogsUnavailable, NotConnected


class FakeBackend(Backend):
    hub = "fake://fleet"

    def __init__(
        self,
        nodes: Iterable[dict[str, Any]] = (),
        replicas: Iterable[dict[str, Any]] = (),
        logs: dict[tuple[str, str | None], list[str]] | None = None,
        connected: bool = True,
    ):
        super().__init__()
        self.nodes: dict[str, dict[str, Any]] = {n["id"]: n for n in nodes}
        self.replica_views: list[dict[str, Any]] = list(replicas)
        #: (node, source) -> lines; a node missing here has no logs to give.
        self.log_lines: dict[tuple[str, str | None], list[str]] = dict(logs or {})
        #: Nodes whose logs fail as an agent too old to send them would.
        self.logs_unavailable: dict[str, str] = {}
        self.connected = connected
        #: Every request the app made, in order: ("snapshot",), ("drain", "node01")...
        self.calls: list[tuple] = []
        #: Set to make snapshot() wait until it is set (a slow hub).
        self.hold_snapshot: asyncio.Event | None = None

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

    def emit_node(self, view: dict[str, Any]) -> None:
        self.nodes[view["id"]] = view
        if self.listener is not None and self.connected:
            self.listener.node_changed(copy.deepcopy(view))

    def set_replicas(self, views: Iterable[dict[str, Any]], shard_id: str = "any/0/0") -> None:
        """Replace the replica views and send the shard event that says they changed."""
        self.replica_views = list(views)
        if self.listener is not None and self.connected:
            self.listener.shard_changed(shard_id, {"change": "status"})

    # -- the Backend interface --

    def _need_link(self) -> None:
        if not self.connected:
            raise NotConnected("not connected to the hub; reconnecting")

    async def snapshot(self):
        self.calls.append(("snapshot",))
        if self.hold_snapshot is not None:
            await self.hold_snapshot.wait()
        self._need_link()
        return copy.deepcopy(sorted(self.nodes.values(), key=lambda n: n["id"])), copy.deepcopy(self.replica_views)

    async def replicas(self):
        self.calls.append(("replicas",))
        self._need_link()
        return copy.deepcopy(self.replica_views)

    async def logs(self, node_id, source, n):
        self.calls.append(("logs", node_id, source, n))
        self._check_logs(node_id)
        lines = self.log_lines.get((node_id, source), [])
        return list(lines[-n:]) if n else []

    async def log_sources(self, node_id):
        self.calls.append(("log_sources", node_id))
        self._check_logs(node_id)
        return sorted({source or "agent" for node, source in self.log_lines if node == node_id})

    def _check_logs(self, node_id: str) -> None:
        if not self.connected:
            raise LogsUnavailable("not connected to the hub; reconnecting")
        if node_id in self.logs_unavailable:
            raise LogsUnavailable(self.logs_unavailable[node_id])

    async def _verb(self, verb: str, node_id: str, cordoned: bool) -> dict[str, Any]:
        self.calls.append((verb, node_id))
        self._need_link()
        if node_id not in self.nodes:
            raise ActionFailed(f"no node {node_id!r}", error="llmgw.error.no_such_node")
        self.emit_node({**self.nodes[node_id], "cordoned": cordoned})
        result: dict[str, Any] = {"node": node_id, "cordoned": cordoned}
        if verb == "drain":
            result["stopped"] = [
                s["shard"] for r in self.replica_views for s in r.get("shards") or [] if s.get("node") == node_id
            ]
        return result

    async def drain(self, node_id):
        return await self._verb("drain", node_id, True)

    async def cordon(self, node_id):
        return await self._verb("cordon", node_id, True)

    async def uncordon(self, node_id):
        return await self._verb("uncordon", node_id, False)


# -- a simulated fleet, shaped like Fleet.view and Reconciler.views --

GB = 1_000_000_000


def node_view(node_id: str, **overrides: Any) -> dict[str, Any]:
    """A ready node with one 80 GB GPU, as a current agent reports it; override any key."""
    view: dict[str, Any] = {
        "id": node_id,
        "state": "ready",
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
        "engines": [{"name": "sim", "version": "0.1", "path": "/usr/bin/llmgw-sim"}],
        "warnings": [],
    }
    view.update(overrides)
    return view


def replica_view(replica_id: str, node_id: str | None = "node01", **overrides: Any) -> dict[str, Any]:
    """A ready one-shard replica on *node_id* (None: pending, placed nowhere); override any key."""
    model, _, _ = replica_id.rpartition("/")
    shard = f"{replica_id}/0"
    view: dict[str, Any] = {
        "model": model,
        "replica": replica_id,
        "state": "ready" if node_id else "pending",
        "nodes": [node_id] if node_id else [],
        "endpoint": f"http://10.0.0.1:{8000 + (zlib.crc32(replica_id.encode()) % 1000)}" if node_id else None,
        "age_s": 300.0 if node_id else None,
        "stale": False if node_id else None,
        "fingerprint": "f1",
        "reason": None if node_id else "waiting for the reconciler",
        "shards": (
            [{"shard": shard, "node": node_id, "state": "ready", "pid": 4242, "endpoint": None, "reason": None}]
            if node_id else []
        ),
    }
    view.update(overrides)
    return view


def simulated_fleet(n_nodes: int, n_replicas: int, seed: int = 1) -> tuple[list[dict], list[dict]]:
    """*n_nodes* nodes and *n_replicas* replicas of 50 models, in varied states."""
    rng = random.Random(seed)
    nodes = []
    for i in range(n_nodes):
        node_id = f"gpu{i:04d}"
        cards = rng.choice([0, 1, 2, 4, 8])
        state = rng.choices(["ready", "unreachable", "lost"], [95, 4, 1])[0]
        nodes.append(node_view(
            node_id,
            state=state,
            reason=None if state == "ready" else "no heartbeat for 20 s",
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
        ))
    replicas = []
    for i in range(n_replicas):
        model = f"model{i % 50:02d}"
        node = nodes[rng.randrange(n_nodes)]["id"] if n_nodes else None
        replicas.append(replica_view(f"{model}/{i // 50}", node))
    return nodes, replicas
