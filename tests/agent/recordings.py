"""Where the recordings of real machines are, and readers for their text.

The readers are written apart from discovery, and from the one-off scripts
that derived the fakes, so a test comparing the two catches a fake that has
drifted from the machine it claims to be.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
HARDWARE = FIXTURES / "hardware"
NVML = FIXTURES / "nvml"
SYSFS = FIXTURES / "sysfs"

MIB = 1 << 20


def nvidia_smi_q(path: Path) -> tuple[str, list[dict]]:
    """(driver version, cards) from `nvidia-smi -q` text: each card's bus id, name,
    uuid, FB memory (MiB) and GPU utilisation (None for N/A)."""
    text = path.read_text()
    driver = re.search(r"^Driver Version\s*: (\S+)$", text, re.M).group(1)
    cards = []
    for bus, body in re.findall(r"^GPU ([0-9A-Fa-f:.]+)\n(.*?)(?=^GPU |\Z)", text, re.M | re.S):
        memory = re.search(
            r"^    FB Memory Usage\n"
            r"        Total\s*: (\d+) MiB\n        Reserved\s*: (\d+) MiB\n"
            r"        Used\s*: (\d+) MiB\n        Free\s*: (\d+) MiB\n",
            body, re.M,
        ).groups()
        gpu_util = re.search(r"^    Utilization\n        Gpu\s*: (.+)$", body, re.M).group(1)
        cards.append({
            "bus": bus,
            "name": re.search(r"^    Product Name\s*: (.+)$", body, re.M).group(1),
            "uuid": re.search(r"^    GPU UUID\s*: (.+)$", body, re.M).group(1),
            "memory_mib": dict(zip(("total", "reserved", "used", "free"), map(int, memory))),
            "gpu_util": None if gpu_util == "N/A" else int(gpu_util.rstrip(" %")),
        })
    return driver, cards


def nvidia_smi_q_x(path: Path) -> tuple[str, list[dict]]:
    """The same from `nvidia-smi -q -x`."""
    root = ET.parse(path).getroot()
    cards = []
    for gpu in root.iter("gpu"):
        fb = gpu.find("fb_memory_usage")
        util = gpu.find("utilization/gpu_util").text
        cards.append({
            "bus": gpu.get("id"),
            "name": gpu.findtext("product_name"),
            "uuid": gpu.findtext("uuid"),
            "memory_mib": {k: int(fb.findtext(k).split()[0]) for k in ("total", "reserved", "used", "free")},
            "gpu_util": None if util == "N/A" else int(util.split()[0]),
        })
    return root.findtext("driver_version"), cards


def ibstat(path: Path) -> dict[str, dict]:
    """Adapters from `ibstat` text: name -> firmware, node GUID (0x…) and ports."""
    adapters = {}
    for name, body in re.findall(r"^CA '(\w+)'\n(.*?)(?=^CA '|\Z)", path.read_text(), re.M | re.S):
        ports = {}
        for number, port in re.findall(r"^\s+Port (\d+):\n((?:\s{9,}.*\n?)+)", body, re.M):
            fields = dict(re.findall(r"^\s+([A-Za-z ]+): (.+)$", port, re.M))
            ports[int(number)] = fields
        adapters[name] = {
            "firmware": re.search(r"Firmware version: (\S+)", body).group(1),
            "guid": re.search(r"Node GUID: (0x[0-9a-f]+)", body).group(1),
            "ports": ports,
        }
    return adapters


def ibv_devinfo(path: Path) -> dict[str, dict]:
    """Adapters from `ibv_devinfo` text: name -> fw_ver, node_guid, board_id, ports."""
    adapters = {}
    for name, body in re.findall(r"^hca_id:\t(\w+)\n(.*?)(?=^hca_id:|\Z)", path.read_text(), re.M | re.S):
        fields = dict(re.findall(r"^\t(\w+):\t+(.+)$", body, re.M))
        ports = {}
        for number, port in re.findall(r"^\t\tport:\t(\d+)\n((?:\t\t\t.*\n?)+)", body, re.M):
            ports[int(number)] = dict(re.findall(r"^\t\t\t(\w+):\t+(.+)$", port, re.M))
        adapters[name] = {**fields, "ports": ports}
    return adapters
