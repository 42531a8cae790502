"""`ctl nodes` reads each node's brief (``NodeBrief``): the same table as the whole view, in a third of the bytes.

What a node did not report is left out of a brief and read back as None,
so it still prints as ``-``; a figure of 0, or an empty list where None is
the default, is sent and printed as it is.
"""

from __future__ import annotations

import argparse
import json

import pytest
import pytest_twisted

from llmgw import render
from llmgw.ctl import tables
from llmgw.roles import ROLE_OPERATOR
from llmgw.views import NodeBrief, NodeView
from llmgw.wire import from_wire, sparse_json_text, to_wire

GB = 1_000_000_000
NOW = 1_800_000_000.0
H100 = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GB, "memory_used_bytes": GB}
        for i in range(8)]

NODES = {
    "an old agent that reports nothing": {},
    "no GPUs, no engines, no warnings": {"gpus": [], "engines": [], "warnings": []},
    "eight GPUs": {"gpus": H100, "memory_total_bytes": 2048 * GB, "memory_available_bytes": 0},
    "a card that did not say its memory": {"gpus": [*H100[:2], {"index": 2, "name": "H100"}]},
    "two kinds of card, one named twice over": {"gpus": [
        {"index": 0, "name": "NVIDIA A100", "memory_total_bytes": 40 * GB, "memory_used_bytes": 0},
        {"index": 1, "memory_total_bytes": 40 * GB, "memory_used_bytes": 0},
        {"index": 2, "name": "A100", "memory_total_bytes": 40 * GB, "memory_used_bytes": 0}]},
    "a CPU without AVX2 and a warning": {
        "cpu": {"model": "QEMU Virtual CPU version 2.5+", "logical_cores": 4, "avx2": False},
        "warnings": ["CPU QEMU Virtual CPU version 2.5+ has no AVX2"]},
    "local and shared filesystems": {"filesystems": [
        {"mountpoint": "/", "shared": False, "free_bytes": 50 * GB, "total_bytes": 200 * GB},
        {"mountpoint": "/lustre", "shared": True, "free_bytes": 8000 * GB, "total_bytes": 10000 * GB}]},
    "a filesystem without figures": {"filesystems": [{"mountpoint": "/srv"}]},
    "only shared space": {"filesystems": [{"mountpoint": "/nfs", "shared": True, "free_bytes": 1, "total_bytes": 2}]},
    "lost, cordoned, and why": {"state": "lost", "reason": "no heartbeat for 130 s", "seen_ago_s": 130, "cordoned": True},
    "engines that cannot run yet": {"engines": [
        {"name": "llama.cpp", "version": "b6000", "state": "installing", "reason": "downloading 12/16 MB"},
        {"name": "vllm", "state": "broken", "reason": "needs libgomp.so.1"},
        {"name": "sglang", "state": "absent"}]},
    "a certificate near its end, and what the hub refused": {
        "certificate_not_after": NOW + 3 * 86400, "link_warnings": ["a second agent with its certificate was refused"]},
    "a state only a newer server knows": {"state": "hibernating", "address": "10.0.0.5"},
}


def view(**kw) -> NodeView:
    return from_wire(NodeView, {"id": "node05", "state": "ready", "seen_ago_s": 3.0, **kw})


@pytest.mark.parametrize("payload", NODES.values(), ids=NODES.keys())
def test_a_nodes_brief_prints_the_same_table_as_its_whole_view(payload):
    full = view(**payload)
    brief = NodeBrief.of(full)
    sent = from_wire(NodeBrief, json.loads(sparse_json_text(brief)))
    assert sent == brief
    assert tables.nodes_table([sent], NOW) == tables.nodes_table([full], NOW)


def test_what_a_node_did_not_report_is_left_out_of_its_brief_and_reads_as_a_dash_not_a_zero():
    nothing = json.loads(sparse_json_text(NodeBrief.of(view())))
    assert nothing == {"id": "node05", "state": "ready", "seen_ago_s": 3.0}
    assert tables.nodes_table([from_wire(NodeBrief, nothing)], NOW).splitlines()[1].split()[2:8] == ["-"] * 6
    # A node that looked and has none is not one that did not say.
    none = json.loads(sparse_json_text(NodeBrief.of(view(gpus=[], engines=[], memory_available_bytes=0))))
    assert none["gpu_summary"] == {} and none["engines"] == [] and none["memory_available_bytes"] == 0
    back = from_wire(NodeBrief, none)
    assert (render.gpus(back), render.engines(back)) == ("none", "none")
    # A sum over cards one of which did not say its figure is no sum.
    partial = NodeBrief.of(view(**NODES["a card that did not say its memory"])).gpu_summary
    assert partial.kinds == {"NVIDIA H100 80GB HBM3": 2, "H100": 1} and partial.memory_used_bytes is None


def test_ctl_nodes_json_brief_prints_every_key_of_a_brief_with_none_for_what_was_not_said(capsys):
    from llmgw.ctl.main import _print

    _print(argparse.Namespace(json=True), [NodeBrief.of(view(gpus=H100))], tables.nodes_table)
    (printed,) = json.loads(capsys.readouterr().out)
    assert list(printed) == [f for f in to_wire(NodeBrief(id="x"))]
    assert printed["address"] is None and printed["disk_summary"] is None
    assert printed["gpu_summary"] == {"kinds": {"NVIDIA H100 80GB HBM3": 8}, "memory_used_bytes": 8 * GB,
                                      "memory_total_bytes": 640 * GB}


@pytest_twisted.ensureDeferred
async def test_ctl_nodes_prints_the_same_table_from_a_server_that_sends_briefs_and_from_an_older_one(capsys):
    """The table asks for briefs; a server from before them refuses the keyword, and its whole views are made brief."""
    from autobahn.wamp.types import ComponentConfig
    from twisted.internet import reactor

    from llmgw.ctl.main import cmd_nodes
    from llmgw.link import uris
    from llmgw.link.hub import Hub
    from tests.link.conftest import Joined

    views = [view(**{**payload, "id": f"n{i:02d}"}) for i, payload in enumerate(NODES.values())
             if "certificate_not_after" not in payload]  # its line counts days from the clock
    asked: list[bool] = []

    def nodes(state=None, label=None, after=None, limit=None, brief=False):
        asked.append(brief)
        page = [v for v in views if after is None or v.id > after][:limit]
        return json.loads(sparse_json_text([NodeBrief.of(v) for v in page])) if brief else to_wire(page)

    def older(state=None, label=None, after=None, limit=None):
        return nodes(state, label, after, limit)

    async def table(procedure, **flags) -> str:
        hub = Hub(reactor)
        server, alice = Joined(ComponentConfig(realm=uris.REALM)), Joined(ComponentConfig(realm=uris.REALM))
        hub.attach_local(server)
        await server.ready.addTimeout(5, reactor)
        await server.register(procedure, uris.CP_NODES)
        hub.attach_local(alice, authid="alice", role=ROLE_OPERATOR)
        await alice.ready.addTimeout(5, reactor)
        args = argparse.Namespace(**{"json": False, "brief": False, "state": None, "label": None, "limit": None,
                                     "after": None, **flags})
        assert await cmd_nodes(alice, args) == 0
        return capsys.readouterr().out

    assert await table(nodes) == tables.nodes_table(views) + "\n"
    assert asked == [True]
    assert await table(older) == tables.nodes_table(views) + "\n"
    assert asked == [True, False]  # refused with brief (no call reached it), then asked for the whole views
    printed = json.loads(await table(older, json=True, brief=True))
    assert printed == to_wire([NodeBrief.of(v) for v in views])
    printed = json.loads(await table(nodes, json=True))
    assert printed == to_wire(views) and asked[-1] is False
