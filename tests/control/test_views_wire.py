"""The views' wire form: today's keys, readable by older and newer ctl and TUI alike.

``recorded.json`` is what the control plane answered and published for
``viewscenario`` before its views were records; older ctl and dashboards read
exactly those keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from llmgw.records import Inventory
from llmgw.states import NodeState, ReplicaState, ShardState
from llmgw.views import (
    NODE_FACTS, EndpointTable, FleetStatus, NodeEvent, NodeView, ProgressEvent, ReplicaView, ShardEvent,
)
from llmgw.wire import from_wire, to_wire

from .viewscenario import run

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "views" / "recorded.json").read_text())
EVENTS = {"llmgw.event.node": NodeEvent, "llmgw.event.shard": ShardEvent, "llmgw.event.progress": ProgressEvent}


def shape(value):
    """The keys of every mapping in *value*, recursively; lists by the union of their items' shapes."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        merged: dict = {}
        for item in value:
            s = shape(item)
            if isinstance(s, dict):
                merged.update(s)
        return [merged] if merged else []
    return None


@pytest.mark.parametrize("answer", ["nodes", "replicas", "status", "endpoints", "events"])
def test_every_answer_and_event_has_the_keys_it_had_before_views_were_records(answer):
    now = run()[answer]
    assert shape(now) == shape(RECORDED[answer])
    assert len(now) == len(RECORDED[answer])
    # The scenario is deterministic: the answers are today's, values and order too.
    assert now == RECORDED[answer]


def decoded_again(kind, payload):
    return to_wire(from_wire(kind, payload))


def test_a_newer_reader_decodes_an_older_servers_answers_to_the_same_json():
    assert [decoded_again(NodeView, n) for n in RECORDED["nodes"]] == RECORDED["nodes"]
    assert [decoded_again(ReplicaView, r) for r in RECORDED["replicas"]] == RECORDED["replicas"]
    assert decoded_again(FleetStatus, RECORDED["status"]) == RECORDED["status"]
    assert decoded_again(EndpointTable, RECORDED["endpoints"]) == RECORDED["endpoints"]
    for topic, *args in RECORDED["events"]:
        if topic in EVENTS:
            assert decoded_again(EVENTS[topic], args[1]) == args[1], topic
        else:
            assert decoded_again(EndpointTable, args[0]) == args[0], topic


def test_decoded_states_are_the_vocabularys_members():
    nodes = [from_wire(NodeView, n) for n in RECORDED["nodes"]]
    assert [n.state for n in nodes] == [NodeState.READY, NodeState.LOST]
    assert all(type(n.state) is NodeState for n in nodes)
    replicas = [from_wire(ReplicaView, r) for r in RECORDED["replicas"]]
    assert {type(r.state) for r in replicas} == {ReplicaState}
    assert {type(s.state) for r in replicas for s in r.shards} == {ShardState}


def test_an_answer_without_fields_an_older_server_did_not_send_decodes_them_as_absent():
    (replica, *_) = RECORDED["replicas"]
    old = {k: v for k, v in replica.items() if k in ("model", "replica", "state", "nodes", "endpoint")}
    view = from_wire(ReplicaView, old)
    assert (view.replica, view.state, view.nodes) == ("echo/0", ReplicaState.READY, ["node01"])
    assert (view.age_s, view.stale, view.fingerprint, view.progress, view.shards) == (None, None, None, None, [])
    node = from_wire(NodeView, {"id": "node01", "state": "ready"})
    assert (node.cordoned, node.seen_ago_s, node.gpus, node.engines) == (None, None, None, None)
    status = from_wire(FleetStatus, {"models": [{"model": "echo", "desired": 1, "ready": 0, "states": {}}]})
    assert (status.models[0].weights_by_fabric, status.nodes) == (None, {})


def test_a_newer_servers_keys_are_ignored_and_its_unknown_states_kept_as_sent():
    node = from_wire(NodeView, {**RECORDED["nodes"][0], "state": "installing", "rack_power_w": 4000})
    assert node.state == "installing" and type(node.state) is str
    assert "rack_power_w" not in to_wire(node)


def test_a_node_view_carries_every_fact_the_inventory_has():
    assert set(NODE_FACTS) <= set(attrs.fields_dict(NodeView))
    assert set(NODE_FACTS) == set(attrs.fields_dict(Inventory)) - {"node_id", "cordoned", "shards", "fencing"}
