"""Multi-node replicas in the reconciler: ordered startup, failing whole, adoption, scale-down, the bounded waits.

The world is test_reconciler's: a real Fleet, a test clock, fake commands to
agents.  Every node is on InfiniBand fabric ib0, so placement puts each rank
of a replica on its own node, lowest node id first.
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer, reactor

from llmgw.control.claims import ClaimRefused, Why
from llmgw.control.reconciler import RESTOP_AFTER_S
from llmgw.link import uris
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR
from llmgw.wire import from_wire, to_wire
from llmgw.records import IBAdapter, IBPort, ShardSpec, ShardStatus
from llmgw.states import NodeState
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.control.test_reconciler import World, entry, inventory

FABRIC = [IBAdapter("mlx5_0", ports=[IBPort(port=1, state="ACTIVE", rate_gbps=200.0)], fabric="ib0")]
TIMEOUT = 600.0  # ShardSpec.start_timeout_s's default


def multi(ranks=2, launcher=None, **kw):
    e = entry("big", engine="vllm", profile="big", source="/srv/models/big", **kw)
    return attrs.evolve(e, profile=attrs.evolve(e.profile, ranks=ranks, launcher=launcher))


def node(world, node_id, **kw):
    world.sessions[node_id] = world.sessions.get(node_id, 0) + 1
    inv = attrs.evolve(inventory(node_id, engines=("vllm",), **kw), infiniband=FABRIC)
    world.fleet.register(node_id, world.sessions[node_id], inv)


def rendezvous(world, replica="big/0", at=None):
    """Rank 0 says where the other ranks meet it: on its own node's address unless *at* says otherwise."""
    leader = world.shard(f"{replica}/0")
    address = world.fleet.nodes[leader.node_id].inventory.address
    world.report(f"{replica}/0", "starting", rendezvous=at or f"{address}:29500")


def all_ready(world, ranks, replica="big/0"):
    for rank in range(ranks):
        address = world.fleet.nodes[world.shard(f"{replica}/{rank}").node_id].inventory.address
        world.report(f"{replica}/{rank}", "ready", **({"endpoint": f"http://{address}:40001"} if rank == 0 else {}))


def whole(world, ranks, nodes):
    """A replica started in order and ready: rank 0 on nodes[0], rank r on nodes[r]."""
    for n in nodes:
        node(world, n)
    world.reconciler.tick()
    rendezvous(world)
    world.reconciler.tick()
    assert world.started() == [(n, f"big/0/{r}") for r, n in enumerate(nodes[:ranks])]
    all_ready(world, ranks)
    world.reconciler.tick()
    assert world.view("big/0")["state"] == "ready"


@pytest.fixture
def world():
    return World()


# -- ordered startup --


@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_0_starts_alone_and_the_others_only_once_it_reports_its_rendezvous(world, ranks):
    world.serve(multi(ranks, launcher="ray"))
    for n in ("node01", "node02", "node03"):
        node(world, n)
    world.reconciler.tick()
    ((node_id, spec),) = world.starts
    assert (node_id, spec.shard_id, spec.rank, spec.ranks, spec.leader, spec.launcher) == (
        "node01", "big/0/0", 0, ranks, None, "ray")
    # However long rank 0 takes to open its rendezvous, nothing else starts.
    world.report("big/0/0", "starting")
    for _ in range(5):
        world.clock.advance(10)
        world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")]
    view = world.view("big/0")
    assert view["state"] == "starting"
    assert [(s["rank"], s["node"], s["state"], s["started"], s["waiting"]) for s in view["shards"]] == [
        (0, "node01", "starting", True, "waiting for its rendezvous to accept connections"),
        *[(r, f"node0{r + 1}", None, False, "waiting for rank 0's rendezvous on node01") for r in range(1, ranks)],
    ]
    assert [s["age_s"] for s in view["shards"]] == [50.0] * ranks
    rendezvous(world)
    world.reconciler.tick()
    workers = world.starts[1:]
    assert [(n, s.rank, s.leader, s.launcher) for n, s in workers] == [
        (f"node0{r + 1}", r, "10.0.0.1:29500", "ray") for r in range(1, ranks)]
    # Started once: ticking on starts nothing twice.
    world.clock.advance(5)
    world.reconciler.tick()
    assert len(world.starts) == ranks
    # Ready only when every rank is: rank 0 first is still starting.
    world.report("big/0/0", "ready", endpoint="http://10.0.0.1:40001")
    world.reconciler.tick()
    view = world.view("big/0")
    assert (view["state"], view["endpoint"]) == ("starting", None)
    assert [s["waiting"] for s in view["shards"][1:]] == ["joining rank 0 at 10.0.0.1:29500"] * (ranks - 1)
    all_ready(world, ranks)
    world.reconciler.tick()
    view = world.view("big/0")
    assert (view["state"], view["endpoint"], view["nodes"]) == (
        "ready", "http://10.0.0.1:40001", [f"node0{r + 1}" for r in range(ranks)])
    assert world.stops == []


def test_a_single_rank_replica_gets_no_launcher_and_starts_at_once(world):
    world.serve(attrs.evolve(multi(1), profile=attrs.evolve(multi(1).profile, launcher="ray")))
    node(world, "node01")
    world.reconciler.tick()
    ((_, spec),) = world.starts
    assert (spec.ranks, spec.leader, spec.launcher) == (1, None, None)


def test_rank_0_reporting_that_its_rendezvous_waits_for_ranks_not_yet_joined(world):
    world.serve(multi(3))
    for n in ("node01", "node02", "node03"):
        node(world, n)
    world.reconciler.tick()
    rendezvous(world)
    world.reconciler.tick()
    world.report("big/0/1", "ready")
    assert world.view("big/0")["shards"][0]["waiting"] == "waiting for rank 2 to join at 10.0.0.1:29500"


def test_the_ranks_waiting_for_the_rendezvous_are_held_for_so_nothing_else_takes_their_gpu(world):
    world.serve(multi(2, gpus=1), entry("small", gpus=1, profile="small"))
    node(world, "node01", gpus=1)
    node(world, "node02", gpus=1)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")]
    for _ in range(3):
        world.clock.advance(1)
        world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")]
    assert world.view("small/0")["state"] == "pending"
    rendezvous(world)
    world.reconciler.tick()
    assert [(n, s.gpus) for n, s in world.starts] == [("node01", [0]), ("node02", [0])]
    assert world.view("small/0")["state"] == "pending"


def test_a_rank_its_node_reports_before_it_was_started_is_refused(world):
    world.serve(multi(2))
    node(world, "node01")
    node(world, "node02")
    world.reconciler.tick()
    early = attrs.evolve(world.shard("big/0/0").status.spec, shard_id="big/0/1", rank=1, leader="10.0.0.1:29500")
    with pytest.raises(ClaimRefused) as refused:
        world.fleet.shard_status("node02", ShardStatus(early, "starting", pid=7))
    assert refused.value.why == Why.NOT_PLACED
    assert ("node02", "big/0/1") not in world.fleet.shards


def test_a_rendezvous_off_rank_0s_node_is_refused_and_no_other_rank_is_sent_there(world):
    world.serve(multi(2))
    node(world, "node01")
    node(world, "node02")
    world.reconciler.tick()
    with pytest.raises(ClaimRefused) as refused:
        rendezvous(world, at="10.0.0.99:29500")
    assert refused.value.why == Why.RENDEZVOUS
    assert "10.0.0.99:29500 is not on node01's own address 10.0.0.1" in str(refused.value)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")]
    view = world.view("big/0")
    assert view["state"] == "failed"
    assert view["reason"].startswith("node01: the control plane refused its rendezvous: node01 may not report big/0/0")
    # Placed again after the backoff, rank 0 first again.
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")] * 2


# -- failing whole --


@pytest.mark.parametrize("ranks", [2, 3])
def test_one_failed_rank_stops_every_other_and_the_replica_comes_back_on_the_same_nodes(world, ranks):
    world.serve(multi(ranks))
    # node02..node04 came first; node01 arrives later, and would win a fresh placement by name.
    whole(world, ranks, ["node02", "node03", "node04"])
    node(world, "node01")
    world.report(f"big/0/{ranks - 1}", "failed", reason="killed by signal 9")
    world.reconciler.tick()
    assert sorted(world.stops) == [(f"node0{r + 2}", f"big/0/{r}") for r in range(ranks - 1)]
    view = world.view("big/0")
    assert view["state"] == "failed"
    assert view["reason"] == f"node0{ranks + 1}: killed by signal 9 (next try in 1 s)"
    for r in range(ranks - 1):
        world.report(f"big/0/{r}", "stopped")
    world.clock.advance(0.5)
    world.reconciler.tick()
    assert len(world.starts) == ranks
    world.clock.advance(0.5)
    world.reconciler.tick()
    assert world.started()[ranks:] == [("node02", "big/0/0")]
    rendezvous(world)
    world.reconciler.tick()
    assert world.started()[ranks:] == [(f"node0{r + 2}", f"big/0/{r}") for r in range(ranks)]


def test_rank_0_failing_stops_the_headless_rank_that_would_keep_running(world):
    world.serve(multi(2))
    whole(world, 2, ["node01", "node02"])
    world.report("big/0/0", "failed", reason="exited with code 1")
    world.reconciler.tick()
    assert world.stops == [("node02", "big/0/1")]
    world.report("big/0/1", "stopped")
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started()[2:] == [("node01", "big/0/0")]  # in order again: rank 0 alone first


def test_a_rank_that_stopped_by_itself_fails_the_replica(world):
    world.serve(multi(2))
    whole(world, 2, ["node01", "node02"])
    world.report("big/0/1", "stopped")
    world.reconciler.tick()
    assert world.stops == [("node01", "big/0/0")]
    view = world.view("big/0")
    assert view["state"] == "failed"
    assert view["reason"] == "failed: rank 1 is no longer reported by any node (attempt 1) (next try in 1 s)"
    # Counted once, however long the stop takes: the next try is still 1 s after the failure.
    world.clock.advance(0.5)
    world.reconciler.tick()
    assert world.reconciler.slots["big/0"].failures == 1
    world.report("big/0/0", "stopped")
    world.clock.advance(0.5)
    world.reconciler.tick()
    assert world.started()[2:] == [("node01", "big/0/0")]


def test_a_lost_node_fails_the_replica_and_it_is_placed_again_without_that_node(world):
    world.stop_reports_stopped = True
    world.serve(multi(2))
    whole(world, 2, ["node01", "node02"])
    node(world, "node03")
    world.silence("node02", 120)
    assert world.fleet.nodes["node02"].state == NodeState.LOST
    world.reconciler.tick()
    assert world.stops == [("node01", "big/0/0")]
    assert world.view("big/0")["reason"] == "failed: rank 1 on node02: node02 is lost (attempt 1) (next try in 1 s)"
    world.clock.advance(1)
    world.reconciler.tick()
    rendezvous(world)
    world.reconciler.tick()
    assert world.started()[2:] == [("node01", "big/0/0"), ("node03", "big/0/1")]
    # node02 comes back with its old rank 1 still running: that copy is refused, the new one kept.
    old = ShardStatus(world.shard("big/0/1", "node03").status.spec, "ready", pid=9)
    world.sessions["node02"] += 1
    refused = world.fleet.register("node02", world.sessions["node02"],
                                   attrs.evolve(inventory("node02", engines=("vllm",), shards=[old]),
                                                infiniband=FABRIC))
    assert list(refused) == ["big/0/1"]
    assert "node03 already serves it" in refused["big/0/1"]
    world.reconciler.tick()
    assert world.shard("big/0/1").node_id == "node03"
    assert len(world.starts) == 4


def test_a_lost_nodes_rank_back_before_the_new_start_reached_it_is_stopped_and_started_once(world):
    world.stop_reports_stopped = True
    world.serve(multi(2))
    whole(world, 2, ["node01", "node02"])
    node(world, "node03")
    old = world.shard("big/0/1").status
    world.silence("node02", 120)
    world.reconciler.tick()
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started()[2:] == [("node01", "big/0/0")]
    # Rank 0 waits for its rendezvous when node02 comes back with rank 1 of the old replica.
    world.sessions["node02"] += 1
    world.fleet.register("node02", world.sessions["node02"],
                         attrs.evolve(inventory("node02", engines=("vllm",), shards=[old]), infiniband=FABRIC))
    world.reconciler.tick()
    assert world.stops[-1] == ("node02", "big/0/1")
    rendezvous(world)
    world.reconciler.tick()
    assert world.started()[2:] == [("node01", "big/0/0"), ("node03", "big/0/1")]
    assert world.view("big/0")["state"] == "starting"


def test_rank_0s_node_lost_before_its_rendezvous_is_placed_again_and_its_copy_refused_when_it_returns(world):
    world.serve(multi(2))
    for n in ("node01", "node02", "node03"):
        node(world, n)
    world.reconciler.tick()
    old = world.shard("big/0/0").status
    world.silence("node01", 120)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0"), ("node02", "big/0/0")]
    world.sessions["node01"] += 1
    refused = world.fleet.register("node01", world.sessions["node01"],
                                   attrs.evolve(inventory("node01", engines=("vllm",), shards=[old]),
                                                infiniband=FABRIC))
    assert "node02 already serves it" in refused["big/0/0"]
    rendezvous(world)
    world.reconciler.tick()
    assert world.started()[2:] == [("node03", "big/0/1")]
    assert world.starts[-1][1].leader == "10.0.0.2:29500"


def test_a_node_refusing_a_workers_start_stops_rank_0_too(world):
    world.serve(multi(2))
    node(world, "node01")
    node(world, "node02")
    world.refusals["node02"] = "node02 has no room: its disk is full"
    world.reconciler.tick()
    rendezvous(world)
    world.reconciler.tick()
    assert world.view("big/0")["reason"].startswith("failed: node02: node02 has no room")
    world.reconciler.tick()
    assert world.stops == [("node01", "big/0/0")]


# -- the bounded waits --


def test_rank_0_that_never_reports_a_rendezvous_fails_after_start_timeout_s(world):
    world.serve(multi(2))
    node(world, "node01")
    node(world, "node02")
    world.reconciler.tick()
    world.report("big/0/0", "fetching")
    world.clock.advance(3 * TIMEOUT)  # a long download is not the rendezvous's wait
    world.reconciler.tick()
    world.report("big/0/0", "starting")
    world.reconciler.tick()
    world.clock.advance(TIMEOUT - 1)
    world.reconciler.tick()
    assert world.stops == []
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.stops == [("node01", "big/0/0")]
    assert world.started() == [("node01", "big/0/0")]
    assert world.view("big/0")["reason"] == (
        "failed: rank 0 on node01 reported no rendezvous for the other ranks within 600 s (its start_timeout_s) "
        "(attempt 1) (next try in 1 s)")


def test_ranks_that_do_not_all_get_ready_fail_after_start_timeout_s(world):
    world.serve(multi(2))
    node(world, "node01")
    node(world, "node02")
    world.reconciler.tick()
    rendezvous(world)
    world.reconciler.tick()
    world.report("big/0/1", "ready")
    world.clock.advance(TIMEOUT - 1)
    world.reconciler.tick()
    assert world.stops == []
    world.clock.advance(1)
    world.reconciler.tick()
    assert sorted(world.stops) == [("node01", "big/0/0"), ("node02", "big/0/1")]
    assert world.view("big/0")["reason"].startswith(
        "failed: rank 0 on node01 not ready within 600 s of every rank starting (start_timeout_s)")


# -- a control plane that restarted --


def running(ranks, rank):
    """Rank *rank* of a ready replica big/0 as its node offers it when it registers."""
    e = multi(ranks)
    spec = ShardSpec(shard_id=f"big/0/{rank}", replica_id="big/0", model="big", engine="vllm",
                     fingerprint=e.fingerprint, source=e.model.source, rank=rank, ranks=ranks,
                     leader="10.0.0.1:29500" if rank else None)
    return ShardStatus(spec, "ready", pid=100 + rank, adopted=True,
                       endpoint="http://10.0.0.1:40001" if rank == 0 else None,
                       rendezvous="10.0.0.1:29500" if rank == 0 else None)


def restarted(world, reports):
    for n, shards in reports.items():
        world.sessions[n] = 1
        world.fleet.register(n, 1, attrs.evolve(inventory(n, engines=("vllm",), shards=shards), infiniband=FABRIC))


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_restarted_control_plane_adopts_a_whole_replica_and_starts_nothing(ranks):
    world = World(settle_s=15)
    world.serve(multi(ranks))
    restarted(world, {f"node0{r + 1}": [running(ranks, r)] for r in range(ranks)})
    world.clock.advance(20)
    world.reconciler.tick()
    assert (world.starts, world.stops) == ([], [])
    view = world.view("big/0")
    assert (view["state"], view["endpoint"]) == ("ready", "http://10.0.0.1:40001")
    assert [(s["rank"], s["node"], s["state"]) for s in view["shards"]] == [
        (r, f"node0{r + 1}", "ready") for r in range(ranks)]


def test_a_restarted_control_plane_stops_a_partial_replica_once_settled_and_places_it_again():
    world = World(settle_s=15)
    world.serve(multi(2))
    restarted(world, {"node01": [running(2, 0)], "node02": []})
    world.reconciler.tick()
    assert world.stops == []  # node02 may still be coming
    assert world.view("big/0")["state"] == "starting"
    world.clock.advance(15)
    world.reconciler.tick()
    assert world.stops == [("node01", "big/0/0")]
    assert world.view("big/0")["reason"] == "failed: rank 1 is no longer reported by any node (attempt 1) " \
                                            "(next try in 1 s)"
    world.report("big/0/0", "stopped")
    world.clock.advance(1)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")]


# -- scaling down --


def test_scaling_down_stops_every_rank_of_the_slot(world):
    world.serve(multi(2, replicas=2))
    for n in ("node01", "node02", "node03", "node04"):
        node(world, n)
    world.reconciler.tick()
    rendezvous(world, "big/0")
    rendezvous(world, "big/1")
    world.reconciler.tick()
    assert len(world.starts) == 4
    world.serve(multi(2, replicas=1))
    world.reconciler.tick()
    slot1 = sorted((n, s) for n, s in world.started() if s.startswith("big/1/"))
    assert sorted(world.stops) == slot1


def test_scaling_down_a_replica_waiting_for_its_rendezvous_never_starts_its_other_ranks(world):
    world.serve(multi(2))
    node(world, "node01")
    node(world, "node02")
    world.reconciler.tick()
    world.serve(multi(2, replicas=0))
    world.reconciler.tick()
    assert world.stops == [("node01", "big/0/0")]
    rendezvous(world)
    world.clock.advance(RESTOP_AFTER_S)
    world.reconciler.tick()
    assert world.started() == [("node01", "big/0/0")]
    assert world.reconciler.snapshots()[1].gpus_in_use == frozenset()
    assert world.reconciler._inflight == {}


# -- through the hub, as two agents would see it --


@pytest_twisted.ensureDeferred
async def test_through_the_hub_rank_1_is_asked_to_start_only_after_rank_0_reports_its_rendezvous(plane, clock):
    control, attach = plane, plane.attach
    control.catalog = SimpleNamespace(entries={"big": multi(2, launcher="native")})
    control.engine_plan = lambda: None  # no engines to install: the catalog here is models alone
    # The control plane has taken a start's answer once it publishes the shard as starting.
    asked: list[ShardSpec] = []
    answered: dict[str, defer.Deferred] = {}
    operator = await attach("ops", ROLE_OPERATOR)

    def on_shard(ident, event):
        if event["change"] == "status" and event["shard"]["state"] == "starting" and ident in answered:
            answered.pop(ident).callback(None)

    await operator.subscribe(on_shard, uris.EVENT_SHARD)

    async def started(shard_id):
        answered[shard_id] = defer.Deferred()
        control.reconciler.tick()
        await answered[shard_id].addTimeout(5, reactor)
        return asked[-1]

    nodes = {}
    for node_id in ("node01", "node02"):
        nodes[node_id] = await attach(node_id, ROLE_NODE)

        def start(payload):
            asked.append(from_wire(ShardSpec, payload))
            return to_wire(ShardStatus(asked[-1], "starting", pid=4242))

        await nodes[node_id].register(start, uris.node_uri(node_id, uris.NODE_START_SHARD))
        await nodes[node_id].call(uris.AGENT_REGISTER,
                                  to_wire(attrs.evolve(inventory(node_id, engines=("vllm",)), infiniband=FABRIC)))
    leader = await started("big/0/0")
    assert (leader.rank, leader.leader, leader.launcher) == (0, None, "native")
    # A rendezvous off node01's address is refused over the link, and starts nothing.
    with pytest.raises(ApplicationError) as refused:
        await nodes["node01"].call(uris.AGENT_SHARD_STATUS,
                                   to_wire(ShardStatus(leader, "starting", pid=4242, rendezvous="10.0.0.2:29500")))
    assert refused.value.error == uris.ERROR_REFUSED
    assert "10.0.0.2:29500 is not on node01's own address 10.0.0.1" in refused.value.args[0]
    control.reconciler.tick()
    assert asked == [leader]
    # After the backoff, a fresh start, rank 0 alone again; then its rendezvous on its own address.
    clock.advance(1)
    leader = await started("big/0/0")
    control.reconciler.tick()
    assert [s.rank for s in asked] == [0, 0]
    await nodes["node01"].call(uris.AGENT_SHARD_STATUS,
                               to_wire(ShardStatus(leader, "starting", pid=4242, rendezvous="10.0.0.1:29500")))
    worker = await started("big/0/1")
    assert (worker.shard_id, worker.rank, worker.leader, worker.launcher) == ("big/0/1", 1, "10.0.0.1:29500", "native")
    assert [s.rank for s in asked] == [0, 0, 1]
    for session in (*nodes.values(), operator):
        session.leave()

