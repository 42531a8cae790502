"""Whatever a node may report, /metrics still answers: the largest figures and oddest names the wire takes scrape.

A heartbeat with a memory of 10**400 once made every scrape fail; the wire
now refuses it (tests/test_wire_bounds.py), and this checks the other side:
nothing the wire takes can break the exposition.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.control.collector import FleetCollector
from llmgw.records import EIB, IDENT, MANY, NAME, PATH, Heartbeat, Inventory, ShardStatus
from llmgw.wire import from_wire
from tests.support.reportedfleet import clock, fleet  # noqa: F401 - the fixtures, by name

# Quotes, backslashes, braces and '=' in a label value; spaces inside a path.  (No newline: no
# field that becomes a label may hold a control character, nor a space at either end: wiretext.)
ODD = 'gpu "0" \\ {a="b"} é ✓ '
ODD_PATH = '/srv/"w"\\ {x="y"} é/'


def longest(seed: str, n: int) -> str:
    text = (seed * (n // len(seed) + 1))[:n]
    return text[:-1] + "_" if text.endswith(" ") else text


def node_at_its_bounds(node_id: str) -> dict:
    name = longest(ODD, NAME)
    return {
        "node_id": node_id, "hostname": name, "os": name, "kernel": name, "arch": name, "agent_version": name,
        "nvidia_driver": name,
        "cpu": {"model": name, "logical_cores": 65536, "avx2": True},
        "memory_total_bytes": EIB, "memory_available_bytes": EIB,
        "gpus": [{"index": i, "uuid": longest(f"GPU-{i}-", NAME), "name": name, "memory_total_bytes": EIB,
                  "memory_used_bytes": EIB, "utilization_pct": 100} for i in range(MANY)],
        "filesystems": [{"mountpoint": longest(f"{ODD_PATH}{i}", PATH), "fstype": name, "shared": bool(i % 2),
                         "total_bytes": EIB, "free_bytes": EIB} for i in range(MANY)],
        "engines": [{"name": name, "version": longest(f"v{i}", NAME), "state": "installed"} for i in range(MANY)],
        "labels": {longest(f"k{i}", NAME): name for i in range(MANY)},
    }


@pytest.fixture
def scraped(fleet, clock):
    for n in range(2):
        node_id = longest(f"node{n}-", NAME)
        fleet.register(node_id, 10 + n, from_wire(Inventory, node_at_its_bounds(node_id)))
        fleet.heartbeat(node_id, 10 + n, from_wire(Heartbeat, {"memory_available_bytes": 0}))
        model = longest(f"model{n}", IDENT - len("/0/0"))
        spec = {"shard_id": f"{model}/0/0", "replica_id": f"{model}/0", "model": model, "engine": "vllm"}
        status = from_wire(ShardStatus, {"spec": spec, "state": "ready", "since": 2.0**40})
        fleet.place(node_id, status.spec)  # a node reports only what the control plane gave it
        fleet.shard_status(node_id, status)
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet, clock))
    return generate_latest(registry).decode("utf-8")


def test_the_largest_figures_a_node_may_report_scrape_and_read_back(scraped):
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    node0 = longest("node0-", NAME)
    memory = [s for s in families["llmgw_node_memory_total_bytes"].samples if s.labels["node"] == node0]
    assert [s.value for s in memory] == [float(EIB)]
    gpus = [s for s in families["llmgw_gpu_utilization_ratio"].samples if s.labels["node"] == node0]
    assert len(gpus) == MANY and {s.value for s in gpus} == {1.0}
    assert {s.labels["name"] for s in gpus} == {longest(ODD, NAME)}
    mounts = {s.labels["mountpoint"] for s in families["llmgw_filesystem_size_bytes"].samples if s.labels["node"] == node0}
    assert mounts == {longest(f"{ODD_PATH}{i}", PATH) for i in range(MANY)}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_prometheus_own_checker_reads_it(scraped):
    done = subprocess.run(["promtool", "check", "metrics"], input=scraped, capture_output=True, text=True, timeout=60)
    # promtool exits 3 for lint advice alone, 1 for text it cannot parse.
    assert done.returncode in (0, 3), done.stdout + done.stderr
    assert "error while linting" not in done.stdout + done.stderr
