"""The two entry points: whole inventories and heartbeats, and that both cross the link intact."""

from __future__ import annotations

import json
import shutil

import pytest

import llmgw
from llmgw.agent.discovery import discover, fakenvml, sample
from llmgw.records import Heartbeat, Inventory
from llmgw.wire import from_wire, to_wire

from .recordings import HARDWARE, NVML, SYSFS


@pytest.fixture
def proc_i7_870(tmp_path):
    shutil.copy(HARDWARE / "cpuinfo-core-i7-870-no-avx.txt", tmp_path / "cpuinfo")
    return str(tmp_path)


def _h100_node(tmp_path, proc_root, node_id=None):
    weights = tmp_path / "weights"
    weights.mkdir(exist_ok=True)
    return discover(
        node_id=node_id,
        hub_host="127.0.0.1",
        hub_port=7443,
        weights_dirs=[str(weights), str(tmp_path / "not-mounted")],
        labels={"rack": "r12"},
        fabrics={"mlx5_5": "ib-a"},
        nvml=fakenvml.load(str(NVML / "h100x8.json")),
        sysfs_root=str(SYSFS / "connectx7-ib-400g"),
        proc_root=proc_root,
    )


def test_a_whole_inventory(tmp_path, proc_i7_870):
    inventory = _h100_node(tmp_path, proc_i7_870)

    assert inventory.node_id == inventory.hostname
    assert inventory.address == "127.0.0.1"
    assert inventory.protocol == llmgw.PROTOCOL_VERSION
    assert inventory.agent_version == llmgw.__version__
    assert inventory.nvidia_driver == "565.57.01"
    assert len(inventory.gpus) == 8
    assert inventory.cpu.avx2 is False
    assert inventory.warnings and "has no AVX2" in inventory.warnings[0]
    assert [fs.weights_dirs for fs in inventory.filesystems] == [[str(tmp_path / "weights")]]
    assert [(a.name, a.fabric) for a in inventory.infiniband] == [("mlx5_5", "ib-a")]
    assert inventory.labels == {"rack": "r12"}
    assert inventory.memory_total_bytes > 0


def test_a_written_node_id_wins(tmp_path, proc_i7_870):
    assert _h100_node(tmp_path, proc_i7_870, node_id="gpu-17").node_id == "gpu-17"


def test_a_cpu_node_on_this_machine(tmp_path):
    # The real pynvml on a machine without the driver: no cards, not an error.
    inventory = discover(node_id="cpu-1", hub_host="127.0.0.1", hub_port=7443,
                         weights_dirs=[str(tmp_path)], labels={}, fabrics={})
    if inventory.nvidia_driver is None:
        assert inventory.gpus == []
    assert inventory.infiniband is not None
    assert inventory.kernel and inventory.arch


def _through_the_link(record):
    return from_wire(type(record), json.loads(json.dumps(to_wire(record))))


def test_inventory_crosses_the_link_unchanged(tmp_path, proc_i7_870):
    inventory = _h100_node(tmp_path, proc_i7_870)
    assert _through_the_link(inventory) == inventory
    assert isinstance(_through_the_link(inventory), Inventory)


def test_mig_and_mlx4_inventory_crosses_the_link_unchanged(tmp_path):
    # Unknown figures (MIG utilisation, mlx4 rates) must stay unknown on the far side.
    inventory = discover(node_id=None, hub_host="127.0.0.1", hub_port=7443,
                         weights_dirs=[str(tmp_path)], labels={}, fabrics={},
                         nvml=fakenvml.load(str(NVML / "a100-mig.json")),
                         sysfs_root=str(SYSFS / "connectx3-mlx4-2x"))
    assert inventory.gpus[0].utilization_pct is None
    assert inventory.infiniband[0].ports[0].rate_gbps is None
    assert _through_the_link(inventory) == inventory


def test_heartbeat_crosses_the_link_unchanged(tmp_path):
    heartbeat = sample(weights_dirs=[str(tmp_path)], nvml=fakenvml.load(str(NVML / "rtx4090.json")))
    assert isinstance(heartbeat, Heartbeat)
    assert heartbeat.gpus[0].name == "NVIDIA GeForce RTX 4090"
    assert len(heartbeat.filesystems) == 1
    assert _through_the_link(heartbeat) == heartbeat


def test_heartbeat_of_a_node_without_cards_or_disks(tmp_path):
    heartbeat = sample(weights_dirs=[str(tmp_path / "not-mounted")],
                       nvml=fakenvml.FakeNVML(init_error="LibraryNotFound"))
    assert heartbeat.gpus == []
    assert heartbeat.filesystems == []
    assert _through_the_link(heartbeat) == heartbeat
