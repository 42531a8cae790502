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

from typing import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw.control.claims import Why
from llmgw.control.fleet import Fleet
from llmgw.control.weights import held_by_fabric
from llmgw.records import Progress
from llmgw.states import SHARD_ALIVE, EngineState, NodeState, ShardState
from llmgw.views import EventKind, ProgressEvent, ReplicaView

NODE_STATES = tuple(NodeState)
# Every state a shard the fleet keeps can be in (a stopped one is forgotten).
SHARD_STATES = tuple(s for s in ShardState if s in SHARD_ALIVE or s == ShardState.FAILED)
ENGINE_STATES = tuple(EngineState)
# A progress report's kind: an engine package a node installs with pip reports as
# ``pip:SPEC``; weights and llama.cpp's release assets are downloads.
INSTALL, DOWNLOAD = "install", "download"


def progress_kind(progress: Progress) -> str:
    return INSTALL if progress.source.startswith("pip:") else DOWNLOAD


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

    def _downloads(self, f: _Families) -> None:
        """Downloads and installs in progress: the fleet keeps each one's latest report.

        A report's figures passed the wire's range checks (0 to an EiB); one
        that has done more than its own total contradicts itself, and only
        its bytes done are counted, not a size it has already overrun.
        """
        active: dict[tuple[str, str], list[Progress]] = {}
        for (node_id, _), progress in sorted(self._fleet.progress.items()):
            active.setdefault((node_id, progress_kind(progress)), []).append(progress)
        for (node_id, kind), reports in active.items():
            f.downloads_active.add_metric([node_id, kind], len(reports))
            f.download_bytes.add_metric([node_id, kind], sum(p.bytes_done for p in reports))
            sized = [p.bytes_total for p in reports if p.bytes_total is not None and p.bytes_done <= p.bytes_total]
            if sized:
                f.download_size.add_metric([node_id, kind], sum(sized))

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
            if node.certificate_not_after is not None:
                f.cert_expiry.add_metric([node_id], node.certificate_not_after)
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
        self._downloads(f)

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
            f"{', '.join(why.value for why in Why)}.", labels=["node", "reason"])
        self.progress_refused = CounterMetricFamily(
            "llmgw_node_progress_refused",
            "Download progress reports refused because the node already showed fleet.downloads_per_node downloads.",
            labels=node)
        self.replicas = GaugeMetricFamily("llmgw_replicas", "Replicas by model and state, as the reconciler sees them.",
                                          labels=["model", "state"])
        self.cert_expiry = GaugeMetricFamily(
            "llmgw_node_certificate_expiry_timestamp_seconds",
            "When the certificate a node's session proved itself with expires (Unix time).", labels=node)
        kind = ["node", "kind"]
        self.downloads_active = GaugeMetricFamily(
            "llmgw_downloads_active", "Downloads (weights, engine assets) and pip installs a node shows in progress.",
            labels=kind)
        self.download_bytes = GaugeMetricFamily(
            "llmgw_download_bytes", "Bytes the downloads and installs in progress on a node have fetched so far.",
            labels=kind)
        self.download_size = GaugeMetricFamily(
            "llmgw_download_size_bytes", "Total size of the downloads in progress on a node that know their size.",
            labels=kind)

    def all(self, with_replicas: bool) -> list[Metric]:
        families = [self.nodes, self.node_state, self.node_cordoned, self.node_seen_age, self.node_info,
                    self.node_cpus, self.mem_total, self.mem_available, self.node_gpus, self.gpu_mem_total,
                    self.gpu_mem_used, self.gpu_util, self.fs_total, self.fs_free, self.engine_info, self.engine_state,
                    self.shards, self.claims_refused, self.progress_refused, self.cert_expiry, self.downloads_active,
                    self.download_bytes, self.download_size]
        return families + [self.replicas] if with_replicas else families


class WeightsCollector(Collector):
    """Per catalog model, how many nodes of each fabric hold its weights (``ctl status``'s column).

    ``sources`` gives each model's weights source and its ``files:``
    patterns now (the catalog, so a reload is seen).  A model no node holds reads 0 on fabric ``-``: the
    nodes that listed their weights were counted and none has it.  A model
    without a source (an engine that fetches for itself) is left out.
    """

    def __init__(self, fleet: Fleet, sources: Callable[[], Mapping[str, tuple[str | None, Sequence[str]]]]):
        self._fleet = fleet
        self._sources = sources

    def describe(self) -> Iterator[Metric]:
        return iter([self._family()])

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily("llmgw_weights_held_nodes",
                                 "Nodes holding a model's weights, by fabric (-: nodes on no fabric).",
                                 labels=["model", "fabric"])

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for model, (source, files) in sorted(self._sources().items()):
            if source is None:
                continue
            counts = held_by_fabric(self._fleet, source, files) or {"-": 0}
            for fabric, n in sorted(counts.items()):
                family.add_metric([model, fabric], n)
        return iter([family] if family.samples else [])


class DownloadFailures(Collector):
    """Downloads and installs that nodes reported ending in an error, counted from the fleet's progress events.

    ``observe`` is one of the control session's ``event_listeners``.  A
    node the fleet forgot takes its count with it, so the family is never
    larger than the fleet.
    """

    def __init__(self, fleet: Fleet):
        self._fleet = fleet
        self._failures: dict[tuple[str, str], int] = {}

    def observe(self, kind: EventKind, ident: str, event) -> None:
        if kind is not EventKind.PROGRESS or not isinstance(event, ProgressEvent):
            return
        progress = event.progress
        if progress.final and progress.error is not None and event.node_id in self._fleet.nodes:
            key = (event.node_id, progress_kind(progress))
            self._failures[key] = self._failures.get(key, 0) + 1

    def describe(self) -> Iterator[Metric]:
        return iter([self._family()])

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily("llmgw_download_failures", "Downloads and installs a node reported ending in an error.",
                                   labels=["node", "kind"])

    def collect(self) -> Iterator[Metric]:
        for key in [k for k in self._failures if k[0] not in self._fleet.nodes]:
            del self._failures[key]
        family = self._family()
        for (node_id, kind), n in sorted(self._failures.items()):
            family.add_metric([node_id, kind], n)
        return iter([family] if family.samples else [])
