"""What a node reports is held to bounds no real machine goes past, and a refusal names the field.

Types alone let through negative memory, 1000 % GPU use, NaN rates and a
memory of 10**400, which made ``/metrics`` answer 500 for the whole cluster.
"""

from __future__ import annotations

import enum
import math
import types
import typing

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw import records
from llmgw.records import (
    EIB, PROSE, CollectResult, EngineInfo, EnginePlan, Filesystem, Heartbeat, Inventory, Progress, ShardSpec,
    ShardStatus, WeightsReport,
)
from llmgw.wire import INT64, Text, WireError, bounds_of, from_wire, to_wire

SPEC = {"shard_id": "m/0/0", "replica_id": "m/0", "model": "m", "engine": "sim"}
NODE = {"node_id": "node01"}


@pytest.mark.parametrize(
    "record, payload, message",
    [
        # The figures of the report that made /metrics answer 500, and their like.
        (Heartbeat, {"memory_total_bytes": 10**400},
         "Heartbeat.memory_total_bytes: 10**400 is above 2**60, the most it may be"),
        (Heartbeat, {"memory_available_bytes": 3 * 10**400},
         "Heartbeat.memory_available_bytes: about 10**400 is above 2**60, the most it may be"),
        (Heartbeat, {"memory_available_bytes": -1},
         "Heartbeat.memory_available_bytes: -1 is below 0, the least it may be"),
        (Heartbeat, {"gpus": [{"index": 0, "utilization_pct": 1000}]},
         "Heartbeat.gpus[0].utilization_pct: 1000 is above 100, the most it may be"),
        (Heartbeat, {"gpus": [{"index": 0, "memory_used_bytes": EIB + 1}]},
         "Heartbeat.gpus[0].memory_used_bytes: 1152921504606846977 is above 2**60, the most it may be"),
        (Heartbeat, {"gpus": [{"index": 64}]}, "Heartbeat.gpus[0].index: 64 is above 63, the most it may be"),
        (Heartbeat, {"gpus": [{"index": i} for i in range(65)]},
         "Heartbeat.gpus: 65 entries, more than the 64 it may have"),
        (Heartbeat, {"filesystems": [{"mountpoint": "/", "free_bytes": -5}]},
         "Heartbeat.filesystems[0].free_bytes: -5 is below 0, the least it may be"),
        (Progress, {"source": "s", "file_name": "f", "bytes_done": 1, "rate_bps": math.nan},
         "Progress.rate_bps: nan is not a finite number"),
        (Progress, {"source": "s", "file_name": "f", "bytes_done": 1, "rate_bps": math.inf},
         "Progress.rate_bps: inf is not a finite number"),
        (Progress, {"source": "s", "file_name": "f", "bytes_done": 1, "rate_bps": 1e308},
         "Progress.rate_bps: 1e+308 is above 2**60, the most it may be"),
        (Progress, {"source": "s", "file_name": "f", "bytes_done": 1, "rate_bps": -0.5},
         "Progress.rate_bps: -0.5 is below 0, the least it may be"),
        # An integer too large for a float is refused before it is made one (float() would overflow).
        (Progress, {"source": "s", "file_name": "f", "bytes_done": 1, "rate_bps": 10**400},
         "Progress.rate_bps: 10**400 is above 2**63-1, the most it may be"),
        (Inventory, {**NODE, "cpu": {"logical_cores": 0}}, "Inventory.cpu.logical_cores: 0 is below 1, the least it may be"),
        (Inventory, {**NODE, "cpu": {"logical_cores": 10**6}},
         "Inventory.cpu.logical_cores: 1000000 is above 65536, the most it may be"),
        (Inventory, {**NODE, "infiniband": [{"name": "mlx5_0", "ports": [{"port": 1, "rate_gbps": math.inf}]}]},
         "Inventory.infiniband[0].ports[0].rate_gbps: inf is not a finite number"),
        (Inventory, {**NODE, "hostname": "h" * 300}, "Inventory.hostname: 300 characters, more than the 256 it may have"),
        (Inventory, {**NODE, "hostname": "gpu01\nnode02 registered"},
         "Inventory.hostname: control character U+000A at 5, which a name may not hold"),
        (Inventory, {**NODE, "os": "Debian \ud800"},
         "Inventory.os: U+D800 at 7 is half a UTF-16 pair, not a character"),
        (Inventory, {**NODE, "labels": {f"k{i}": "v" for i in range(65)}},
         "Inventory.labels: 65 entries, more than the 64 it may have"),
        (Inventory, {**NODE, "labels": {"rack": "x" * 257}},
         "Inventory.labels.rack: 257 characters, more than the 256 it may have"),
        (Inventory, {**NODE, "filesystems": [{"mountpoint": "/srv\x00/x"}]},
         "Inventory.filesystems[0].mountpoint: control character U+0000 at 4, which it may not hold"),
        (Inventory, {**NODE, "weights": {"files": [{"path": "/w/a", "size_bytes": -1}]}},
         "Inventory.weights.files[0].size_bytes: -1 is below 0, the least it may be"),
        (Inventory, {**NODE, "engines": [{"name": "llama.cpp", "path": "/x" * 3000}]},
         "Inventory.engines[0].path: 6000 characters, more than the 4096 it may have"),
        (ShardStatus, {"spec": {**SPEC, "port": 0}, "state": "ready"},
         "ShardStatus.spec.port: 0 is below 1, the least it may be"),
        (ShardStatus, {"spec": {**SPEC, "gpus": [-1]}, "state": "ready"},
         "ShardStatus.spec.gpus[0]: -1 is below 0, the least it may be"),
        (ShardStatus, {"spec": SPEC, "state": "ready", "pid": 0}, "ShardStatus.pid: 0 is below 1, the least it may be"),
        (ShardStatus, {"spec": SPEC, "state": "ready", "since": math.nan}, "ShardStatus.since: nan is not a finite number"),
        (ShardSpec, {**SPEC, "start_timeout_s": -1}, "ShardSpec.start_timeout_s: -1.0 is below 0, the least it may be"),
        (EnginePlan, {"builds": [{"name": "llama.cpp", "sha256": {"a\tb": "0"}}]},
         "EnginePlan.builds[0].sha256 key: control character U+0009 at 1, which a name may not hold"),
    ],
)
def test_a_figure_past_its_bound_is_refused_naming_the_field(record, payload, message):
    with pytest.raises(WireError) as refused:
        from_wire(record, payload)
    assert str(refused.value) == message


def test_the_largest_figures_and_longest_names_allowed_are_taken():
    beat = from_wire(Heartbeat, {"memory_total_bytes": EIB, "memory_available_bytes": 0,
                                 "gpus": [{"index": i, "utilization_pct": 100, "name": "n" * 256} for i in range(64)]})
    assert beat.memory_total_bytes == EIB and len(beat.gpus) == 64
    assert from_wire(Progress, {"source": "s", "file_name": "f", "bytes_done": 0, "rate_bps": 0}).rate_bps == 0.0


def test_words_for_a_person_are_cut_never_refused():
    # A failed shard's status still lands, whatever its engine printed.
    status = from_wire(ShardStatus, {"spec": SPEC, "state": "failed", "reason": "x" * 10**6,
                                     "output_tail": [f"line {i} " + "y" * 10**4 for i in range(1000)]})
    assert len(status.reason) == PROSE and status.reason.endswith("…")
    assert len(status.output_tail) == 200
    assert status.output_tail[-1].startswith("line 999 ") and all(len(line) == PROSE for line in status.output_tail)
    # Control characters (an engine's colours) stay; half a UTF-16 pair, which no one can print, does not.
    info = from_wire(EngineInfo, {"name": "vllm", "reason": "\x1b[31mfailed\x1b[0m \ud800"})
    assert info.reason == "\x1b[31mfailed\x1b[0m ?"
    inv = from_wire(Inventory, {**NODE, "warnings": [str(i) for i in range(100)]})
    assert inv.warnings == [str(i) for i in range(36, 100)]


def test_every_field_a_node_or_the_control_plane_sends_has_its_bounds_beside_it():
    unbounded = []
    for name, cls in vars(records).items():
        if not (isinstance(cls, type) and attrs.has(cls) and cls.__module__ == records.__name__):
            continue
        attrs.resolve_types(cls)
        for f in attrs.fields(cls):
            if leaves(f.type) & {int, float, str, list, dict} and bounds_of(f) is None:
                unbounded.append(f"{name}.{f.name}")
    assert unbounded == []


def leaves(hint) -> set:
    """The plain types *hint* is made of (records and enums are checked by their own fields)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(leaves(a) for a in typing.get_args(hint)))
    if origin in (list, dict):
        return {origin} | set().union(*(leaves(a) for a in typing.get_args(hint)))
    if isinstance(hint, type) and (attrs.has(hint) or issubclass(hint, enum.Enum)):
        return set()
    return {hint}


# -- anything a peer sends: taken within bounds, or refused with a WireError naming the record ----------

wild = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(),
    st.sampled_from([10**400, -(10**400), 2**63, -1, 0, EIB + 1, 1e308, -0.0, math.nan, math.inf]),
    st.text(max_size=8), st.sampled_from(["\ud800", "a\nb", "\x00", "x" * 5000, "ready", "failed"]),
    st.lists(st.integers(-2, 70), max_size=3), st.just(list(range(70))), st.dictionaries(st.text(max_size=3), st.text(max_size=3)),
)


def payloads(hint, depth: int = 0):
    """Payloads shaped like *hint*, mostly plausible, now and then anything at all."""
    return st.integers(0, 24).flatmap(lambda n: wild if n == 0 else shaped(hint, depth))


def shaped(hint, depth: int):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(payloads(a, depth) for a in typing.get_args(hint)))
    if origin is list:
        (item,) = typing.get_args(hint)
        return st.lists(payloads(item, depth + 1), max_size=3) if depth < 3 else st.just([])
    if origin is dict:
        return st.dictionaries(st.text("abc", max_size=3), payloads(str, depth + 1), max_size=3)
    if isinstance(hint, type) and attrs.has(hint):
        attrs.resolve_types(hint)
        required = {f.name: payloads(f.type, depth + 1) for f in attrs.fields(hint) if f.default is attrs.NOTHING}
        optional = {f.name: payloads(f.type, depth + 1) for f in attrs.fields(hint) if f.default is not attrs.NOTHING}
        return st.fixed_dictionaries(required, optional=optional) if depth < 4 else st.nothing()
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from([m.value for m in hint])
    plausible = {int: st.integers(0, 60), float: st.floats(0, 1e6), str: st.text("ab/-_.é", min_size=1, max_size=8),
                 bool: st.booleans()}
    return plausible.get(hint, wild)


def within_bounds(record) -> None:
    """Every field of *record* (and of the records inside it) holds to its bounds."""
    for f in attrs.fields(type(record)):
        bounds = bounds_of(f)
        for value in values(getattr(record, f.name)):
            if attrs.has(type(value)):
                within_bounds(value)
            elif isinstance(value, (list, dict)):
                assert bounds is None or bounds.items is None or len(value) <= bounds.items
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                assert math.isfinite(value) and -INT64 <= value <= INT64
                if bounds is not None:
                    assert bounds.least is None or value >= bounds.least
                    assert bounds.most is None or value <= bounds.most
            elif isinstance(value, str):
                value.encode("utf-8")
                if bounds is not None:
                    assert bounds.chars is None or len(value) <= bounds.chars
                    if bounds.text is Text.NAME:
                        assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value)


def values(value):
    yield value
    if isinstance(value, list):
        for item in value:
            yield from values(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from values(v)


RECORDS = [Inventory, Heartbeat, ShardStatus, ShardSpec, Progress, CollectResult, EnginePlan, WeightsReport, Filesystem]


@settings(max_examples=1500, deadline=None)
@given(data=st.data())
def test_anything_a_peer_sends_is_taken_within_bounds_or_refused_naming_a_field(data):
    record = data.draw(st.sampled_from(RECORDS))
    payload = data.draw(payloads(record))
    try:
        decoded = from_wire(record, payload)
    except WireError as e:
        assert str(e).startswith(record.__name__)
        return
    within_bounds(decoded)
    # What was taken goes out again as it came in, or as cut.
    assert from_wire(record, to_wire(decoded)) == decoded
