"""Where a replica lands among nodes that could all take it, and which GPUs it is given."""

from __future__ import annotations

import random

import attrs

from llmgw.config.catalog import Profile
from llmgw.control import placement_scorers as scorers
from llmgw.control.placement import (
    NodeSnapshot,
    Placement,
    RankPlacement,
    PlacementRequest,
    Unplaceable,
    place,
)
from llmgw.records import EngineInfo, GPU, IBAdapter, Inventory

from .machines import fleet, inventory, node

ONE_GPU = PlacementRequest("qwen-7b", "llama.cpp", gpus=1)
GEMMA = PlacementRequest("gemma-3-270m", "llama.cpp", min_memory_gb=2)


def where(result) -> list[str]:
    assert isinstance(result, Placement), result.summary()
    return [r.node_id for r in result.ranks]


def place_replicas(request: PlacementRequest, nodes: list[NodeSnapshot], count: int, holds=frozenset()):
    """What the reconciler does for a model with *count* replicas: place, apply, again."""
    placements = []
    for index in range(count):
        result = place(request, nodes, holds)
        assert isinstance(result, Placement), result.summary()
        placements.append(result)
        nodes = result.apply_to(nodes, request.model, f"{request.model}/{index}")
    return placements, nodes


# -- spread --


def test_two_replicas_over_two_equal_nodes_land_on_different_nodes():
    nodes = [node("cpu-box"), node("cpu-box", node_id="cpu02")]
    placements, _ = place_replicas(GEMMA, nodes, 2)
    assert sorted(where(p)[0] for p in placements) == ["cpu01", "cpu02"]


def test_spread_outweighs_packing():
    # Packing alone would put the second one-GPU replica on gpu01 again, which
    # would then have 6 GPUs left rather than 7; a second node is worth more.
    placements, _ = place_replicas(ONE_GPU, [node("h100x8-ib-a-1"), node("h100x8-ib-a-2")], 2)
    assert [where(p) for p in placements] == [["gpu01"], ["gpu02"]]


def test_replicas_of_other_models_do_not_count_against_a_node():
    busy = node("cpu-box", replicas={"llama-70b": 3})
    spare = node("cpu-box", node_id="cpu02", replicas={"gemma-3-270m": 1})
    assert where(place(GEMMA, [busy, spare])) == ["cpu01"]


def test_more_replicas_than_nodes_go_round_evenly():
    nodes = [node("cpu-box", node_id=f"cpu0{i}") for i in (1, 2, 3)]
    _, after = place_replicas(GEMMA, nodes, 7)
    assert sorted(n.replicas["gemma-3-270m"] for n in after) == [2, 2, 3]


# -- packing --


def test_a_one_gpu_model_takes_the_node_with_one_free_gpu_not_a_whole_node():
    nearly_full = node("h100x8-ib-a-1", gpus_in_use={0, 1, 2, 3, 4, 5, 6})
    whole = node("h100x8-ib-a-2")
    result = place(ONE_GPU, [whole, nearly_full])
    assert result.ranks == [RankPlacement("gpu01", [7])]


def test_after_packing_the_whole_node_is_still_there_for_an_eight_gpu_model():
    nodes = [node("h100x8-ib-a-1", gpus_in_use={0, 1, 2, 3, 4, 5, 6}), node("h100x8-ib-a-2")]
    first = place(ONE_GPU, nodes)
    nodes = first.apply_to(nodes, ONE_GPU.model)
    big = place(PlacementRequest("llama-70b", "vllm", gpus=8), nodes)
    assert big.ranks == [RankPlacement("gpu02", list(range(8)))]


def test_the_workstation_card_is_a_best_fit_for_a_one_gpu_model():
    assert where(place(ONE_GPU, fleet())) == ["ws01"]


def test_packing_does_not_steer_a_cpu_model():
    # Both score the same for a CPU request; the node id decides.
    assert where(place(GEMMA, [node("h100x8-ib-a-1"), node("cpu-box")])) == ["cpu01"]


# -- GPUs handed out --


def test_gpus_in_use_are_not_handed_out_again():
    h100 = node("h100x8-ib-a-1", gpus_in_use={0, 2, 3})
    result = place(PlacementRequest("m", "vllm", gpus=2), [h100])
    assert result.ranks == [RankPlacement("gpu01", [1, 4])]


def test_filling_a_node_one_replica_at_a_time_never_gives_a_gpu_twice():
    request = PlacementRequest("m", "vllm", gpus=3)
    placements, after = place_replicas(request, [node("h100x8-ib-a-1")], 2)
    assert [p.ranks[0].gpus for p in placements] == [[0, 1, 2], [3, 4, 5]]
    assert after[0].gpus_in_use == {0, 1, 2, 3, 4, 5}
    assert after[0].replicas == {"m": 2}
    third = place(request, after)
    assert isinstance(third, Unplaceable)
    assert third.lines() == ["gpu01: has 2 free GPUs, needs 3; m/0 and m/1 hold 6 of 8"]


# -- multi-rank and fabrics --


def test_a_two_rank_replica_stays_within_one_fabric():
    request = PlacementRequest("llama-405b", "vllm", gpus=8, ranks=2)
    result = place(request, fleet())
    assert result.fabric == "ib-a"
    assert result.ranks == [RankPlacement("gpu01", list(range(8))), RankPlacement("gpu02", list(range(8)))]


def test_ranks_go_to_the_fabric_that_can_take_them_all():
    # ib-a has gpu01 and gpu02, but gpu01 is busy; ib-b alone cannot take two.
    # With a second node on ib-b, the replica goes there instead.
    request = PlacementRequest("llama-405b", "vllm", gpus=8, ranks=2)
    nodes = [
        node("h100x8-ib-a-1", gpus_in_use={0}),
        node("h100x8-ib-a-2"),
        node("h100x8-ib-b-1"),
        node("h100x8-ib-b-1", node_id="gpu04"),
    ]
    result = place(request, nodes)
    assert (result.fabric, where(result)) == ("ib-b", ["gpu03", "gpu04"])


def test_a_replica_is_not_split_across_fabrics():
    request = PlacementRequest("llama-405b", "vllm", gpus=8, ranks=2)
    result = place(request, [node("h100x8-ib-a-1"), node("h100x8-ib-b-1"), node("vm-8gb")])
    assert isinstance(result, Unplaceable)
    assert result.lines() == [
        "gpu01: is on ib-a, where only 1 node can take a rank and a 2-rank replica needs 2",
        "gpu03: is on ib-b, where only 1 node can take a rank and a 2-rank replica needs 2",
        "node05: has no vllm engine",
    ]


def test_ranks_are_on_distinct_nodes():
    request = PlacementRequest("m", "vllm", gpus=2, ranks=2)
    result = place(request, [node("h100x8-ib-a-1"), node("h100x8-ib-b-1")])
    assert isinstance(result, Unplaceable)  # gpu01 has GPUs for both ranks, but is one node


def test_the_fabric_whose_nodes_score_better_wins():
    # ib-a's nodes already run a replica of this model; ib-b's do not.
    request = PlacementRequest("m", "vllm", gpus=1, ranks=2)
    nodes = [
        node("h100x8-ib-a-1", replicas={"m": 1}),
        node("h100x8-ib-a-2", replicas={"m": 1}),
        node("h100x8-ib-b-1"),
        node("h100x8-ib-b-1", node_id="gpu04"),
    ]
    assert where(place(request, nodes)) == ["gpu03", "gpu04"]


def test_a_node_on_two_fabrics_can_join_either():
    both = attrs.evolve(node("h100x8-ib-a-1", node_id="gpu00"), fabrics={"ib-a", "ib-b"})
    request = PlacementRequest("m", "vllm", gpus=8, ranks=2)
    result = place(request, [both, node("h100x8-ib-b-1")])
    assert (result.fabric, where(result)) == ("ib-b", ["gpu00", "gpu03"])


# -- the weights hook --


def test_holds_has_no_effect_until_told_which_nodes_hold_the_weights():
    nodes = [node("cpu-box"), node("cpu-box", node_id="cpu02")]
    assert where(place(GEMMA, nodes)) == ["cpu01"]
    assert where(place(GEMMA, nodes, holds=frozenset({"cpu02"}))) == ["cpu02"]


def test_holding_the_weights_does_not_beat_spreading_replicas():
    holder = node("cpu-box", replicas={"gemma-3-270m": 1})
    other = node("cpu-box", node_id="cpu02")
    assert where(place(GEMMA, [holder, other], holds=frozenset({"cpu01"}))) == ["cpu02"]


def test_holding_the_weights_beats_packing():
    nearly_full = node("h100x8-ib-a-1", gpus_in_use={0, 1, 2, 3, 4, 5, 6})
    holder = node("h100x8-ib-a-2")
    assert where(place(ONE_GPU, [nearly_full, holder], holds=frozenset({"gpu02"}))) == ["gpu02"]


def test_scores_say_what_each_scorer_added():
    h100 = node("h100x8-ib-a-1", replicas={"qwen-7b": 2}, gpus_in_use={0, 1, 2, 3, 4, 5})
    assert scorers.scores(ONE_GPU, h100, frozenset({"gpu01"})) == {
        "spread": -200.0,
        "holds the weights": 10.0,
        "pack GPUs": 0.5,
    }


# -- determinism --


def test_the_same_fleet_in_any_order_gives_the_same_answer():
    nodes = fleet() + [node("cpu-box", node_id="cpu02"), node("h100x8-ib-a-1", node_id="gpu00")]
    requests = [
        GEMMA,
        ONE_GPU,
        PlacementRequest("m", "vllm", gpus=8, ranks=2),
        PlacementRequest("qwen2.5-coder-14b", "llama.cpp", min_memory_gb=24),
        PlacementRequest("x", "sglang"),
    ]
    rng = random.Random(5)
    for request in requests:
        first = place(request, nodes)
        for _ in range(20):
            shuffled = nodes[:]
            rng.shuffle(shuffled)
            assert place(request, shuffled) == first


def test_equal_nodes_are_chosen_by_node_id():
    nodes = [node("cpu-box", node_id=name) for name in ("node09", "node03", "node07")]
    assert where(place(GEMMA, nodes)) == ["node03"]


# -- building the inputs --


def test_a_request_is_what_the_profile_asks_of_a_node():
    profile = Profile(
        "llama-70b", engine="vllm", args=("--tensor-parallel-size", "8"), gpus=8,
        min_memory_gb=256, node_selector={"gpu": "h100"}, ranks=2,
    )
    assert PlacementRequest.from_profile("llama-3.1-70b", profile) == PlacementRequest(
        model="llama-3.1-70b", engine="vllm", gpus=8, min_memory_gb=256,
        node_selector={"gpu": "h100"}, ranks=2, min_gpu_free_bytes=None,
    )
    assert PlacementRequest.from_profile("llama-3.1-70b", profile, "0.11.0").engine_version == "0.11.0"


def test_a_snapshot_is_what_the_node_reported():
    snap = NodeSnapshot.from_inventory(
        "gpu01", "ready", False, inventory("h100x8-ib-a-1"),
        gpus_in_use=frozenset({3}), replicas={"m": 1},
    )
    assert ([e.name for e in snap.engines], snap.fabrics, snap.gpus_in_use, snap.replicas) == (
        ["llama.cpp", "vllm"], {"ib-a"}, {3}, {"m": 1},
    )
    assert snap.engines == inventory("h100x8-ib-a-1").engines  # every entry, with its state and reason
    assert snap.labels == {"gpu": "h100"} and len(snap.gpus) == 8
    assert snap.memory_total_bytes is None  # the recording has no meminfo


def test_an_old_agent_reads_as_unknown_not_as_empty():
    snap = NodeSnapshot.from_inventory("node05", "ready", False, Inventory(node_id="node05"))
    assert (snap.engines, snap.gpus, snap.memory_total_bytes, snap.fabrics) == (None, None, None, set())


def test_only_adapters_with_a_fabric_put_a_node_on_one():
    inv = Inventory(
        node_id="n",
        infiniband=[IBAdapter("mlx5_0", fabric="ib-a"), IBAdapter("mlx5_1"), IBAdapter("mlx5_2", fabric="ib-a")],
        engines=[EngineInfo("sim")],
        gpus=[GPU(0)],
    )
    snap = NodeSnapshot.from_inventory("n", "ready", False, inv)
    assert snap.fabrics == {"ib-a"} and snap.engines == [EngineInfo("sim")]


def test_apply_to_leaves_other_nodes_alone():
    nodes = [node("cpu-box"), node("vm-8gb")]
    after = Placement([RankPlacement("cpu01", [])]).apply_to(nodes, "gemma")
    assert after[1] is nodes[1]
    assert after[0].replicas == {"gemma": 1}


def test_an_empty_fleet_is_unplaceable_and_says_so():
    result = place(GEMMA, [])
    assert isinstance(result, Unplaceable)
    assert result.summary() == "no node can hold it: there are no nodes"
