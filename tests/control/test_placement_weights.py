"""Weights in placement: holding them is a preference, and lifts the disk check; it is never a filter."""

from __future__ import annotations

from llmgw.control.placement import NodeSnapshot, Placement, PlacementRequest, Unplaceable, place

GB = 10**9


def node(node_id, free=None, holds=False):
    return NodeSnapshot(id=node_id, engines=["llama.cpp"], weights_free_bytes=free, holds_weights=holds)


def request(disk_gb=24):
    return PlacementRequest(model="gemma", engine="llama.cpp", disk_gb=disk_gb)


def test_a_node_with_too_little_disk_is_refused_in_its_own_words():
    result = place(request(), [node("node05", free=8 * GB)])
    assert isinstance(result, Unplaceable)
    assert result.reasons == {"node05": "has 8 GB free for weights, needs 24"}


def test_a_node_that_holds_the_weights_needs_no_room_for_them():
    result = place(request(), [node("node05", free=8 * GB, holds=True)], frozenset({"node05"}))
    assert isinstance(result, Placement) and result.ranks[0].node_id == "node05"


def test_a_node_that_did_not_report_its_disk_is_still_a_candidate():
    assert isinstance(place(request(), [node("node05", free=None)]), Placement)


def test_placement_prefers_the_node_holding_the_weights_but_places_without_them():
    nodes = [node("node01", free=100 * GB), node("node02", free=100 * GB, holds=True)]
    assert place(request(), nodes, frozenset({"node02"})).ranks[0].node_id == "node02"
    # nobody holds them: still placed (fetching is a valid answer)
    assert place(request(), nodes[:1]).ranks[0].node_id == "node01"
