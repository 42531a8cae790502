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
