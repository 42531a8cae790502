"""The ranks of one replica always share a fabric and never share a node, through place() and the reconciler."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.control.placement import NodeSnapshot, Placement, PlacementRequest, Unplaceable, place
from llmgw.records import GPU, IBAdapter

from ..control.test_reconciler import World, entry, inventory
from ..control.test_reconciler_ranks import rendezvous
from .machines import node

TWO_RANKS = PlacementRequest("llama-405b", "vllm", gpus=8, ranks=2)


def test_two_ranks_never_share_a_node_that_has_the_gpus_for_both():
    # gpu01 has sixteen free cards here, eight for each rank; it is still one node.
    double = node("h100x8-ib-a-1")
    double = attrs.evolve(double, gpus=[*double.gpus, *(attrs.evolve(g, index=g.index + 8) for g in double.gpus)])
    result = place(TWO_RANKS, [double, node("vm-8gb")])
    assert isinstance(result, Unplaceable)
    assert result.lines() == [
        "gpu01: is on ib-a, where only 1 node can take a rank and a 2-rank replica needs 2",
        "node05: has no vllm engine",
    ]


def test_a_node_listed_twice_is_one_node_not_two_ranks():
    result = place(TWO_RANKS, [node("h100x8-ib-a-1"), node("h100x8-ib-a-1")])
    assert isinstance(result, Unplaceable)
    assert result.lines() == ["gpu01: is on ib-a, where only 1 node can take a rank and a 2-rank replica needs 2"]


def test_a_replica_across_two_fabrics_is_refused_with_the_reason():
    result = place(attrs.evolve(TWO_RANKS, ranks=3), [node("h100x8-ib-a-1"), node("h100x8-ib-a-2"),
                                                      node("h100x8-ib-b-1")])
    assert isinstance(result, Unplaceable)
    assert result.summary() == (
        "no node can hold it: gpu01: is on ib-a, where only 2 nodes can take a rank and a 3-rank replica needs 3;"
        " gpu02: is on ib-a, where only 2 nodes can take a rank and a 3-rank replica needs 3;"
        " gpu03: is on ib-b, where only 1 node can take a rank and a 3-rank replica needs 3"
    )


racks = st.lists(
    st.tuples(
        st.sampled_from(("g1", "g2", "g3", "g4", "g5")),  # repeated ids: the last snapshot wins
        st.frozensets(st.sampled_from(("ib-a", "ib-b", "ib-c")), max_size=2),
        st.integers(0, 16),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(racks, st.integers(2, 4), st.integers(0, 8))
def test_ranks_are_on_distinct_nodes_of_the_one_fabric_they_share(rack, ranks, gpus):
    nodes = [NodeSnapshot(node_id, engines=["vllm"], fabrics=fabrics, gpus=[GPU(i) for i in range(cards)])
             for node_id, fabrics, cards in rack]
    result = place(PlacementRequest("m", "vllm", gpus=gpus, ranks=ranks), nodes)
    if isinstance(result, Placement):
        chosen = [r.node_id for r in result.ranks]
        assert len(chosen) == len(set(chosen)) == ranks
        last = {n.id: n for n in nodes}
        assert all(result.fabric in last[node_id].fabrics for node_id in chosen)


# -- through the reconciler --


def on_fabric(world: World, node_id: str, fabric: str, memory_gb: float = 32) -> None:
    inv = attrs.evolve(inventory(node_id, memory_gb=memory_gb), infiniband=[IBAdapter("mlx5_0", fabric=fabric)])
    world.sessions[node_id] = world.sessions.get(node_id, 0) + 1
    world.fleet.register(node_id, world.sessions[node_id], inv)


def two_ranks(name: str, min_memory_gb: float | None = None):
    one = entry(name, min_memory_gb=min_memory_gb)
    return attrs.evolve(one, profile=attrs.evolve(one.profile, ranks=2))


def test_the_reconciler_waits_for_a_second_node_on_the_fabric_and_then_starts_a_rank_on_each():
    world = World()
    on_fabric(world, "node01", "ib-a")
    on_fabric(world, "node02", "ib-b")
    world.serve(two_ranks("big"))
    world.reconciler.tick()
    assert world.started() == []
    assert world.view("big/0")["reason"] == (
        "no node can hold it: node01: is on ib-a, where only 1 node can take a rank and a 2-rank replica needs 2;"
        " node02: is on ib-b, where only 1 node can take a rank and a 2-rank replica needs 2"
    )
    on_fabric(world, "node03", "ib-a")
    world.reconciler.tick()
    # Rank 0 starts first; rank 1, on the other ib-a node, once rank 0 says where to meet it.
    assert world.started() == [("node01", "big/0/0")]
    rendezvous(world)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0"), ("node03", "big/0/1")]


def test_each_rank_holds_its_memory_and_the_next_replica_is_told_whose_it_is():
    world = World()
    for node_id in ("node01", "node02"):
        on_fabric(world, node_id, "ib-a")
    world.serve(two_ranks("big", min_memory_gb=24), two_ranks("huge", min_memory_gb=24))
    world.reconciler.tick()
    # Rank 1 is not started yet, and its memory on node02 is held all the same.
    assert world.started() == [("node01", "big/0/0")]
    assert world.view("huge/0")["reason"] == (
        "no node can hold it: node01: 8 GB of 32 left after big/0, needs 24;"
        " node02: 8 GB of 32 left after big/0, needs 24"
    )
    rendezvous(world)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0"), ("node02", "big/0/1")]
