"""What a string a peer sends may hold, by its kind: names and paths with nothing around them, names printable.

An endpoint with a leading space was taken and stored with it: every string
a node sends that is stored or compared is held to its kind (llmgw.wiretext)
where it crosses, and the refusal names the field.
"""

from __future__ import annotations

import pytest

from llmgw.records import Inventory, Progress, ShardSpec, ShardStatus, WeightsReport
from llmgw.wire import WireError, from_wire
from llmgw.wiretext import Text, refusal

SPEC = {"shard_id": "m/0/0", "replica_id": "m/0", "model": "m", "engine": "sim"}
NODE = {"node_id": "node01"}


def status(**fields):
    return {"spec": SPEC, "state": "ready", **fields}


@pytest.mark.parametrize("record, payload, message", [
    (ShardStatus, status(endpoint=" http://10.0.0.5:40001"),
     "ShardStatus.endpoint: ' http://10.0.0.5:40001' has whitespace around it, which it may not have: send it without"),
    (ShardStatus, status(endpoint="http://10.0.0.5:40001\t"),
     "ShardStatus.endpoint: control character U+0009 at 21, which it may not hold"),
    (ShardStatus, status(endpoint="http://10.0.0.5:40001\u3000"),
     "ShardStatus.endpoint: 'http://10.0.0.5:40001\\u3000' has whitespace around it, which it may not have: "
     "send it without"),
    (ShardStatus, status(rendezvous="10.0.0.5:29500 "),
     "ShardStatus.rendezvous: '10.0.0.5:29500 ' has whitespace around it, which it may not have: send it without"),
    (ShardStatus, status(spec={**SPEC, "shard_id": "m/0/0 "}),
     "ShardStatus.spec.shard_id: 'm/0/0 ' has whitespace around it, which it may not have: send it without"),
    (ShardStatus, status(spec={**SPEC, "model": "m\u202e"}),
     "ShardStatus.spec.model: unprintable character U+202E at 1, which a name may not hold"),
    (ShardStatus, status(spec={**SPEC, "engine_version": "0.11\u200b"}),
     "ShardStatus.spec.engine_version: unprintable character U+200B at 4, which a name may not hold"),
    (ShardStatus, status(spec={**SPEC, "source": "hf://acme/x\x1b[2J"}),
     "ShardStatus.spec.source: control character U+001B at 11, which it may not hold"),
    (ShardStatus, status(spec={**SPEC, "files": ["*.json "]}),
     "ShardStatus.spec.files[0]: '*.json ' has whitespace around it, which it may not have: send it without"),
    (Inventory, {**NODE, "labels": {" gpu": "h100"}},
     "Inventory.labels key: ' gpu' has whitespace around it, which it may not have: send it without"),
    (Inventory, {**NODE, "labels": {"gpu": "h100\u00a0"}},
     "Inventory.labels.gpu: unprintable character U+00A0 at 4, which a name may not hold"),
    (Inventory, {"node_id": "node01\u2028"},
     "Inventory.node_id: unprintable character U+2028 at 6, which a name may not hold"),
    (Inventory, {**NODE, "address": "10.0.0.5 "},
     "Inventory.address: '10.0.0.5 ' has whitespace around it, which it may not have: send it without"),
    (Inventory, {**NODE, "engines": [{"name": "vllm", "version": " 0.11.0"}]},
     "Inventory.engines[0].version: ' 0.11.0' has whitespace around it, which it may not have: send it without"),
    (Inventory, {**NODE, "filesystems": [{"mountpoint": "/srv "}]},
     "Inventory.filesystems[0].mountpoint: '/srv ' has whitespace around it, which it may not have: send it without"),
    (WeightsReport, {"files": [{"path": "/w/a.gguf\n", "size_bytes": 1}]},
     "WeightsReport.files[0].path: control character U+000A at 9, which it may not hold"),
    (Progress, {"source": "hf://acme/x ", "file_name": "x", "bytes_done": 0},
     "Progress.source: 'hf://acme/x ' has whitespace around it, which it may not have: send it without"),
])
def test_a_string_with_whitespace_around_it_or_a_character_its_kind_may_not_hold_is_refused_by_field(
        record, payload, message):
    with pytest.raises(WireError) as refused:
        from_wire(record, payload)
    assert str(refused.value) == message


def test_what_is_inside_a_path_or_an_argument_is_its_own():
    spec = from_wire(ShardSpec, {**SPEC, "source": "/srv/My Models/x.gguf",
                                 "args": [" --chat-template", "{{ messages }}\n", "\t"]})
    assert spec.source == "/srv/My Models/x.gguf"
    assert spec.args == [" --chat-template", "{{ messages }}\n", "\t"]
    assert from_wire(Inventory, {**NODE, "cpu": {"model": "AMD EPYC 9654 96-Core Processor"}}).cpu.model.endswith(
        "Processor")


@pytest.mark.parametrize("value, text, words", [
    ("node05", Text.NAME, None),
    ("", Text.NAME, None),  # absent is the field's None; an empty name is the record's own rule to refuse
    ("a b", Text.NAME, None),
    (" a", Text.FREE, None),
    ("x" * 11, Text.PATH, "11 characters, more than the 10 it may have"),
    ("\ud800", None, "U+D800 at 0 is half a UTF-16 pair, not a character"),
])
def test_the_rule_of_each_kind(value, text, words):
    assert refusal(value, text, 10) == words
