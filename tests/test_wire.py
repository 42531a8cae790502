"""Link payloads: what goes out comes back the same; what comes in malformed is refused by name."""

from __future__ import annotations

import json
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.records import CPU, GPU, Filesystem, Heartbeat, IBAdapter, IBPort, Inventory, ShardSpec, ShardStatus
from llmgw.states import ShardState
from llmgw.wire import WireError, from_wire, sparse_json_text, to_sparse_wire, to_wire

maybe_int = st.none() | st.integers(min_value=0, max_value=2**60)
# Names hold printable characters with nothing around them, and no string half a UTF-16 pair (test_wire_bounds.py).
_printable = st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Co", "Cn", "Zl", "Zp", "Zs"),
                           whitelist_characters=" ")


def text(**size):
    return st.text(alphabet=_printable, **size).filter(lambda s: s == s.strip())


maybe_text = st.none() | text(max_size=20)

gpus = st.builds(GPU, index=st.integers(0, 16), uuid=maybe_text, name=maybe_text,
                 memory_total_bytes=maybe_int, memory_used_bytes=maybe_int,
                 utilization_pct=st.none() | st.integers(0, 100))
filesystems = st.builds(Filesystem, mountpoint=text(min_size=1, max_size=20), fstype=maybe_text,
                        shared=st.none() | st.booleans(), total_bytes=maybe_int, free_bytes=maybe_int,
                        weights_dirs=st.lists(text(max_size=10), max_size=3))
adapters = st.builds(IBAdapter, name=text(min_size=1, max_size=8),
                     ports=st.lists(st.builds(IBPort, port=st.integers(1, 2),
                                              rate_gbps=st.none() | st.floats(0, 800, allow_nan=False)), max_size=2),
                     fabric=maybe_text)
inventories = st.builds(
    Inventory,
    node_id=text(min_size=1, max_size=12),
    cpu=st.none() | st.builds(CPU, model=maybe_text, logical_cores=st.none() | st.integers(1, 65536),
                              vector_flags=st.none() | st.lists(st.sampled_from(["avx", "avx2", "fma"])),
                              avx2=st.none() | st.booleans()),
    memory_total_bytes=maybe_int,
    gpus=st.none() | st.lists(gpus, max_size=4),
    filesystems=st.none() | st.lists(filesystems, max_size=3),
    infiniband=st.none() | st.lists(adapters, max_size=2),
    labels=st.dictionaries(text(max_size=5), text(max_size=5), max_size=3),
    warnings=st.lists(text(max_size=30), max_size=2),
)


@given(inventories)
def test_an_inventory_survives_the_link(inventory):
    assert from_wire(Inventory, to_wire(inventory)) == inventory


@settings(deadline=None)
@given(inventories)
def test_an_inventory_written_sparse_reads_back_the_same_and_leaves_out_only_defaults(inventory):
    sparse = json.loads(sparse_json_text(inventory))
    assert from_wire(Inventory, sparse) == inventory
    whole = to_wire(inventory)
    left_out = {key: value for key, value in whole.items() if key not in sparse}
    assert all(value in (None, [], {}) for value in left_out.values()), left_out


def test_sparse_wire_keeps_a_zero_false_and_an_empty_list_where_the_default_is_none():
    beat = Heartbeat(memory_available_bytes=0, gpus=[], filesystems=[Filesystem(mountpoint="/", shared=False)])
    assert to_sparse_wire(beat) == {"memory_available_bytes": 0, "gpus": [],
                                    "filesystems": [{"mountpoint": "/", "shared": False}]}
    assert to_sparse_wire(Heartbeat()) == {}
    assert to_sparse_wire(GPU(index=0, utilization_pct=0)) == {"index": 0, "utilization_pct": 0}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["node_id", "gpus", "cpu", "memory_total_bytes", "filesystems",
                                        "infiniband", "labels", "warnings", "extra"]), json_values))
def test_anything_a_peer_sends_is_taken_or_refused_with_a_wire_error(payload):
    for record in (Inventory, Heartbeat):
        try:
            from_wire(record, payload)
        except WireError as e:
            assert str(e).startswith(record.__name__)


def test_unknown_fields_from_a_newer_agent_are_ignored():
    assert from_wire(Heartbeat, {"memory_total_bytes": 5, "power_watts": 300}) == Heartbeat(memory_total_bytes=5)


def test_absent_fields_are_none_not_zero():
    beat = from_wire(Heartbeat, {})
    assert beat.memory_total_bytes is None and beat.gpus is None and beat.filesystems is None


SPEC = ShardSpec(shard_id="tiny/0/0", replica_id="tiny/0", model="tiny", engine="sim")


@pytest.mark.parametrize("state", list(ShardState))
def test_a_state_travels_as_its_plain_string_and_comes_back_as_its_member(state):
    payload = to_wire(ShardStatus(spec=SPEC, state=state))
    assert type(payload["state"]) is str and payload["state"] == state.value
    back = from_wire(ShardStatus, json.loads(json.dumps(payload)))
    assert back.state is state


def test_a_state_this_side_does_not_know_is_refused_with_the_ones_it_does():
    payload = to_wire(ShardStatus(spec=SPEC, state=ShardState.READY))
    with pytest.raises(WireError) as refused:
        from_wire(ShardStatus, {**payload, "state": "bogus"})
    assert str(refused.value) == ("ShardStatus.state: 'bogus' is not one of "
                                  "fetching, starting, ready, draining, stopped, failed")
    with pytest.raises(WireError, match=r"^Inventory.shards\[1\].state: expected one of fetching, .*, got int 3$"):
        from_wire(Inventory, {"node_id": "node01", "shards": [payload, {**payload, "state": 3}]})


def test_a_status_built_from_a_plain_string_holds_the_member():
    assert ShardStatus(spec=SPEC, state="draining").state is ShardState.DRAINING
