"""What the cluster is made of, as Prometheus figures computed at scrape time.

The control plane already holds every number: hardware arrives at
registration and live figures on each heartbeat.  So rather than gauges kept
current by a ticker — a copy that can drift, and work done between scrapes
nobody asked for — this collector reads the fleet when Prometheus asks.  One
scrape target for the whole fleet; nothing runs on the nodes for it.

Absent is not zero.  A figure a node did not report (an older agent, a probe
that could not run, a driver too old to know utilisation) is not emitted, so
a graph shows a gap and an alert on ``absent()`` can fire, instead of a flat
zero reading as an idle, empty machine.  Counts the control plane makes
itself — nodes by state, shards by state — are always known, and their
zeros are real: ``llmgw_nodes{state="lost"} 0`` is emitted, so an alert on it
does not depend on a node having been lost once.

Label values that were not reported (a GPU's uuid, a node's OS) are the
empty string, which Prometheus treats as the label being absent.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.control.fleet import Fleet
from llmgw.states import SHARD_ALIVE, EngineState, NodeState, ShardState
from llmgw.views import ReplicaView

NODE_STATES = tuple(NodeState)
# Every state a shard the fleet keeps can be in (a stopped one is forgotten).
SHARD_STATES = tuple(s for s in ShardState if s in SHARD_ALIVE or s == ShardState.FAILED)
ENGINE_STATES = tuple(EngineState)


def _label(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class FleetCollector(Collector):
    """Cluster figures derived from ``fleet`` on every collect.

    ``replicas``, when given, is the reconciler's ``views`` (``ReplicaView``
    records, of which it reads ``model`` and ``state``): replicas have states the fleet cannot see —
    ``pending`` for one nothing could place — so they come from there.
    Without it, that family is not emitted.
    """

    def __init__(self, fleet: Fleet, clock, replicas: Callable[[], Iterable[ReplicaView]] | None = None):
        self._fleet = fleet
        self._clock = clock
        self._replicas = replicas

    def describe(self) -> Iterator[Metric]:
        # Names only, so registering checks them for clashes without reading the fleet.
        return iter(_Families().all(self._replicas is not None))

    def collect(self) -> Iterator[Metric]:
        now = self._clock.seconds()
        f = _Families()
        counts = dict.fromkeys(NODE_STATES, 0)
        for node_id in sorted(self._fleet.nodes):
            node = self._fleet.nodes[node_id]
            inv = node.inventory
            counts[node.state] = counts.get(node.state, 0) + 1
            f.node_state.add_metric([node_id, node.state], 1)
            f.node_cordoned.add_metric([node_id], 1 if node.cordoned else 0)
            f.node_seen_age.add_metric([node_id], max(0.0, now - node.last_seen))
            cpu = inv.cpu
            f.node_info.add_metric([node_id], {
                "hostname": _label(inv.hostname), "os": _label(inv.os), "kernel": _label(inv.kernel),
                "arch": _label(inv.arch), "cpu_model": _label(cpu.model if cpu else None),
                "avx2": _label(cpu.avx2 if cpu else None), "agent_version": _label(inv.agent_version),
                "nvidia_driver": _label(inv.nvidia_driver),
            })
            if cpu is not None and cpu.logical_cores is not None:
                f.node_cpus.add_metric([node_id], cpu.logical_cores)
            if inv.memory_total_bytes is not None:
                f.mem_total.add_metric([node_id], inv.memory_total_bytes)
            if inv.memory_available_bytes is not None:
                f.mem_available.add_metric([node_id], inv.memory_available_bytes)
            if inv.gpus is not None:
                f.node_gpus.add_metric([node_id], len(inv.gpus))
                for gpu in inv.gpus:
                    labels = [node_id, str(gpu.index), _label(gpu.uuid), _label(gpu.name)]
                    if gpu.memory_total_bytes is not None:
                        f.gpu_mem_total.add_metric(labels, gpu.memory_total_bytes)
                    if gpu.memory_used_bytes is not None:
                        f.gpu_mem_used.add_metric(labels, gpu.memory_used_bytes)
                    if gpu.utilization_pct is not None:
                        f.gpu_util.add_metric(labels, gpu.utilization_pct / 100.0)
            for fs in inv.filesystems or ():
                labels = [node_id, fs.mountpoint, _label(fs.fstype), _label(fs.shared)]
                if fs.total_bytes is not None:
                    f.fs_total.add_metric(labels, fs.total_bytes)
                if fs.free_bytes is not None:
                    f.fs_free.add_metric(labels, fs.free_bytes)
            for engine in inv.engines or ():
                # An agent older than install states reported only what it had seen run.
                current = engine.state or EngineState.INSTALLED
                if current == EngineState.INSTALLED:
                    f.engine_info.add_metric([node_id, engine.name], {"version": _label(engine.version)})
                # Every state of every entry, so a graph of broken builds reads 0, not a gap, while they are healthy.
                for state in ENGINE_STATES:
                    f.engine_state.add_metric([node_id, engine.name, _label(engine.version), state],
                                              1 if state == current else 0)
        for state, n in counts.items():
            f.nodes.add_metric([state], n)

        shards: dict[tuple[str, str], int] = {}
        for shard in self._fleet.shards.values():
            key = (shard.status.spec.model, shard.status.state)
            shards[key] = shards.get(key, 0) + 1
        models = sorted({model for model, _ in shards})
        for model in models:
            # Every known state per model that has any shard, so a graph of
            # one model's failed shards reads 0, not a gap, while it is healthy.
            for state in sorted(set(SHARD_STATES) | {s for m, s in shards if m == model}):
                f.shards.add_metric([model, state], shards.get((model, state), 0))

        for (node_id, why), n in sorted(self._fleet.claims.refused.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
            f.claims_refused.add_metric([node_id, why.value], n)
        for node_id, n in sorted(self._fleet.progress_refused.items()):
            f.progress_refused.add_metric([node_id], n)

        if self._replicas is not None:
            replicas: dict[tuple[str, str], int] = {}
            for view in self._replicas():
                key = (view.model, view.state)
                replicas[key] = replicas.get(key, 0) + 1
            for (model, state), n in sorted(replicas.items()):
                f.replicas.add_metric([model, state], n)
        # A family with nothing in it is left out whole: absent, not empty.
        return iter([m for m in f.all(self._replicas is not None) if m.samples])


class _Families:
    """One scrape's families, empty until ``collect`` fills them."""

    def __init__(self):
        node, gpu, fs = ["node"], ["node", "gpu", "uuid", "name"], ["node", "mountpoint", "fstype", "shared"]
        self.nodes = GaugeMetricFamily("llmgw_nodes", "Nodes the control plane knows, by state (ready, unreachable, lost).",
                                       labels=["state"])
        self.node_state = GaugeMetricFamily("llmgw_node_state", "1 for the state each node is in.",
                                            labels=["node", "state"])
        self.node_cordoned = GaugeMetricFamily("llmgw_node_cordoned", "1 while a node is cordoned (no new replicas), else 0.",
                                               labels=node)
        self.node_seen_age = GaugeMetricFamily("llmgw_node_last_seen_age_seconds",
                                               "Seconds since the node's last registration or heartbeat.", labels=node)
        self.node_info = InfoMetricFamily("llmgw_node", "What a node says it is; unreported values are empty.",
                                          labels=node)
        self.node_cpus = GaugeMetricFamily("llmgw_node_cpu_logical_cores", "Logical CPU cores a node reported.", labels=node)
        self.mem_total = GaugeMetricFamily("llmgw_node_memory_total_bytes", "A node's memory, as it reported it.",
                                           labels=node)
        self.mem_available = GaugeMetricFamily("llmgw_node_memory_available_bytes",
                                               "Memory available on a node at its last heartbeat.", labels=node)
        self.node_gpus = GaugeMetricFamily("llmgw_node_gpus",
                                           "GPUs a node found (0: it looked and has none; absent: it did not look).",
                                           labels=node)
        self.gpu_mem_total = GaugeMetricFamily("llmgw_gpu_memory_total_bytes", "A GPU's memory.", labels=gpu)
        self.gpu_mem_used = GaugeMetricFamily("llmgw_gpu_memory_used_bytes", "A GPU's memory in use at the last heartbeat.",
                                              labels=gpu)
        self.gpu_util = GaugeMetricFamily("llmgw_gpu_utilization_ratio",
                                          "Fraction of time a GPU was busy, 0 to 1, as its driver reported it.", labels=gpu)
        self.fs_total = GaugeMetricFamily("llmgw_filesystem_size_bytes",
                                          "Size of a filesystem holding weights directories, as a node sees it.", labels=fs)
        self.fs_free = GaugeMetricFamily("llmgw_filesystem_free_bytes",
                                         "Free space on a filesystem holding weights directories, as a node sees it.",
                                         labels=fs)
        self.engine_info = InfoMetricFamily("llmgw_node_engine", "An engine a node has and has seen run.",
                                            labels=["node", "engine"])
        self.engine_state = GaugeMetricFamily(
            "llmgw_node_engine_state",
            "1 for the state each engine build a node reports is in (installing, installed, broken, absent), "
            "0 for the others.",
            labels=["node", "engine", "version", "state"])
        self.shards = GaugeMetricFamily("llmgw_shards", "Shards the nodes report, by model and state.",
                                        labels=["model", "state"])
        self.claims_refused = CounterMetricFamily(
            "llmgw_node_claims_refused",
            "Shard reports a node made that the control plane refused (see docs/security.rst), by reason: "
            "not placed, spec, slot held, not in catalog, endpoint.", labels=["node", "reason"])
        self.progress_refused = CounterMetricFamily(
            "llmgw_node_progress_refused",
            "Download progress reports refused because the node already showed fleet.downloads_per_node downloads.",
            labels=node)
        self.replicas = GaugeMetricFamily("llmgw_replicas", "Replicas by model and state, as the reconciler sees them.",
                                          labels=["model", "state"])

    def all(self, with_replicas: bool) -> list[Metric]:
        families = [self.nodes, self.node_state, self.node_cordoned, self.node_seen_age, self.node_info,
                    self.node_cpus, self.mem_total, self.mem_available, self.node_gpus, self.gpu_mem_total,
                    self.gpu_mem_used, self.gpu_util, self.fs_total, self.fs_free, self.engine_info, self.engine_state,
                    self.shards, self.claims_refused, self.progress_refused]
        return families + [self.replicas] if with_replicas else families
