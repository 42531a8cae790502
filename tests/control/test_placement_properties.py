"""What must hold for any fleet at all: placement never overrides a filter, never gives
a GPU twice, never raises, and says why for every node when it cannot place."""

from __future__ import annotations

import random

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.control import placement_filters as filters
from llmgw.control.placement import NodeSnapshot, Placement, PlacementRequest, Reservation, Unplaceable, place
from llmgw.records import GPU, EngineInfo
from llmgw.states import EngineState

ENGINES = ("llama.cpp", "vllm", "sglang", "sim")
MODELS = ("gemma", "qwen", "llama")
LABELS = st.dictionaries(st.sampled_from(("gpu", "role", "zone")), st.sampled_from(("a", "b")), max_size=2)
GB = 10**9

memory_bytes = st.none() | st.integers(min_value=-1, max_value=2048 * GB)
gpu_memory = st.none() | st.integers(min_value=0, max_value=100 * GB)
card = st.builds(GPU, index=st.integers(0, 9), memory_total_bytes=gpu_memory, memory_used_bytes=gpu_memory)
# Mostly what NVML sends (indices 0..n-1), sometimes anything a node could send:
# repeated or skipped indices, unknown memory, no list at all.
gpu_lists = st.one_of(
    st.integers(0, 8).map(lambda n: [GPU(i, memory_total_bytes=80 * GB, memory_used_bytes=GB) for i in range(n)]),
    st.lists(card, max_size=9),
    st.none(),
)
# Weighted towards nodes that could take something, or nearly every example
# would be "no node can hold it" and say little about where replicas land.
states = st.sampled_from(("ready",) * 6 + ("unreachable", "lost"))
VERSIONS = ("b5000", "b6000", "0.11.0")
# Entries as agents report them: any state (None from an agent older than install states), any origin.
engine_entries = st.builds(
    EngineInfo,
    name=st.sampled_from(ENGINES),
    version=st.none() | st.sampled_from(VERSIONS),
    state=st.none() | st.sampled_from(list(EngineState)),
    reason=st.none() | st.just("downloading llama-b6000-bin-ubuntu-x64.zip (16 MB)"),
    origin=st.none() | st.sampled_from(("server.yaml", "agent.yaml", "builtin")),
)
engine_lists = st.one_of(st.just(list(ENGINES)), st.none(), st.lists(st.sampled_from(ENGINES), max_size=4),
                         st.lists(engine_entries, max_size=5))


@st.composite
def snapshots(draw, node_id: str):
    return NodeSnapshot(
        id=node_id,
        state=draw(states),
        cordoned=draw(st.sampled_from((False,) * 5 + (True,))),
        labels=draw(LABELS),
        memory_total_bytes=draw(memory_bytes),
        engines=draw(engine_lists),
        gpus=draw(gpu_lists),
        gpus_in_use=draw(st.frozensets(st.integers(0, 11), max_size=6)),
        fabrics=draw(st.one_of(st.just({"ib-a"}), st.frozensets(st.sampled_from(("ib-a", "ib-b", "ib-c")), max_size=2))),
        replicas=draw(st.dictionaries(st.sampled_from(MODELS), st.integers(0, 5), max_size=3)),
        engines_reason=draw(st.none() | st.just("installing: downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)")),
    )


@st.composite
def rack_nodes(draw, node_id: str):
    """A GPU node as a healthy rack has them, with some of its cards already taken."""
    return NodeSnapshot(
        id=node_id,
        engines=list(ENGINES),
        gpus=[GPU(i, memory_total_bytes=80 * GB, memory_used_bytes=GB) for i in range(8)],
        gpus_in_use=draw(st.frozensets(st.integers(0, 7), max_size=8)),
        fabrics=draw(st.sampled_from(({"ib-a"}, {"ib-b"}, {"ib-a", "ib-b"}))),
        replicas=draw(st.dictionaries(st.sampled_from(MODELS), st.integers(0, 3), max_size=2)),
    )


@st.composite
def fleets(draw):
    ids = draw(st.lists(st.text("abcdefgh0123456789-", min_size=1, max_size=6), unique=True, max_size=8))
    kind = draw(st.sampled_from((snapshots, snapshots, rack_nodes)))
    return [draw(kind(node_id)) for node_id in ids]


requests = st.builds(
    PlacementRequest,
    model=st.sampled_from(MODELS),
    engine=st.sampled_from(ENGINES),
    gpus=st.one_of(st.integers(0, 2), st.integers(0, 9)),
    min_memory_gb=st.none() | st.integers(0, 64) | st.floats(0, 4096, allow_nan=False),
    node_selector=st.one_of(st.just({}), LABELS),
    ranks=st.one_of(st.just(1), st.integers(1, 4)),
    min_gpu_free_bytes=st.none() | st.integers(0, 100 * GB),
    engine_version=st.none() | st.sampled_from(VERSIONS),
)
holds = st.frozensets(st.text("abcdefgh0123456789-", min_size=1, max_size=6), max_size=4)


def check_placement(request: PlacementRequest, nodes: list[NodeSnapshot], result: Placement) -> None:
    by_id = {node.id: node for node in nodes}
    placed = [by_id[rank.node_id] for rank in result.ranks]
    assert len(result.ranks) == request.ranks
    assert len({n.id for n in placed}) == request.ranks, "two ranks on one node"
    for node, rank in zip(placed, result.ranks):
        for step in (filters.ready, filters.labels, filters.engine, filters.memory, filters.gpus):
            assert step.check(request, node) is None, f"{step.__name__} refused {node.id}"
        assert len(rank.gpus) == len(set(rank.gpus)) == request.gpus, "a GPU given twice"
        assert not set(rank.gpus) & node.gpus_in_use, "a GPU in use given again"
        assert set(rank.gpus) <= {g.index for g in node.gpus or ()}, "a GPU nobody reported"
    if request.ranks > 1:
        assert all(result.fabric in node.fabrics for node in placed), "ranks across fabrics"
    kept, reasons = filters.run(request, nodes)
    assert not {n.id for n in placed} & set(reasons)


@settings(max_examples=300, deadline=None)
@given(requests, fleets(), holds)
def test_placement_never_overrides_a_filter_nor_gives_a_gpu_twice(request, nodes, held):
    result = place(request, nodes, held)
    if isinstance(result, Placement):
        check_placement(request, nodes, result)
    else:
        assert isinstance(result, Unplaceable)
        # Every node is accounted for, in a sentence that follows its id.
        assert set(result.reasons) == {n.id for n in nodes}
        assert all(isinstance(why, str) and why for why in result.reasons.values())
        assert result.summary().startswith("no node can hold it: ")


@settings(max_examples=150, deadline=None)
@given(requests, fleets(), holds, st.randoms(use_true_random=False))
def test_placement_does_not_depend_on_the_order_of_the_fleet(request, nodes, held, rng: random.Random):
    shuffled = nodes[:]
    rng.shuffle(shuffled)
    assert place(request, shuffled, held) == place(request, nodes, held)


@settings(max_examples=150, deadline=None)
@given(requests, fleets(), st.integers(1, 6))
def test_placing_replica_after_replica_never_gives_a_gpu_twice(request, nodes, count):
    given_out: dict[str, set[int]] = {}
    for _ in range(count):
        result = place(request, nodes)
        if isinstance(result, Unplaceable):
            break
        check_placement(request, nodes, result)
        for rank in result.ranks:
            mine = given_out.setdefault(rank.node_id, set())
            assert not mine & set(rank.gpus)
            mine.update(rank.gpus)
        nodes = result.apply_to(nodes, request.model)


@settings(max_examples=150, deadline=None)
@given(requests, fleets())
def test_a_node_is_refused_only_when_a_filter_says_why(request, nodes):
    kept, reasons = filters.run(request, nodes)
    assert sorted([n.id for n in kept] + list(reasons)) == sorted(n.id for n in nodes)
    result = place(request, nodes)
    assert isinstance(result, Placement) == bool(kept)



@st.composite
def cpu_nodes(draw, node_id: str):
    """A CPU node that could take anything but for its memory, some of it already reserved."""
    held = draw(st.lists(st.integers(0, 64 * GB), max_size=3))
    return NodeSnapshot(
        id=node_id,
        engines=list(ENGINES),
        memory_total_bytes=draw(st.none() | st.integers(0, 128 * GB)),
        reserved=[Reservation(f"held{i}/0", b) for i, b in enumerate(held)],
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(("c1", "c2", "c3")), min_size=1, max_size=3, unique=True).flatmap(
    lambda ids: st.tuples(*(cpu_nodes(i) for i in ids))), st.integers(0, 64) | st.floats(0, 64),
    st.integers(1, 4), st.sampled_from(ENGINES), st.integers(1, 8))
def test_placing_replica_after_replica_never_reserves_more_memory_than_is_left(nodes, need_gb, ranks, engine,
                                                                                count):
    nodes = [attrs.evolve(n, fabrics={"ib-a"}) for n in nodes]
    request = PlacementRequest("m", engine, min_memory_gb=need_gb, ranks=ranks)
    for index in range(count):
        before = {n.id: n for n in nodes}
        result = place(request, nodes)
        if isinstance(result, Unplaceable):
            assert all(why for why in result.reasons.values())
            break
        nodes = result.apply_to(nodes, "m", f"m/{index}")
        for rank in result.ranks:
            was = before[rank.node_id]
            now = {n.id: n for n in nodes}[rank.node_id]
            assert now.memory_reserved_bytes() - was.memory_reserved_bytes() == request.memory_bytes()
            if was.memory_total_bytes is not None:
                # Never past its total; and onto a node already past it, only what reserves nothing.
                limit = max(was.memory_total_bytes, was.memory_reserved_bytes())
                assert now.memory_reserved_bytes() <= limit, "over-committed"
