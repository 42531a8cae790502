"""What running shards hold, as placement sees the nodes."""

from llmgw.control import occupancy, placement
from tests.control.test_reconciler import World, entry


def test_a_running_cpu_shard_reserves_its_profiles_memory_and_counts_once():
    world = World()
    world.node("node01")
    world.serve(entry(min_memory_gb=4))
    world.tick_for(1)
    (node,) = occupancy.fleet_snapshots(world.fleet, world.catalog)
    assert node.memory_reserved_bytes() == placement.memory_reservation(0, 4)
    assert node.replicas == {"echo": 1}


def test_a_shard_whose_model_left_the_catalog_reserves_no_memory():
    world = World()
    world.node("node01")
    world.serve(entry(min_memory_gb=4))
    world.tick_for(1)
    (node,) = occupancy.fleet_snapshots(world.fleet, {})
    assert node.memory_reserved_bytes() == 0 and node.replicas == {"echo": 1}


def test_a_stopped_shard_holds_nothing():
    world = World()
    world.node("node01")
    world.serve(entry(min_memory_gb=4))
    world.tick_for(1)
    world.report("echo/0/0", "failed", reason="exited with status 1")
    (node,) = occupancy.fleet_snapshots(world.fleet, world.catalog)
    assert node.reserved == () and world.shard("echo/0/0").status.state == "failed"


def test_what_a_placement_holds_is_said_without_repeating_the_node():
    one = placement.Placement([placement.RankPlacement("node01", [0, 1])], memory_bytes=8_000_000_000)
    assert occupancy.placed_words(one) == "GPU 0, 1; 8.0 GB reserved"
    cpu = placement.Placement([placement.RankPlacement("node01", [])])
    assert occupancy.placed_words(cpu) == "no GPU"
    two = placement.Placement([placement.RankPlacement("a", [0]), placement.RankPlacement("b", [0])])
    assert occupancy.placed_words(two) == "rank 0 on a (GPU 0); rank 1 on b (GPU 0)"
