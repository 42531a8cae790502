"""``llmgw.cp.nodes`` filtered and paged: what an operator's query gets, and in what words a bad one is refused.

The fleet holds the recorded machines of tests/fixtures/nodes under new
ids, on a ``task.Clock``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from twisted.internet import task

from llmgw.control.fleet import MAX_PAGE, Fleet, NodeQuery
from llmgw.records import Heartbeat, Inventory
from llmgw.views import NodeBrief, Space
from llmgw.wire import from_wire, sparse_json_text, to_wire

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
MACHINES = ("h100x8-ib-a-1", "rtx4090-workstation", "cpu-box", "vm-8gb")


def inventory(machine: str, node_id: str) -> Inventory:
    payload = json.loads((NODES / f"{machine}.json").read_text())
    payload["node_id"] = node_id
    return from_wire(Inventory, payload)


def fleet_of(n: int) -> tuple[Fleet, task.Clock]:
    clock = task.Clock()
    clock.advance(1_000)
    fleet = Fleet(clock, lambda *event: None, unreachable_after=15, lost_after=120)
    for i in range(n):
        fleet.register(f"n{i:03d}", i, inventory(MACHINES[i % len(MACHINES)], f"n{i:03d}"))
    return fleet, clock


def ids(nodes) -> list[str]:
    return [n.id if hasattr(n, "id") else n["id"] for n in nodes]


def test_a_listing_is_filtered_by_state_and_label():
    fleet, clock = fleet_of(8)
    clock.advance(10)
    for node_id in ("n001", "n002", "n005"):  # these keep heartbeating; the rest fall silent
        fleet.heartbeat(node_id, fleet.nodes[node_id].session, Heartbeat())
    clock.advance(6)
    fleet.check()
    assert ids(fleet.listing(NodeQuery.parse(state="ready"))) == ["n001", "n002", "n005"]
    assert ids(fleet.listing(NodeQuery.parse(state="unreachable"))) == ["n000", "n003", "n004", "n006", "n007"]
    assert ids(fleet.listing(NodeQuery.parse(label="gpu=h100"))) == ["n000", "n004"]
    assert ids(fleet.listing(NodeQuery.parse(state="unreachable", label="gpu=h100", limit=1))) == ["n000"]
    assert fleet.listing(NodeQuery.parse(state="lost")) == []


def test_pages_list_every_node_exactly_once_while_nodes_register_between_them():
    fleet, _ = fleet_of(25)
    seen: list[str] = []
    after = None
    while True:
        page = fleet.json_listing(NodeQuery.parse(after=after, limit=10)).value()
        seen += ids(page)
        if len(page) < 10:
            break
        after = page[-1]["id"]
        # Between pages: one node before the cursor, one after it.
        fleet.register(f"a{len(seen)}", 100 + len(seen), inventory("cpu-box", f"a{len(seen)}"))
        fleet.register(f"z{len(seen)}", 200 + len(seen), inventory("cpu-box", f"z{len(seen)}"))
    assert len(seen) == len(set(seen))
    assert {f"n{i:03d}" for i in range(25)} <= set(seen)
    assert not any(s.startswith("a") for s in seen)  # registered behind the cursor: the next listing has them
    assert [s for s in seen if s.startswith("z")] == ["z10", "z20"]


def test_the_listing_is_the_nodes_views_in_wire_form_after_heartbeats_and_changes():
    fleet, clock = fleet_of(6)
    assert fleet.json_listing(NodeQuery()).value() == to_wire(fleet.views())
    for step in range(3):
        clock.advance(5)
        for node in list(fleet.nodes.values()):
            gpus = [
                {**to_wire(g), "utilization_pct": 10 * step + g.index,
                 "memory_used_bytes": None if step == 2 else (1 << 30) + step}
                for g in node.inventory.gpus or ()
            ]
            fleet.heartbeat(node.id, node.session, from_wire(Heartbeat, {"gpus": gpus, "memory_available_bytes": step}))
        fleet.set_cordoned("n002", step % 2 == 0)
        assert fleet.json_listing(NodeQuery()).value() == to_wire(fleet.views()), f"after step {step}"
    clock.advance(20)
    fleet.check()
    listed = fleet.json_listing(NodeQuery()).value()
    assert listed == to_wire(fleet.views())
    assert {n["state"] for n in listed} == {"unreachable"}
    assert listed[3]["memory_available_bytes"] == 2
    assert listed[0]["gpus"][0]["memory_used_bytes"] is None  # not reported this time: absent, not zero
    assert listed[0]["gpus"][1]["utilization_pct"] == 21


def test_the_brief_listing_is_the_nodes_briefs_after_heartbeats_and_changes():
    fleet, clock = fleet_of(6)

    def briefs() -> bytes:
        return sparse_json_text([NodeBrief.of(v) for v in fleet.views()]).encode()

    assert fleet.json_listing(NodeQuery(), brief=True).text == briefs()
    for step in range(4):
        clock.advance(5)
        for node in list(fleet.nodes.values()):
            gpus = [
                {**to_wire(g), "memory_used_bytes": None if step == 2 and g.index == 1 else (1 << 30) * step}
                for g in node.inventory.gpus or ()
            ]
            fleet.heartbeat(node.id, node.session, from_wire(Heartbeat, {
                "gpus": gpus, "memory_available_bytes": step,
                "filesystems": [{"mountpoint": "/", "free_bytes": step, "total_bytes": 10, "shared": step == 3}]}))
        fleet.set_cordoned("n002", step % 2 == 0)
        assert fleet.json_listing(NodeQuery(), brief=True).text == briefs(), f"after step {step}"
    clock.advance(20)
    fleet.check()
    listed = fleet.json_listing(NodeQuery.parse(state="unreachable", limit=3), brief=True)
    assert listed.text == sparse_json_text([NodeBrief.of(v) for v in fleet.views()[:3]]).encode()
    h100 = from_wire(list[NodeBrief], listed.value())[0]
    assert h100.reason == "no heartbeat for 20 s" and h100.disk_summary.shared == Space(3, 10)
    assert h100.gpu_summary.memory_used_bytes == 8 * 3 * (1 << 30)


def test_an_eight_gpu_nodes_brief_is_under_a_third_of_its_view():
    fleet, _ = fleet_of(1)
    assert fleet.nodes["n000"].inventory.gpus and len(fleet.nodes["n000"].inventory.gpus) == 8
    brief = fleet.json_listing(NodeQuery(), brief=True).text
    whole = fleet.json_listing(NodeQuery()).text
    assert len(brief) * 3 < len(whole), (len(brief), len(whole))


@pytest.mark.parametrize(("query", "words"), [
    ({"state": "sleeping"}, "state 'sleeping' is none of ready, unreachable, lost"),
    ({"state": 3}, "state 3 is none of"),
    ({"label": "gpu"}, "label 'gpu' is not KEY=VALUE (gpu=h100)"),
    ({"label": "=h100"}, "label '=h100' is not KEY=VALUE"),
    ({"after": 7}, "after 7 is not a node id (the last id of the page before)"),
    ({"limit": 0}, f"limit 0 is not a number of nodes from 1 to {MAX_PAGE}"),
    ({"limit": MAX_PAGE + 1}, f"limit {MAX_PAGE + 1} is not a number of nodes"),
    ({"limit": True}, "limit True is not a number of nodes"),
])
def test_a_query_that_does_not_fit_is_refused_in_words(query, words):
    with pytest.raises(ValueError) as refused:
        NodeQuery.parse(**query)
    assert words in str(refused.value)
