"""The link's JSON: autobahn's wire form, read by Python's C scanner."""

from __future__ import annotations

import json

from autobahn.wamp import message
from autobahn.wamp.serializer import JsonSerializer

from llmgw.link.session import LinkJsonSerializer


def test_it_reads_what_autobahns_own_writes_message_for_message():
    ours, theirs = LinkJsonSerializer(), JsonSerializer()
    msgs = [
        message.Call(7, "llmgw.cp.nodes", args=[], kwargs={"limit": 1000, "after": "node0042"}),
        message.Result(7, args=[[{"id": "n1", "gpus": [{"index": 0, "memory_total_bytes": 85899345920,
                                                       "name": "NVIDIA H100 80GB HBM3 ✓"}], "reason": None}]]),
        message.Error(message.Call.MESSAGE_TYPE, 8, "llmgw.error.refused", args=["node01 is cordoned"]),
        message.Event(1, 2, args=["x"], kwargs={"state": "ready", "cordoned": False, "load": 0.5}),
    ]
    for msg in msgs:
        wire, _ = theirs.serialize(msg)
        [mine] = ours.unserialize(wire, False)
        [autobahns] = theirs.unserialize(wire, False)
        assert type(mine) is type(autobahns)
        assert mine.args == autobahns.args and mine.kwargs == autobahns.kwargs


def test_a_nul_prefixed_string_stays_a_string():
    """autobahn would turn "\\u0000..." into bytes (WAMP's binary convention); llmgw sends no binary."""
    wire = json.dumps([50, 7, {}, ["\u0000aGk="]]).encode()
    [result] = LinkJsonSerializer().unserialize(wire, False)
    assert result.args == ["\u0000aGk="]
