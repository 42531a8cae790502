"""The indexed placement gives the plain answer: the same node, the same GPUs, the same refusal words.

``place`` narrows its choice through an index (placement_index) and
``apply_to`` re-makes only the nodes it places on; ``place_plainly`` filters
and scores every node, and ``plain_apply`` below re-makes the list as
``apply_to`` did before it had an index.  Replica after replica, over
recorded machines and over any fleet hypothesis draws, the two must agree at
every step, answers and fleets alike.
"""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.control.placement import (
    NodeSnapshot,
    Placement,
    PlacementRequest,
    Reservation,
    Snapshots,
    Unplaceable,
    place,
    place_plainly,
)

from .machines import FILES, node
from .test_placement_properties import fleets, requests

GB = 10**9


def plain_apply(result: Placement, nodes: list[NodeSnapshot], model: str, replica: str | None) -> list[NodeSnapshot]:
    """Every node looked at, the placed ones re-made: apply_to before the index."""
    given = {r.node_id: r.gpus for r in result.ranks}
    out = []
    for n in nodes:
        if n.id in given:
            held = Reservation(replica or model, result.memory_bytes, given[n.id])
            n = attrs.evolve(n, gpus_in_use=n.gpus_in_use | held.gpus,
                             replicas={**n.replicas, model: n.replicas.get(model, 0) + 1},
                             reserved=(*n.reserved, held))
        out.append(n)
    return out


def plain_holding(nodes: list[NodeSnapshot], holds: frozenset[str]) -> list[NodeSnapshot]:
    return [attrs.evolve(n, holds_weights=n.id in holds) for n in nodes]


class Both:
    """One fleet kept both ways, placed on replica after replica; every answer compared."""

    def __init__(self, nodes: list[NodeSnapshot]):
        self.fast = Snapshots(nodes)
        self.plain = list(nodes)
        self.answers: list[Placement | Unplaceable] = []

    def hold(self, holds: frozenset[str]) -> None:
        self.fast = self.fast.holding_weights(holds)
        self.plain = plain_holding(self.plain, holds)
        assert self.fast == self.plain

    def place(self, request: PlacementRequest, holds: frozenset[str] = frozenset(), replica: str | None = None):
        answer = place(request, self.fast, holds)
        assert answer == place_plainly(request, self.plain, holds), request
        if isinstance(answer, Placement):
            self.fast = answer.apply_to(self.fast, request.model, replica)
            self.plain = plain_apply(answer, self.plain, request.model, replica)
            assert self.fast == self.plain
        self.answers.append(answer)
        return answer


# -- a fleet of recorded machines, as a big one mixes them --


def recorded_fleet(count: int) -> list[NodeSnapshot]:
    """*count* nodes of the six recorded machines in turn: some down or cordoned, some half full, labelled by rack."""
    machines = list(FILES)
    nodes = []
    for i in range(count):
        kw = {}
        if i % 11 == 3:
            kw["state"] = "unreachable"
        if i % 13 == 5:
            kw["cordoned"] = True
        if i % 7 == 2:
            kw["reserved"] = [Reservation(f"old{i}/0", gpus={0, 1, 2, 3, 4, 5, 6})]
            kw["replicas"] = {"old": 1}
        if i % 5 == 1:
            kw["weights_free_bytes"] = (i % 4) * 30 * GB
        snap = node(machines[i % len(machines)], node_id=f"n{i:04d}", **kw)
        nodes.append(attrs.evolve(snap, labels={**snap.labels, "rack": f"r{i % 3}"}))
    return nodes


CATALOG = [
    PlacementRequest("gemma", "llama.cpp", gpus=1),
    PlacementRequest("qwen", "vllm", gpus=2, min_gpu_free_bytes=40 * GB),
    PlacementRequest("llama", "vllm", gpus=8),
    PlacementRequest("echo", "llama.cpp", min_memory_gb=24),
    PlacementRequest("small", "llama.cpp", min_memory_gb=4, node_selector={"rack": "r1"}),
    PlacementRequest("mixtral", "vllm", gpus=4, disk_gb=50),
    PlacementRequest("deepseek", "vllm", gpus=8, ranks=2),
    PlacementRequest("old", "llama.cpp", gpus=1, engine_version="b11194"),
    PlacementRequest("pinned", "vllm", gpus=1, engine_version="0.11.0"),
    PlacementRequest("none", "sglang", gpus=1),
]


def test_replica_after_replica_over_recorded_machines_lands_as_plain_placement_does():
    both = Both(recorded_fleet(240))
    for round_ in range(30):
        for index, request in enumerate(CATALOG):
            holds = frozenset({f"n{(round_ * 7 + index) % 240:04d}"}) if index % 3 == 0 else frozenset()
            both.hold(holds)
            both.place(request, holds, f"{request.model}/{round_}")
    placed = [a for a in both.answers if isinstance(a, Placement)]
    refused = [a for a in both.answers if isinstance(a, Unplaceable)]
    # Enough of each to have said something: the fleet filled up, and refusals named holders.
    assert len(placed) > 100 and len(refused) > 50
    assert any(len(a.ranks) == 2 for a in placed)
    assert any("hold" in line for a in refused for line in a.lines())


def test_an_older_fleet_placed_on_again_answers_as_it_did():
    """The index moves to the fleet apply_to gives back; the one it came from still answers for itself."""
    before = Snapshots(recorded_fleet(60))
    first = place(CATALOG[0], before)
    after = first.apply_to(before, "gemma")
    place(CATALOG[0], after)
    assert place(CATALOG[0], before) == first == place_plainly(CATALOG[0], list(before))


def test_a_repeated_id_counts_once_and_its_last_snapshot_wins():
    nodes = recorded_fleet(12)
    nodes.append(attrs.evolve(nodes[3], state="ready", cordoned=False, gpus_in_use=frozenset()))
    both = Both(nodes)
    for request in CATALOG * 3:
        both.place(request)


# -- any fleet at all --

disk_requests = st.tuples(requests, st.none() | st.integers(0, 100)).map(
    lambda t: attrs.evolve(t[0], disk_gb=t[1]))
steps = st.lists(st.tuples(disk_requests | requests, st.frozensets(st.sampled_from("abcdefgh"), max_size=3),
                           st.booleans()), min_size=1, max_size=12)


@st.composite
def varied_fleets(draw):
    nodes = draw(fleets())
    nodes = [attrs.evolve(n, weights_free_bytes=draw(st.none() | st.integers(0, 100 * GB))) for n in nodes]
    if nodes and draw(st.booleans()):
        nodes.append(attrs.evolve(draw(st.sampled_from(nodes)), cordoned=draw(st.booleans())))
    return nodes


@settings(max_examples=300, deadline=None)
@given(varied_fleets(), steps)
def test_any_fleet_placed_on_replica_after_replica_answers_as_plain_placement_does(nodes, steps):
    # Ids of one letter, so holds and the fleet meet often.
    nodes = [attrs.evolve(n, id=n.id[:1]) for n in nodes]
    both = Both(nodes)
    for index, (request, holds, weights) in enumerate(steps):
        if weights:
            both.hold(holds)
        both.place(request, holds, f"{request.model}/{index}")

