"""The routers' endpoint table comes from what the nodes report, not from what ctl displays."""

from __future__ import annotations

import attrs
from twisted.internet.task import Clock

from llmgw.control.fleet import Fleet
from llmgw.control.routing import endpoint_table
from llmgw.records import Inventory, ShardSpec, ShardStatus
from llmgw.states import ReplicaState
from llmgw.views import EndpointEntry, ReplicaView


def status(replica_id, rank, state, port=None, ranks=1):
    spec = ShardSpec(shard_id=f"{replica_id}/{rank}", replica_id=replica_id, model=replica_id.rpartition("/")[0],
                     engine="sim", rank=rank, ranks=ranks)
    return ShardStatus(spec, state, endpoint=f"http://10.0.0.1:{port}" if port else None, since=0.0)


def fleet_with(*shards, node="node01"):
    fleet = Fleet(Clock(), lambda *a: None, unreachable_after=15, lost_after=120)
    fleet.register(node, 1, Inventory(node_id=node, address="10.0.0.1", shards=list(shards)))
    return fleet


def test_ready_replicas_of_catalog_models_are_routed_to_at_rank_0s_endpoint():
    fleet = fleet_with(status("echo/0", 0, "ready", 4001), status("echo/1", 0, "starting", 4002),
                       status("big/0", 0, "ready", 4003, ranks=2), status("big/0", 1, "ready", 4004, ranks=2),
                       status("gone/0", 0, "ready", 4005))
    table = endpoint_table(fleet, {"echo": 2, "big": 1}, lambda models: [])
    assert table.endpoints == [EndpointEntry("big/0", "big", "http://10.0.0.1:4003", "node01"),
                               EndpointEntry("echo/0", "echo", "http://10.0.0.1:4001", "node01")]


def test_a_replica_with_a_rank_not_ready_or_on_a_lost_node_is_not_routed_to():
    fleet = fleet_with(status("big/0", 0, "ready", 4003, ranks=2), status("big/0", 1, "starting", ranks=2))
    assert endpoint_table(fleet, {"big": 1}, lambda models: []).endpoints == []
    fleet = fleet_with(status("echo/0", 0, "ready", 4001))
    fleet._clock.advance(121)
    fleet.check()
    assert endpoint_table(fleet, {"echo": 1}, lambda models: []).endpoints == []


def test_a_multi_node_replica_missing_a_rank_is_not_routed_to_though_the_ranks_it_has_are_ready():
    # Rank 1's node lost and forgotten: rank 0 alone still says ready.
    fleet = fleet_with(status("big/0", 0, "ready", 4003, ranks=2))
    assert endpoint_table(fleet, {"big": 1}, lambda models: []).endpoints == []
    two = Fleet(Clock(), lambda *a: None, unreachable_after=15, lost_after=120)
    two.register("node01", 1, Inventory(node_id="node01", address="10.0.0.1",
                                        shards=[status("big/0", 0, "ready", 4003, ranks=2)]))
    two.register("node02", 2, Inventory(node_id="node02", address="10.0.0.2", shards=[status("big/0", 1, "ready", ranks=2)]))
    assert [e.id for e in endpoint_table(two, {"big": 1}, lambda models: []).endpoints] == ["big/0"]


def test_what_ctl_displays_does_not_move_traffic():
    fleet = fleet_with(status("echo/0", 0, "ready", 4001), status("echo/1", 0, "fetching"))
    views = [ReplicaView("echo", "echo/0", ReplicaState.READY, ["node01"], "http://10.0.0.1:4001", age_s=5.0),
             ReplicaView("echo", "echo/1", ReplicaState.FETCHING, ["node01"], reason="node01: fetching x")]
    before = endpoint_table(fleet, {"echo": 2}, lambda models: views)
    reworded = [attrs.evolve(v, reason="in other words", age_s=9999.0, endpoint=None, nodes=[],
                             state=ReplicaState.PENDING) for v in views]
    after = endpoint_table(fleet, {"echo": 2}, lambda models: reworded)
    assert after.endpoints == before.endpoints == [EndpointEntry("echo/0", "echo", "http://10.0.0.1:4001", "node01")]


def test_models_without_an_endpoint_say_why_in_the_views_words():
    fleet = fleet_with(status("qwen/0", 0, "fetching"))
    views = [ReplicaView("qwen", "qwen/0", ReplicaState.FETCHING, ["node01"], reason="node01: downloading q.gguf"),
             ReplicaView("tiny", "tiny/0", ReplicaState.STARTING)]
    asked = []

    def views_of(models):
        asked.append(set(models))
        return [v for v in views if v.model in models]

    assert endpoint_table(fleet, {"qwen": 1, "tiny": 1, "none": 0}, views_of).unavailable == {
        "qwen": "node01: downloading q.gguf",
        "tiny": "its replica is starting",
        "none": "the catalog asks for no replicas of it",
    }
    assert asked == [{"qwen", "tiny", "none"}]


def test_the_table_lists_endpoints_in_ctl_replicas_order_and_reasons_in_the_catalogs():
    # Sorting by id would put a/10 and a/11 before a/2: the payload routers and
    # older subscribers receive would change although the traffic does not.
    fleet = fleet_with(*[status(f"a/{i}", 0, "ready", 4000 + i) for i in range(12)])
    table = endpoint_table(fleet, {"zeta": 1, "a": 12, "beta": 1}, lambda models: [])
    assert [e.id for e in table.endpoints] == [f"a/{i}" for i in range(12)]
    assert list(table.unavailable) == ["zeta", "beta"]
    # Scaled down to ten: the two past the catalog's count still serve, listed after the slots it asks for.
    fleet = fleet_with(*[status(f"{m}/{i}", 0, "ready", 4000 + i) for m in ("a", "b") for i in range(12)])
    table = endpoint_table(fleet, {"b": 10, "a": 12}, lambda models: [])
    assert [e.id for e in table.endpoints] == [*(f"a/{i}" for i in range(12)), *(f"b/{i}" for i in range(10)),
                                               "b/10", "b/11"]


def test_a_fleet_whose_every_model_is_served_makes_no_replica_view_for_the_table():
    """The table is made every second; views are made only for the reasons of models without an endpoint."""
    fleet = fleet_with(status("echo/0", 0, "ready", 4001), status("big/0", 0, "ready", 4003))

    def views_of(models):
        raise AssertionError(f"views made for {models}")

    table = endpoint_table(fleet, {"echo": 1, "big": 1}, views_of)
    assert [e.id for e in table.endpoints] == ["big/0", "echo/0"] and table.unavailable == {}
