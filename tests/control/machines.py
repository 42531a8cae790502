"""The recorded machines of tests/fixtures/nodes/, as placement sees them."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.control.placement import NodeSnapshot
from llmgw.records import Inventory
from llmgw.wire import from_wire

NODES = Path(__file__).resolve().parent.parent / "fixtures" / "nodes"
HARDWARE = NODES.parent / "hardware"
NVML = NODES.parent / "nvml"
SYSFS = NODES.parent / "sysfs"

# file name -> the node id its inventory registers with
FILES = {
    "vm-8gb": "node05",
    "cpu-box": "cpu01",
    "rtx4090-workstation": "ws01",
    "h100x8-ib-a-1": "gpu01",
    "h100x8-ib-a-2": "gpu02",
    "h100x8-ib-b-1": "gpu03",
}


def payload(name: str) -> dict:
    return json.loads((NODES / f"{name}.json").read_text())


def inventory(name: str) -> Inventory:
    """The inventory the machine's agent registers with, checked as the link checks it."""
    return from_wire(Inventory, payload(name))


def node(name: str, *, node_id: str | None = None, state: str = "ready", cordoned: bool = False,
         **kw) -> NodeSnapshot:
    """A snapshot of a recorded machine; *node_id* renames it, to make a second of the same kind."""
    inv = inventory(name)
    return NodeSnapshot.from_inventory(node_id or inv.node_id, state, cordoned, inv, **kw)


def fleet(*names: str) -> list[NodeSnapshot]:
    return [node(name) for name in names or FILES]
