"""The room made for a replica is its own: another model waiting beside it does not take it (Elastic.room_first)."""

from __future__ import annotations

from llmgw.control.slot import SlotState
from tests.control.test_elastic import Fleet, elastic


def test_the_room_made_for_a_replica_goes_to_it_not_to_a_model_before_it_in_the_catalog():
    world = Fleet()
    world.node("node01", gpus=1)
    world.serve(elastic("a", idle_s=10_000), elastic("b", idle_s=10_000), elastic("z", idle_s=10_000))
    world.traffic("a", held=1)
    world.tick_for(1)
    world.ready("a/0")
    world.traffic("a")
    world.tick_for(60)
    world.traffic("z", held=1)
    world.tick_for(1)
    assert world.state("a/0") is SlotState.DRAINING  # stopped to make room for z/0
    world.traffic("b", held=1)  # b comes first in the catalog, and waits too
    world.tick_for(1)
    world.report("a/0/0", "stopped")
    world.tick_for(1)
    started = [shard for _, shard in world.started()]
    assert "z/0/0" in started and "b/0/0" not in started, started
