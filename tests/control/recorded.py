"""A fleet of the recorded machines of tests/fixtures/nodes, under new ids, on a ``task.Clock``."""

from __future__ import annotations

import json
from pathlib import Path

from twisted.internet import task

from llmgw.control.fleet import Fleet
from llmgw.records import Inventory
from llmgw.wire import from_wire

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
#: Four kinds, an eight-GPU node first: ``fleet_of`` registers them in turn.
FOUR = ("h100x8-ib-a-1", "rtx4090-workstation", "cpu-box", "vm-8gb")


def recorded(machine: str, node_id: str) -> Inventory:
    """*machine*'s recorded inventory, as *node_id*'s, running nothing."""
    payload = json.loads((NODES / f"{machine}.json").read_text())
    payload.pop("source", None)
    return from_wire(Inventory, {**payload, "node_id": node_id, "shards": []})


def fleet_of(n: int) -> tuple[Fleet, task.Clock]:
    """A fleet of *n* nodes, n000 onwards, each of ``FOUR`` in turn, all just registered."""
    clock = task.Clock()
    clock.advance(1_000)
    fleet = Fleet(clock, lambda *event: None, unreachable_after=15, lost_after=120)
    for i in range(n):
        fleet.register(f"n{i:03d}", i, recorded(FOUR[i % len(FOUR)], f"n{i:03d}"))
    return fleet, clock
