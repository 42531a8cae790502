"""Cluster figures read from a real fleet at scrape time: reported figures appear, unreported ones do not."""

from __future__ import annotations

import attrs
import pytest
from prometheus_client import CollectorRegistry

from llmgw.control.collector import FleetCollector
from llmgw.records import Heartbeat
from llmgw.states import EngineState, ReplicaState
from llmgw.views import ReplicaView
from tests.support.reportedfleet import GIB, clock, fleet, shard  # noqa: F401 - the fixtures, by name


@pytest.fixture
def registry(fleet, clock):
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet, clock))
    return registry


def value(registry, name, /, **labels):
    return registry.get_sample_value(name, labels)


def series(registry, name):
    return [s for f in registry.collect() for s in f.samples if s.name == name]


def test_nodes_by_state_with_real_zeros(registry):
    assert value(registry, "llmgw_nodes", state="ready") == 1
    assert value(registry, "llmgw_nodes", state="unreachable") == 1
    # Nothing is lost, and that is known: the zero is emitted so an alert on it works from day one.
    assert value(registry, "llmgw_nodes", state="lost") == 0
    assert value(registry, "llmgw_node_state", node="gpu01", state="ready") == 1
    assert value(registry, "llmgw_node_state", node="cpu07", state="unreachable") == 1


def test_memory_is_emitted_for_the_node_that_reported_it_and_absent_for_the_one_that_did_not(registry):
    assert value(registry, "llmgw_node_memory_total_bytes", node="gpu01") == 512 * GIB
    # The heartbeat's figure, not the registration's.
    assert value(registry, "llmgw_node_memory_available_bytes", node="gpu01") == 390 * GIB
    assert value(registry, "llmgw_node_memory_total_bytes", node="cpu07") is None
    assert value(registry, "llmgw_node_memory_available_bytes", node="cpu07") is None


def test_gpus_carry_node_index_uuid_and_name_and_unknown_utilisation_is_absent(registry):
    card0 = {"node": "gpu01", "gpu": "0", "uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-80GB"}
    card1 = dict(card0, gpu="1", uuid="GPU-bbbb")
    assert value(registry, "llmgw_gpu_memory_total_bytes", **card0) == 80 * GIB
    assert value(registry, "llmgw_gpu_memory_used_bytes", **card0) == 60 * GIB
    assert value(registry, "llmgw_gpu_utilization_ratio", **card0) == pytest.approx(0.87)
    assert value(registry, "llmgw_gpu_memory_used_bytes", **card1) == 1 * GIB
    assert value(registry, "llmgw_gpu_utilization_ratio", **card1) is None
    assert value(registry, "llmgw_node_gpus", node="gpu01") == 2
    # cpu07 never probed for GPUs: not "0 GPUs", just not known.
    assert value(registry, "llmgw_node_gpus", node="cpu07") is None
    assert {s.labels["node"] for s in series(registry, "llmgw_gpu_memory_total_bytes")} == {"gpu01"}


def test_a_node_that_looked_and_found_no_gpus_says_zero(fleet, clock, registry):
    fleet.heartbeat("gpu01", 1, Heartbeat(gpus=[]))
    assert value(registry, "llmgw_node_gpus", node="gpu01") == 0
    assert series(registry, "llmgw_gpu_memory_total_bytes") == []


def test_filesystems_say_whether_they_are_shared_and_only_what_was_measured(registry):
    lustre = {"node": "gpu01", "mountpoint": "/srv/models", "fstype": "lustre", "shared": "true"}
    scratch = {"node": "gpu01", "mountpoint": "/scratch", "fstype": "ext4", "shared": "false"}
    assert value(registry, "llmgw_filesystem_size_bytes", **lustre) == 100 * 1024 * GIB
    assert value(registry, "llmgw_filesystem_free_bytes", **lustre) == 40 * 1024 * GIB
    assert value(registry, "llmgw_filesystem_size_bytes", **scratch) == 3500 * GIB
    assert value(registry, "llmgw_filesystem_free_bytes", **scratch) is None


def test_node_info_cordon_age_and_engines(fleet, clock, registry):
    info = {"node": "gpu01", "hostname": "gpu01.lab", "os": "Debian GNU/Linux 12", "kernel": "6.1.0-18-amd64",
            "arch": "x86_64", "cpu_model": "AMD EPYC 7763 64-Core Processor", "avx2": "true",
            "agent_version": "0.1.0", "nvidia_driver": "550.54.15"}
    assert value(registry, "llmgw_node_info", **info) == 1
    quiet = [s.labels for s in series(registry, "llmgw_node_info") if s.labels["node"] == "cpu07"]
    assert quiet == [{"node": "cpu07", "hostname": "", "os": "", "kernel": "", "arch": "aarch64", "cpu_model": "",
                      "avx2": "", "agent_version": "", "nvidia_driver": ""}]
    assert value(registry, "llmgw_node_cpu_logical_cores", node="gpu01") == 128
    assert value(registry, "llmgw_node_cpu_logical_cores", node="cpu07") is None
    assert value(registry, "llmgw_node_cordoned", node="gpu01") == 0
    fleet.set_cordoned("gpu01", True)
    assert value(registry, "llmgw_node_cordoned", node="gpu01") == 1
    # Computed when scraped: time passing shows without anything running in between.
    assert value(registry, "llmgw_node_last_seen_age_seconds", node="cpu07") == 20
    clock.advance(7)
    assert value(registry, "llmgw_node_last_seen_age_seconds", node="cpu07") == 27
    assert value(registry, "llmgw_node_last_seen_age_seconds", node="gpu01") == 7
    assert value(registry, "llmgw_node_engine_info", node="gpu01", engine="vllm", version="0.6.3") == 1
    assert value(registry, "llmgw_node_engine_info", node="gpu01", engine="sim", version="") == 1
    assert [s for s in series(registry, "llmgw_node_engine_info") if s.labels["node"] == "cpu07"] == []


def test_each_engine_build_has_a_state_series_and_a_node_that_did_not_report_engines_has_none(fleet, registry):
    def states(node, engine, version=""):
        return {s.labels["state"]: s.value for s in series(registry, "llmgw_node_engine_state")
                if (s.labels["node"], s.labels["engine"], s.labels["version"]) == (node, engine, version)}

    everything = {"installing": 0, "installed": 0, "broken": 0, "absent": 0}
    assert states("gpu01", "llama.cpp", "b6000") == {**everything, "broken": 1}
    # An agent older than install states reported what it had seen run: installed.
    assert states("gpu01", "vllm", "0.6.3") == {**everything, "installed": 1}
    assert states("gpu01", "sim") == {**everything, "installed": 1}
    # A broken build is not one the node has: no info series for it.
    assert value(registry, "llmgw_node_engine_info", node="gpu01", engine="llama.cpp", version="b6000") is None
    # cpu07 never said which engines it has: absent, not zeros.
    assert [s for s in series(registry, "llmgw_node_engine_state") if s.labels["node"] == "cpu07"] == []
    # The install is mended: the same series move, none appear or vanish.
    fixed = [e if e.name != "llama.cpp" else attrs.evolve(e, state=EngineState.INSTALLED, reason=None)
             for e in fleet.nodes["gpu01"].inventory.engines]
    fleet.heartbeat("gpu01", 1, Heartbeat(engines=fixed))
    assert states("gpu01", "llama.cpp", "b6000") == {**everything, "installed": 1}
    assert value(registry, "llmgw_node_engine_info", node="gpu01", engine="llama.cpp", version="b6000") == 1


def test_shards_by_model_and_state(fleet, registry):
    assert value(registry, "llmgw_shards", model="qwen", state="ready") == 1
    assert value(registry, "llmgw_shards", model="qwen", state="starting") == 1
    assert value(registry, "llmgw_shards", model="qwen", state="failed") == 0
    fleet.shard_status("gpu01", shard("qwen", 1, "failed"))
    assert value(registry, "llmgw_shards", model="qwen", state="failed") == 1
    assert value(registry, "llmgw_shards", model="qwen", state="starting") == 0


def test_a_shard_fetching_its_weights_is_counted(fleet, registry):
    assert value(registry, "llmgw_shards", model="qwen", state="fetching") == 0
    fleet.shard_status("gpu01", shard("qwen", 2, "fetching"))
    assert value(registry, "llmgw_shards", model="qwen", state="fetching") == 1


def test_replicas_come_from_the_reconciler_when_there_is_one(fleet, clock):
    views = [ReplicaView("qwen", "qwen/0", ReplicaState.READY), ReplicaView("qwen", "qwen/1", ReplicaState.PENDING),
             ReplicaView("llama", "llama/0", ReplicaState.PENDING)]
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet, clock, replicas=lambda: views))
    assert value(registry, "llmgw_replicas", model="qwen", state="ready") == 1
    assert value(registry, "llmgw_replicas", model="qwen", state="pending") == 1
    assert value(registry, "llmgw_replicas", model="llama", state="pending") == 1


def test_without_a_reconciler_there_is_no_replicas_family(registry):
    assert "llmgw_replicas" not in {f.name for f in registry.collect()}


def test_an_empty_fleet_still_counts_its_nodes(clock):
    from llmgw.control.fleet import Fleet
    registry = CollectorRegistry()
    registry.register(FleetCollector(Fleet(clock, lambda *a: None), clock))
    assert {f.name for f in registry.collect()} == {"llmgw_nodes"}
    assert value(registry, "llmgw_nodes", state="ready") == 0
