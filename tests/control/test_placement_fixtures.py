"""The node fixtures are what discovery makes of the recordings they name, so an
edit to one that drifts from the machine it claims to be fails here."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from llmgw.agent.discovery import cpu, fakenvml, gpus, infiniband
from llmgw.wire import to_wire

from .machines import FILES, HARDWARE, NODES, NVML, SYSFS, inventory, payload

MIB = 1 << 20
H100 = ("h100x8-ib-a-1", "h100x8-ib-a-2", "h100x8-ib-b-1")


def nvidia_smi_q(path: Path) -> tuple[str, list[dict]]:
    """(driver, cards) read straight from `nvidia-smi -q` text, apart from discovery
    and the fake: each card's name, UUID and FB memory total and free, in MiB."""
    text = path.read_text()
    driver = re.search(r"^Driver Version\s*: (\S+)$", text, re.M).group(1)
    cards = []
    for body in re.split(r"^GPU [0-9A-Fa-f:.]+$", text, flags=re.M)[1:]:
        total, free = re.search(
            r"^    FB Memory Usage\n        Total\s*: (\d+) MiB\n(?:        .*\n)*?        Free\s*: (\d+) MiB",
            body, re.M,
        ).groups()
        cards.append({
            "name": re.search(r"^    Product Name\s*: (.+)$", body, re.M).group(1),
            "uuid": re.search(r"^    GPU UUID\s*: (.+)$", body, re.M).group(1),
            "total_mib": int(total),
            "free_mib": int(free),
        })
    return driver, cards


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_fixture_is_an_inventory_the_link_accepts(name):
    inv = inventory(name)
    assert inv.node_id == FILES[name]
    assert payload(name)["source"], "every fixture names the recordings it came from"


def test_the_8_gb_vm_has_the_memory_its_meminfo_says():
    fields = dict(
        line.split(":", 1) for line in (NODES / "meminfo-rhel7.1-8GB.txt").read_text().splitlines()
    )
    kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731 -- /proc/meminfo's "kB" is KiB
    inv = inventory("vm-8gb")
    assert inv.memory_total_bytes == kib("MemTotal") == 8_202_149_888
    assert inv.memory_available_bytes == kib("MemAvailable")
    assert inv.gpus == [] and inv.infiniband == []


@pytest.mark.parametrize(
    "name, recording",
    [
        ("vm-8gb", "cpuinfo-qemu-virtual-cpu-2.5-no-avx.txt"),
        ("cpu-box", "cpuinfo-ryzen7-2700x-kvm-guest-avx2.txt"),
    ],
)
def test_cpus_are_as_discovery_reads_the_recording(name, recording):
    parsed, warnings = cpu.parse((HARDWARE / recording).read_text())
    inv = inventory(name)
    # One processor block of a larger machine was recorded: the count is not known.
    assert inv.cpu == attrs.evolve(parsed, logical_cores=None)
    assert inv.warnings == warnings


@pytest.mark.parametrize(
    "name, nvml, recording",
    [
        *[(name, "h100x8.json", "nvidia-smi-q-8xH100-SXM.txt") for name in H100],
        ("rtx4090-workstation", "rtx4090.json", "nvidia-smi-q-RTX4090-gpu0-section.txt"),
    ],
)
def test_gpus_are_the_recorded_cards(name, nvml, recording):
    driver, cards = gpus.probe(fakenvml.load(str(NVML / nvml)))
    inv = inventory(name)
    assert (inv.nvidia_driver, inv.gpus) == (driver, cards)
    smi_driver, smi_cards = nvidia_smi_q(HARDWARE / recording)
    assert inv.nvidia_driver == smi_driver
    for gpu, smi in zip(inv.gpus, smi_cards, strict=True):
        assert (gpu.name, gpu.uuid) == (smi["name"], smi["uuid"])
        assert gpu.memory_total_bytes == smi["total_mib"] * MIB
        assert gpu.memory_total_bytes - gpu.memory_used_bytes == smi["free_mib"] * MIB


@pytest.mark.parametrize("name, fabric", list(zip(H100, ("ib-a", "ib-a", "ib-b"))))
def test_h100_nodes_have_the_recorded_connectx7_on_their_fabric(name, fabric):
    recorded = infiniband.probe(str(SYSFS / "connectx7-ib-400g"), {"mlx5_5": fabric})
    assert to_wire(inventory(name).infiniband) == to_wire(recorded)
