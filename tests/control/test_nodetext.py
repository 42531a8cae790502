"""``llmgw.cp.nodes`` as JSON text: byte for byte what the link wrote for the views, however the fleet moved.

The fleet keeps each node's reported facts as text and writes only what a
heartbeat changed (``llmgw.control.nodetext``).  Every check here compares that
text with autobahn's own serializer writing ``to_wire(node.view(now))``, the
answer as it was made before the text was kept.
"""

from __future__ import annotations

import random

import attrs
from twisted.internet.task import Clock

from llmgw.control.fleet import Fleet
from llmgw.control.nodelisting import NodeQuery
from llmgw.records import GPU, Filesystem, Heartbeat, Inventory
from llmgw.views import NodeBrief, Space
from llmgw.wire import JsonText, from_wire, sparse_json_text, to_wire
from tests.control.recorded import NODES, fleet_of, recorded

MACHINES = sorted(p.stem for p in NODES.glob("*.json"))


def as_autobahn_wrote_it(fleet: Fleet, clock: Clock, query: NodeQuery) -> bytes:
    # Imported here: autobahn's serializer, imported before anything has chosen txaio's
    # framework, leaves txaio unusable for the test modules collected after this one.
    from autobahn.wamp.serializer import JsonObjectSerializer

    now = clock.seconds()
    return JsonObjectSerializer().serialize([to_wire(node.view(now)) for node in fleet.listing(query)])


def moved(inventory: Inventory, rng: random.Random) -> Heartbeat:
    """A heartbeat whose figures moved at random, some of them to absent."""
    gpus = None if inventory.gpus is None else [
        GPU(index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
            memory_used_bytes=None if rng.random() < 0.1 else rng.randrange(0, 80 * 10**9),
            utilization_pct=rng.choice([None, 0, 37, 100])) for g in inventory.gpus]
    filesystems = None if inventory.filesystems is None else [
        Filesystem(mountpoint=f.mountpoint, total_bytes=f.total_bytes, free_bytes=rng.randrange(0, 10**12))
        for f in inventory.filesystems]
    return Heartbeat(memory_total_bytes=inventory.memory_total_bytes, gpus=gpus, filesystems=filesystems,
                     memory_available_bytes=rng.choice([None, rng.randrange(0, 10**12)]))


def test_the_listing_text_is_what_autobahn_wrote_through_heartbeats_cordons_and_silence():
    clock = Clock()
    clock.advance(1_000.25)
    fleet = Fleet(clock, lambda *event: None, unreachable_after=15, lost_after=60)
    rng = random.Random(14)
    for i in range(24):
        inventory = recorded(MACHINES[i % len(MACHINES)], f"node{i:02d}")
        if i % 5 == 0:  # words a JSON writer must escape, and ones it must not
            inventory = attrs.evolve(inventory, labels={"zone": 'Zürich "a"', "gpu": "h100"},
                                     warnings=["line\nbreak", "tab\there", "🚀 ünïcode", "back\\slash"])
        fleet.register(inventory.node_id, 100 + i, inventory, peer="127.0.0.1")
    everything = NodeQuery.parse(None, None, None, None)
    for round_ in range(12):
        for query in (everything, NodeQuery.parse(label="gpu=h100"), NodeQuery.parse(after="node05", limit=7)):
            text = fleet.json_listing(query)
            assert isinstance(text, JsonText)
            assert text.text == as_autobahn_wrote_it(fleet, clock, query), f"round {round_}"
        for node_id in rng.sample(sorted(fleet.nodes), 10):  # some heartbeat, some fall silent
            fleet.heartbeat(node_id, fleet.nodes[node_id].session, moved(fleet.nodes[node_id].inventory, rng))
        if round_ == 3:
            fleet.set_cordoned("node03", True)
        clock.advance(rng.choice([0.1, 1.7, 9.3]))
        fleet.check()
    states = {node.state for node in fleet.nodes.values()}
    assert len(states) > 1, f"every node stayed {states}: the silence the test means to list never came"


def test_a_changed_figure_is_in_the_next_listing_and_a_forgotten_node_is_not():
    clock = Clock()
    fleet = Fleet(clock, lambda *event: None)
    inventory = recorded("h100x8-ib-a-1", "node01")
    fleet.register("node01", 1, inventory)
    fleet.register("node02", 2, recorded("cpu-box", "node02"))
    everything = NodeQuery.parse(None, None, None, None)
    first = fleet.json_listing(everything).value()
    gpus = [GPU(index=g.index, uuid=g.uuid, name=g.name, memory_total_bytes=g.memory_total_bytes,
                memory_used_bytes=12345, utilization_pct=99) for g in inventory.gpus]
    fleet.heartbeat("node01", 1, Heartbeat(memory_total_bytes=inventory.memory_total_bytes, gpus=gpus))
    second = fleet.json_listing(everything).value()
    assert {g["utilization_pct"] for g in second[0]["gpus"]} == {99}
    assert {g["utilization_pct"] for g in first[0]["gpus"]} != {99}
    assert second[1] == first[1]
    assert fleet.forget_node("node01")
    assert [n["id"] for n in fleet.json_listing(everything).value()] == ["node02"]
    assert "node01" not in fleet._texts._views and "node01" not in fleet._texts._briefs


def test_to_wire_reads_a_json_text_back():
    assert to_wire({"nodes": JsonText(b'[{"id":"n1","gpus":null}]')}) == {"nodes": [{"id": "n1", "gpus": None}]}


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
