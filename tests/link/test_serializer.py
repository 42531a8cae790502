"""The link's JSON: autobahn's wire form, read by Python's C scanner, with text already written put in as it is."""

from __future__ import annotations

import json

from autobahn.wamp import message
from autobahn.wamp.serializer import JsonSerializer

from llmgw.link.session import LinkJsonSerializer
from llmgw.wire import JsonText


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


NODES = [{"id": "n1", "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3 ✓"}], "reason": None}, {"id": "n2"}]


def text_of(value) -> JsonText:
    return JsonText(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def test_a_json_text_is_written_as_the_value_it_holds_would_be():
    ours, theirs = LinkJsonSerializer(), JsonSerializer()
    for spliced, plain in [
        (message.Result(7, args=[text_of(NODES)]), message.Result(7, args=[NODES])),
        (message.Result(8, args=[text_of(NODES), "and", text_of([])], kwargs={"more": text_of({"a": 1})}),
         message.Result(8, args=[NODES, "and", []], kwargs={"more": {"a": 1}})),
        (message.Event(1, 2, args=[{"nested": [text_of("ü")]}]), message.Event(1, 2, args=[{"nested": ["ü"]}])),
    ]:
        assert ours.serialize(spliced) == theirs.serialize(plain)


def test_a_string_shaped_like_a_placeholder_is_left_as_it_was():
    """A peer's string cannot stand for a text: the placeholder's token is drawn afresh for each message."""
    ours, theirs = LinkJsonSerializer(), JsonSerializer()
    lookalikes = ["\u0000llmgw.json-text.0000000000000000.0", "\u0000llmgw.json-text..0", "llmgw.json-text"]
    spliced = message.Result(9, args=[text_of(NODES), *lookalikes])
    wire, _ = ours.serialize(spliced)
    assert wire == theirs.serialize(message.Result(9, args=[NODES, *lookalikes]))[0]
    [back] = ours.unserialize(wire, False)
    assert back.args == [NODES, *lookalikes]
