"""The fleet's events: each kind a member on this side, the same string on the link, and one not known refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from llmgw.control.fleet import Fleet
from llmgw.records import Heartbeat, Inventory, Progress, ShardSpec, ShardStatus
from llmgw.views import EventKind, NodeChange, NodeEvent, ProgressEvent, ShardChange, ShardEvent
from llmgw.wire import WireError, from_wire, to_wire

SRC = Path(__file__).resolve().parents[1] / "src" / "llmgw"


def test_every_event_the_fleet_emits_travels_as_the_words_an_older_peer_reads_and_comes_back_as_its_member():
    clock = Clock()
    emitted = []
    fleet = Fleet(clock, lambda kind, ident, event: emitted.append((kind, ident, event)), unreachable_after=15,
                  lost_after=60)
    spec = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim")
    fleet.register("node01", 1, Inventory(node_id="node01", address="10.0.0.1", shards=[ShardStatus(spec, "starting")]))
    clock.advance(40)
    fleet.heartbeat("node01", 1, Heartbeat(memory_available_bytes=1))  # silent long enough to be news
    fleet.download("node01", Progress(source="https://models.example/echo.gguf", file_name="echo.gguf", bytes_done=1))
    fleet.set_cordoned("node01", True)
    fleet.duplicate_refused("node01", "a second agent with node01's certificate was refused")
    fleet.link_closed(1)
    assert fleet.forget_node("node01")

    said = []
    for kind, _, event in emitted:
        assert isinstance(kind, EventKind)
        wire = to_wire(event)
        back = from_wire(type(event), wire)
        assert back == event
        if not isinstance(event, ProgressEvent):
            assert type(back.change) is (NodeChange if isinstance(event, NodeEvent) else ShardChange)
        said.append((kind.value, wire.get("change")))
    assert said == [
        ("node", "registered"), ("shard", "status"), ("node", "heartbeat"), ("progress", None), ("node", "cordon"),
        ("node", "link warning"), ("node", "state"), ("shard", "removed"), ("node", "forgotten"),
    ]


@pytest.mark.parametrize("record", [NodeEvent, ShardEvent])
def test_a_change_this_side_does_not_know_is_refused_with_the_ones_it_does(record):
    fields = ({"node": {"id": "node01"}} if record is NodeEvent else
              {"node_id": "node01", "shard": to_wire(ShardStatus(
                  ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim"), "ready"))})
    with pytest.raises(WireError) as refused:
        from_wire(record, {"change": "renamed", **fields})
    known = NodeChange if record is NodeEvent else ShardChange
    assert str(refused.value) == f"{record.__name__}.change: 'renamed' is not one of {', '.join(known)}"


EVENTS = {NodeEvent.__name__, ShardEvent.__name__, ProgressEvent.__name__}


def test_no_module_writes_an_event_kind_as_a_string_literal():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            first = node.args[0]
            if name in EVENTS | {"_emit", "emit"} and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {name}({first.value!r}, ...)")
    assert found == []
