"""Placement never over-commits a node: each replica reserves what its profile needs there.

Host memory for a CPU profile, against the node's total less what the
replicas already placed there reserve; whole GPUs, each with the free memory
``min_gpu_free_gb`` asks for, for a GPU profile.  A refusal names the
replicas holding the rest, in the node's terms.
"""

from __future__ import annotations

import attrs
import pytest

from llmgw.config.catalog import Profile
from llmgw.config.server import load_server_config
from llmgw.control.placement import (
    NodeSnapshot,
    Placement,
    PlacementRequest,
    RankPlacement,
    Reservation,
    Unplaceable,
    place,
)
from llmgw.errors import ConfigError
from llmgw.records import GPU, Heartbeat, ShardStatus

from ..control.test_reconciler import World, entry
from .machines import node

GB = 1_000_000_000
QWEN = PlacementRequest("qwen", "llama.cpp", min_memory_gb=24)


def box(node_id="node05", memory_gb=32, **kw) -> NodeSnapshot:
    return NodeSnapshot(node_id, memory_total_bytes=int(memory_gb * GB), engines=["llama.cpp", "vllm"], **kw)


def refused(result) -> list[str]:
    assert isinstance(result, Unplaceable), result
    return result.lines()


def fill(request: PlacementRequest, nodes, models):
    """Place one replica of each model in *models* in turn, as one reconciler pass does; return the refusals."""
    refusals = {}
    for model in models:
        mine = attrs.evolve(request, model=model)
        result = place(mine, nodes)
        if isinstance(result, Placement):
            nodes = result.apply_to(nodes, model, f"{model}/0")
        else:
            refusals[model] = result.lines()
    return nodes, refusals


# -- host memory, CPU profiles --


def test_three_24_gb_models_do_not_all_go_on_one_32_gb_node():
    nodes, refusals = fill(QWEN, [box()], ["echo", "gemma", "qwen"])
    assert nodes[0].replicas == {"echo": 1}
    assert refusals == {
        "gemma": ["node05: 8 GB of 32 left after echo/0, needs 24"],
        "qwen": ["node05: 8 GB of 32 left after echo/0, needs 24"],
    }


def test_the_refusal_names_every_replica_holding_the_memory():
    held = box(reserved=[Reservation("qwen/1", 16 * GB), Reservation("echo/0", 8 * GB), Reservation("tiny/0")])
    assert refused(place(QWEN, [held])) == ["node05: 8 GB of 32 left after echo/0 and qwen/1, needs 24"]


def test_a_node_holding_hundreds_of_replicas_names_a_few_and_counts_the_rest():
    held = box(reserved=[Reservation(f"m{i}/0", GB) for i in range(30)])
    assert refused(place(QWEN, [held])) == [
        "node05: 2 GB of 32 left after m0/0, m1/0, m10/0, m11/0 and 26 more, needs 24"
    ]


def test_what_is_left_never_reads_as_enough_nor_below_zero():
    nearly = box(reserved=[Reservation("echo/0", 8_100_000_000)])
    assert refused(place(QWEN, [nearly])) == ["node05: 23.9 GB of 32 left after echo/0, needs 24"]
    # More reserved than the node has (it was replaced by a smaller one, or a profile grew).
    over = box(reserved=[Reservation("echo/0", 40 * GB)])
    assert refused(place(QWEN, [over])) == ["node05: 0 GB of 32 left after echo/0, needs 24"]


def test_exactly_what_is_left_is_enough():
    assert isinstance(place(QWEN, [box(memory_gb=48, reserved=[Reservation("echo/0", 24 * GB)])]), Placement)


def test_a_node_too_small_in_all_is_refused_for_that_not_for_what_is_reserved():
    small = box(memory_gb=16, reserved=[Reservation("echo/0", 8 * GB)])
    assert refused(place(QWEN, [small])) == ["node05: has 16 GB of memory, needs 24"]


def test_a_profile_without_min_memory_gb_reserves_nothing_and_is_never_refused_for_memory():
    # Absent is not zero: no need stated is no reservation, not a reservation of 0 that fails.
    unstated = attrs.evolve(QWEN, min_memory_gb=None)
    nodes, refusals = fill(unstated, [box()], ["a", "b", "c"])
    assert refusals == {} and nodes[0].memory_reserved_bytes() == 0
    assert isinstance(place(QWEN, nodes), Placement)
    full = place(QWEN, place(QWEN, nodes).apply_to(nodes, "qwen", "qwen/0"))
    assert refused(full) == ["node05: 8 GB of 32 left after qwen/0, needs 24"]  # a, b, c hold nothing


def test_a_node_that_did_not_report_its_memory_is_not_refused_for_what_is_reserved():
    unknown = NodeSnapshot("cpu01", engines=["llama.cpp"], reserved=[Reservation("echo/0", 400 * GB)])
    assert isinstance(place(QWEN, [unknown]), Placement)


def test_the_second_24_gb_model_goes_to_the_node_with_room():
    nodes, refusals = fill(QWEN, [box("node01"), box("node02")], ["echo", "gemma", "qwen"])
    assert [n.replicas for n in nodes] == [{"echo": 1}, {"gemma": 1}]
    assert refusals == {"qwen": [
        "node01: 8 GB of 32 left after echo/0, needs 24",
        "node02: 8 GB of 32 left after gemma/0, needs 24",
    ]}


def test_every_rank_of_a_replica_reserves_its_memory_on_its_own_node():
    request = PlacementRequest("big", "vllm", min_memory_gb=24, ranks=2)
    nodes = [box("node01", fabrics={"ib-a"}), box("node02", fabrics={"ib-a"})]
    first = place(request, nodes)
    assert [r.node_id for r in first.ranks] == ["node01", "node02"]
    after = first.apply_to(nodes, "big", "big/0")
    assert refused(place(attrs.evolve(request, model="huge"), after)) == [
        "node01: 8 GB of 32 left after big/0, needs 24",
        "node02: 8 GB of 32 left after big/0, needs 24",
    ]


def test_a_gpu_profile_reserves_its_gpus_and_not_host_memory():
    # Its weights live in the GPUs' memory; min_memory_gb stays a check of the machine's total.
    request = PlacementRequest("m", "vllm", gpus=1, min_memory_gb=24)
    gpu_box = box(gpus=[GPU(0), GPU(1)])
    nodes, refusals = fill(request, [gpu_box], ["a", "b"])
    assert refusals == {} and nodes[0].gpus_in_use == {0, 1} and nodes[0].memory_reserved_bytes() == 0


# -- GPU memory, on the recorded 8x H100 --


H100_FREE = 85_520_809_984 - 475_004_928  # each card's total less what nvidia-smi saw in use: 85.05 GB


SERVER_YAML = """\
listen: {link: "ssl:7443"}
tls: {ca: ca.crt, cert: server.crt, key: server.key}
profiles:
  llama-70b: {engine: vllm, gpus: 4, min_gpu_free_gb: %s}
"""


def server_yaml(folder, min_gpu_free_gb: str):
    for name in ("ca.crt", "server.crt", "server.key"):
        (folder / name).write_text("")
    path = folder / "server.yaml"
    path.write_text(SERVER_YAML % min_gpu_free_gb)
    return path


def test_min_gpu_free_gb_is_read_from_server_yaml_into_the_request(tmp_path):
    profile = load_server_config(server_yaml(tmp_path, "80")).profiles["llama-70b"]
    assert profile.min_gpu_free_gb == 80
    assert PlacementRequest.from_profile("llama-3.1-70b", profile).min_gpu_free_bytes == 80 * GB


def test_a_negative_min_gpu_free_gb_is_refused_where_it_is_written(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_server_config(server_yaml(tmp_path, "-1"))
    assert str(caught.value).endswith("server.yaml:4: profiles.llama-70b.min_gpu_free_gb: must be a number >= 0, got -1")


def test_gpu_memory_is_reserved_card_by_card_on_an_h100_node():
    request = PlacementRequest.from_profile("llama-70b", Profile("p", "vllm", gpus=4, min_gpu_free_gb=80))
    nodes, refusals = fill(request, [node("h100x8-ib-a-1")], ["a", "b", "c"])
    assert nodes[0].gpus_in_use == set(range(8))
    assert [r.gpus for r in nodes[0].reserved] == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert refusals == {"c": ["gpu01: has no free GPUs, needs 4; a/0 and b/0 hold 8 of 8"]}


def test_free_gpu_memory_is_a_filter_when_the_profile_declares_it():
    h100 = node("h100x8-ib-a-1")
    fits = PlacementRequest.from_profile("m", Profile("p", "vllm", gpus=8, min_gpu_free_gb=85))
    assert H100_FREE >= 85 * GB and place(fits, [h100]).ranks == [RankPlacement("gpu01", list(range(8)))]
    too_big = PlacementRequest.from_profile("m", Profile("p", "vllm", gpus=1, min_gpu_free_gb=86))
    assert refused(place(too_big, [h100])) == ["gpu01: has no free GPUs with 86 GB free, needs 1"]
    undeclared = PlacementRequest.from_profile("m", Profile("p", "vllm", gpus=1))
    assert undeclared.min_gpu_free_bytes is None and isinstance(place(undeclared, [h100]), Placement)


def test_a_card_something_else_fills_is_passed_over():
    h100 = node("h100x8-ib-a-1")
    cards = [attrs.evolve(g, memory_used_bytes=60 * GB) if g.index == 0 else g for g in h100.gpus]
    request = PlacementRequest.from_profile("m", Profile("p", "vllm", gpus=2, min_gpu_free_gb=40))
    assert place(request, [attrs.evolve(h100, gpus=cards)]).ranks == [RankPlacement("gpu01", [1, 2])]


# -- through the reconciler --


def test_the_reconciler_places_one_of_three_24_gb_models_on_a_32_gb_node_and_says_why_not_the_others():
    world = World()
    world.node("node01", memory_gb=32)
    world.serve(*(entry(name, min_memory_gb=24, profile="sim-24") for name in ("echo", "gemma", "qwen")))
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]
    why = "no node can hold it: node01: 8 GB of 32 left after echo/0, needs 24"
    assert [world.view(r)["reason"] for r in ("gemma/0", "qwen/0")] == [why, why]
    # The next pass reads the reservation from the shard the node reports, not from the pass before.
    world.report("echo/0/0", "ready")
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0")]
    assert world.view("qwen/0")["reason"] == why


def test_a_reservation_ends_with_its_replica():
    world = World()
    world.node("node01", memory_gb=32)
    world.serve(entry("echo", min_memory_gb=24), entry("qwen", min_memory_gb=24))
    world.reconciler.tick()
    world.report("echo/0/0", "failed", reason="exited with status 1")
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0"), ("node01", "qwen/0/0")]
    # echo/0's retry, a second later, finds the memory qwen/0 now holds.
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started()[2:] == []
    assert world.reconciler.slots["echo/0"].reason == (
        "no node can hold it: node01: 8 GB of 32 left after qwen/0, needs 24"
    )


def test_a_shard_its_node_reports_before_its_start_is_answered_is_counted_once():
    world = World()
    world.node("node01", memory_gb=32)
    world.held = []
    world.serve(entry("echo", min_memory_gb=24))
    world.reconciler.tick()
    ((node_id, spec),) = world.starts
    world.fleet.shard_status(node_id, ShardStatus(spec, "starting", pid=4242))  # the agent's news came first
    world.serve(entry("echo", min_memory_gb=24), entry("tiny", min_memory_gb=8))
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0"), ("node01", "tiny/0/0")]
    world.serve(entry("echo", min_memory_gb=24), entry("tiny", min_memory_gb=8), entry("more", min_memory_gb=1))
    world.reconciler.tick()
    assert world.reconciler.slots["more/0"].reason == (
        "no node can hold it: node01: 0 GB of 32 left after echo/0 and tiny/0, needs 1"
    )


def test_reported_available_memory_is_not_subtracted_again():
    # node01 says 2 GB are available: echo/0's engine holds most of the rest.
    # Against that, and echo/0's reservation again, nothing would fit; against
    # its total less echo/0's 8 GB, a 24 GB model does.
    world = World()
    world.node("node01", memory_gb=32)
    world.serve(entry("echo", min_memory_gb=8))
    world.reconciler.tick()
    world.report("echo/0/0", "ready")
    world.fleet.heartbeat("node01", world.sessions["node01"], Heartbeat(memory_available_bytes=2 * GB))
    world.serve(entry("echo", min_memory_gb=8), entry("qwen", min_memory_gb=24))
    world.reconciler.tick()
    assert world.started() == [("node01", "echo/0/0"), ("node01", "qwen/0/0")]


def test_the_reconciler_passes_over_a_card_something_else_fills():
    world = World()
    world.node("node01", gpus=2)
    cards = [GPU(0, memory_total_bytes=80 * GB, memory_used_bytes=70 * GB), GPU(1, memory_total_bytes=80 * GB,
                                                                                 memory_used_bytes=GB)]
    world.fleet.heartbeat("node01", world.sessions["node01"], Heartbeat(gpus=cards))
    one_gpu = entry("qwen", gpus=1)
    world.serve(attrs.evolve(one_gpu, profile=attrs.evolve(one_gpu.profile, min_gpu_free_gb=40)))
    world.reconciler.tick()
    assert [(node_id, spec.gpus) for node_id, spec in world.starts] == [("node01", [1])]
