"""``llmgw.cp.nodes`` filtered and paged (``llmgw.control.nodelisting``): what a query gets, and how a bad one is refused.

The filtered listings are answered from the fleet's state and label
indexes; each check of those compares the listing with every node looked at
in turn, which is what the listing did before it had an index.
"""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from llmgw.control.fleet import Fleet
from llmgw.control.nodelisting import MAX_PAGE, NodeQuery
from llmgw.records import Heartbeat, Inventory
from llmgw.states import NodeState
from tests.control.recorded import fleet_of, recorded


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def fleet(clock):
    return Fleet(clock, lambda *event: None, unreachable_after=15, lost_after=60)


def register(fleet, node_id: str, session: int, **labels: str) -> None:
    fleet.register(node_id, session, Inventory(node_id=node_id, address="10.0.0.5", labels=labels))


def by_looking(fleet, query: NodeQuery) -> list[str]:
    """What *query* lists, found by looking at every node in id order."""
    found = [n.id for _, n in sorted(fleet.nodes.items())
             if (query.state is None or n.state == query.state)
             and (query.label is None or n.inventory.labels.get(query.label[0]) == query.label[1])
             and (query.after is None or n.id > query.after)]
    return found[:query.limit] if query.limit is not None else found


QUERIES = [
    NodeQuery.parse(label="gpu=h100"), NodeQuery.parse(label="gpu=a100"), NodeQuery.parse(label="rack=r1"),
    NodeQuery.parse(state="ready"), NodeQuery.parse(state="unreachable"), NodeQuery.parse(state="lost"),
    NodeQuery.parse(state="unreachable", label="gpu=h100"), NodeQuery.parse(state="ready", label="rack=r1"),
    NodeQuery.parse(label="gpu=h100", after="n03", limit=2), NodeQuery.parse(state="ready", after="n01", limit=3),
]


def assert_listings_right(fleet) -> None:
    for query in QUERIES:
        assert [n.id for n in fleet.listing(query)] == by_looking(fleet, query), query


def test_label_and_state_listings_follow_registrations_relabels_silence_and_forgetting(fleet, clock):
    for i in range(8):
        register(fleet, f"n{i:02d}", i, gpu="h100" if i % 2 else "a100", **({"rack": "r1"} if i < 4 else {}))
    assert [n.id for n in fleet.listing(NodeQuery.parse(label="gpu=h100"))] == ["n01", "n03", "n05", "n07"]
    assert_listings_right(fleet)

    # A node registering again with other labels moves between them; one that drops a label leaves it.
    register(fleet, "n01", 11, gpu="a100", rack="r1")
    register(fleet, "n02", 12, gpu="a100")
    assert [n.id for n in fleet.listing(NodeQuery.parse(label="gpu=h100"))] == ["n03", "n05", "n07"]
    assert [n.id for n in fleet.listing(NodeQuery.parse(label="rack=r1"))] == ["n00", "n01", "n03"]
    assert_listings_right(fleet)

    # Silence: the ones that keep heartbeating stay ready, the rest are unreachable, then lost.
    clock.advance(10)
    for node_id, session in (("n01", 11), ("n03", 3), ("n06", 6)):
        fleet.heartbeat(node_id, session, Heartbeat())
    clock.advance(6)
    fleet.check()
    assert [n.id for n in fleet.listing(NodeQuery.parse(state="ready"))] == ["n01", "n03", "n06"]
    assert_listings_right(fleet)
    clock.advance(50)
    fleet.check()
    assert [n.id for n in fleet.listing(NodeQuery.parse(state="lost"))] == ["n00", "n02", "n04", "n05", "n07"]
    assert fleet.listing(NodeQuery.parse(state="ready")) == []
    assert_listings_right(fleet)

    # Heard from again: ready.  Forgotten: in no listing at all.
    register(fleet, "n05", 15, gpu="h100")
    assert fleet.forget_node("n03")
    assert fleet.forget_node("n07")
    assert [n.id for n in fleet.listing(NodeQuery.parse(label="gpu=h100"))] == ["n05"]
    assert [n.id for n in fleet.listing(NodeQuery.parse(state="ready"))] == ["n05"]
    assert_listings_right(fleet)

    # A machine onboarded again after it was forgotten is listed as new.
    register(fleet, "n07", 17, gpu="h100", rack="r1")
    assert [n.id for n in fleet.listing(NodeQuery.parse(state="ready", label="rack=r1"))] == ["n07"]
    assert_listings_right(fleet)


def test_a_label_or_state_nobody_has_lists_nothing(fleet):
    for i in range(5):
        register(fleet, f"n{i:02d}", i, gpu="h100")
    assert fleet.listing(NodeQuery.parse(label="gpu=b200")) == []
    assert fleet.listing(NodeQuery.parse(state="lost", label="gpu=h100")) == []
    assert [n.id for n in fleet.listing(NodeQuery.parse(label="gpu=h100", limit=2))] == ["n00", "n01"]
    assert fleet.listing(NodeQuery.parse(state=NodeState.UNREACHABLE.value)) == []


def test_nodes_forgotten_leave_nothing_behind_in_the_indexes(fleet):
    for i in range(4):
        register(fleet, f"n{i:02d}", i, gpu="h100", rack=f"r{i}")
    register(fleet, "n00", 10, gpu="a100")
    for i in range(4):
        assert fleet.forget_node(f"n{i:02d}")
    assert fleet._index._members == {}  # ten thousand nodes offboarded over a year are not kept
    assert fleet.listing(NodeQuery.parse(label="gpu=h100")) == []


def ids(nodes) -> list[str]:
    return [n.id if hasattr(n, "id") else n["id"] for n in nodes]


def test_a_listing_is_filtered_by_state_and_label():
    fleet, clock = fleet_of(8)
    clock.advance(10)
    for node_id in ("n001", "n002", "n005"):  # these keep heartbeating; the rest fall silent
        fleet.heartbeat(node_id, fleet.nodes[node_id].session, Heartbeat())
    clock.advance(6)
    fleet.check()
    assert ids(fleet.listing(NodeQuery.parse(state="ready"))) == ["n001", "n002", "n005"]
    assert ids(fleet.listing(NodeQuery.parse(state="unreachable"))) == ["n000", "n003", "n004", "n006", "n007"]
    assert ids(fleet.listing(NodeQuery.parse(label="gpu=h100"))) == ["n000", "n004"]
    assert ids(fleet.listing(NodeQuery.parse(state="unreachable", label="gpu=h100", limit=1))) == ["n000"]
    assert fleet.listing(NodeQuery.parse(state="lost")) == []


def test_pages_list_every_node_exactly_once_while_nodes_register_between_them():
    fleet, _ = fleet_of(25)
    seen: list[str] = []
    after = None
    while True:
        page = fleet.json_listing(NodeQuery.parse(after=after, limit=10)).value()
        seen += ids(page)
        if len(page) < 10:
            break
        after = page[-1]["id"]
        # Between pages: one node before the cursor, one after it.
        fleet.register(f"a{len(seen)}", 100 + len(seen), recorded("cpu-box", f"a{len(seen)}"))
        fleet.register(f"z{len(seen)}", 200 + len(seen), recorded("cpu-box", f"z{len(seen)}"))
    assert len(seen) == len(set(seen))
    assert {f"n{i:03d}" for i in range(25)} <= set(seen)
    assert not any(s.startswith("a") for s in seen)  # registered behind the cursor: the next listing has them
    assert [s for s in seen if s.startswith("z")] == ["z10", "z20"]


@pytest.mark.parametrize(("query", "words"), [
    ({"state": "sleeping"}, "state 'sleeping' is none of ready, unreachable, lost"),
    ({"state": 3}, "state 3 is none of"),
    ({"label": "gpu"}, "label 'gpu' is not KEY=VALUE (gpu=h100)"),
    ({"label": "=h100"}, "label '=h100' is not KEY=VALUE"),
    ({"after": 7}, "after 7 is not a node id (the last id of the page before)"),
    ({"limit": 0}, f"limit 0 is not a number of nodes from 1 to {MAX_PAGE}"),
    ({"limit": MAX_PAGE + 1}, f"limit {MAX_PAGE + 1} is not a number of nodes"),
    ({"limit": True}, "limit True is not a number of nodes"),
])
def test_a_query_that_does_not_fit_is_refused_in_words(query, words):
    with pytest.raises(ValueError) as refused:
        NodeQuery.parse(**query)
    assert words in str(refused.value)
