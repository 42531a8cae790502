"""An adopted shard is held to its profile: only where placement could have put it.

A node that registers with a shard the control plane did not place offers it
for adoption; the slot being free is not enough.  The world is
test_reconciler's (a real Fleet, a test clock); the last test goes through
the hub with a catalog loaded from a real server.yaml, as a node would.
"""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted

from llmgw.config.server import load_server_config
from llmgw.control.adoption import HARD
from llmgw.control.catalog import Catalog
from llmgw.control.claims import ClaimRefused, ModelSlots, Why
from llmgw.control.placement_filters import FILTERS
from llmgw.link import uris
from llmgw.records import GPU, EngineInfo, Inventory, ShardSpec, ShardStatus
from llmgw.roles import ROLE_NODE
from llmgw.sizes import GB
from llmgw.wire import to_wire
from tests.control.test_catalog import HEAD
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.control.test_reconciler import World, entry


def offer(node_id, shard_id="echo/0/0", *, gpus=(), engine="sim", labels=None, memory_gb=32, cards=None,
          used_gb=0.0, engines=("sim",), more=()):
    """*node_id* registering with *shard_id* running, as an agent that restarted reports it."""
    replica_id, _, rank = shard_id.rpartition("/")
    spec = ShardSpec(shard_id=shard_id, replica_id=replica_id, model=replica_id.rpartition("/")[0],
                     engine=engine, rank=int(rank), gpus=list(gpus))
    address = f"10.0.0.{int(node_id[-2:])}"
    shards = [ShardStatus(spec, "ready", endpoint=f"http://{address}:40001", adopted=True), *more]
    return Inventory(
        node_id=node_id, address=address, memory_total_bytes=int(memory_gb * GB),
        gpus=None if cards is None else [GPU(index=i, name="NVIDIA H100", memory_total_bytes=int(80 * GB),
                                             memory_used_bytes=int(used_gb * GB)) for i in range(cards)],
        engines=[EngineInfo(e) for e in engines], labels=dict(labels or {}), shards=shards,
    )


def adopt(*entries, inventory):
    world = World()
    world.serve(*entries)
    catalog = {e.model.name: ModelSlots.of(e.model.name, e) for e in entries}
    refused = world.fleet.register(inventory.node_id, 1, inventory, catalog=catalog)
    return world, refused


def test_the_adoption_check_is_placements_own_filters():
    assert all(step in FILTERS for step in HARD)


def test_a_node_without_the_label_the_profile_selects_does_not_adopt_its_shard():
    world, refused = adopt(entry(node_selector={"gpu": "h100"}), inventory=offer("node05", labels={"gpu": "a10"}))
    assert refused == {"echo/0/0": "node05 may not report echo/0/0: placement would not have put it there "
                                   "(node05: label gpu=h100 wanted, has gpu=a10); the catalog's profile for "
                                   "echo decides where it runs"}
    assert world.fleet.shards == {}
    assert world.fleet.claims.refused[("node05", Why.PROFILE)] == 1
    # Not served from there: the slot is still the reconciler's to place.
    assert world.view("echo/0")["endpoint"] is None


def test_a_node_with_the_label_adopts_it():
    world, refused = adopt(entry(node_selector={"gpu": "h100"}), inventory=offer("node05", labels={"gpu": "h100"}))
    assert refused == {}
    assert world.fleet.claims.grants[("node05", "echo/0/0")].adopted


def test_a_node_without_the_profiles_engine_or_running_another_does_not_adopt_it():
    _, refused = adopt(entry(), inventory=offer("node05", engines=("llama.cpp",)))
    assert "(node05: has no sim engine)" in refused["echo/0/0"]
    _, refused = adopt(entry(), inventory=offer("node05", engine="vllm"))
    assert "(node05: runs it on vllm, and its profile's engine is sim)" in refused["echo/0/0"]


def test_a_gpu_shard_is_not_counted_against_itself():
    # Its two cards are nearly full: of its own weights; placement asked for 40 GB free on each.
    echo = entry(gpus=2)
    echo = attrs.evolve(echo, profile=attrs.evolve(echo.profile, min_gpu_free_gb=40))
    world, refused = adopt(echo, inventory=offer("node05", gpus=(0, 1), cards=2, used_gb=79))
    assert refused == {}
    # A card too small for the profile is refused all the same.
    echo = attrs.evolve(echo, profile=attrs.evolve(echo.profile, min_gpu_free_gb=90))
    _, refused = adopt(echo, inventory=offer("node05", gpus=(0, 1), cards=2, used_gb=79))
    assert "(node05: has no free GPUs with 90 GB free, needs 2)" in refused["echo/0/0"]


def test_a_gpu_shard_must_hold_the_cards_its_profile_asks_for_on_cards_the_node_has():
    _, refused = adopt(entry(gpus=2), inventory=offer("node05", gpus=(0,), cards=2))
    assert "(node05: runs it on 1 GPU, and its profile asks for 2 GPUs)" in refused["echo/0/0"]
    _, refused = adopt(entry(gpus=1), inventory=offer("node05", gpus=(7,), cards=2))
    assert "(node05: runs it on GPU 7, which it does not report having)" in refused["echo/0/0"]
    _, refused = adopt(entry(gpus=1), inventory=offer("node05", gpus=(0,), cards=None))
    assert "(node05: did not say how many GPUs it has, needs 1)" in refused["echo/0/0"]
    _, refused = adopt(entry(), inventory=offer("node05", gpus=(0,), cards=1))
    assert "(node05: runs it on 1 GPU, and its profile asks for no GPUs)" in refused["echo/0/0"]


def test_a_machine_smaller_than_the_profile_does_not_adopt_it():
    _, refused = adopt(entry(min_memory_gb=64), inventory=offer("node05", memory_gb=32))
    assert "(node05: has 32 GB of memory, needs 64)" in refused["echo/0/0"]


def test_cpu_shards_are_adopted_while_their_reservations_fit_and_not_past_that():
    # 24 GB each on a 32 GB machine: placement would put one there, never two.
    second = offer("node05", "echo/1/0").shards[0]
    world, refused = adopt(entry(replicas=2, min_memory_gb=24),
                           inventory=offer("node05", memory_gb=32, more=[second]))
    assert list(refused) == ["echo/1/0"]
    assert "(node05: 8 GB of 32 left after echo/0, needs 24)" in refused["echo/1/0"]
    assert [s.id for s in world.fleet.shards.values()] == ["echo/0/0"]


SELECTING_YAML = HEAD + """\
profiles:
  sim-h100: {engine: sim, node_selector: {gpu: h100}}
models:
  echo: {profile: sim-h100}
"""


@pytest_twisted.ensureDeferred
async def test_the_plane_refuses_an_adoption_its_catalogs_profile_rules_out_and_routes_nothing_there(plane,
                                                                                                   tmp_path):
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    (tmp_path / "server.yaml").write_text(SELECTING_YAML)
    plane.catalog = Catalog(load_server_config(tmp_path / "server.yaml"))
    node = await plane.attach("node05", ROLE_NODE)
    answer = await node.call(uris.AGENT_REGISTER, to_wire(offer("node05", labels={"gpu": "a10"})))
    assert "(node05: label gpu=h100 wanted, has gpu=a10)" in answer["refused"]["echo/0/0"]
    assert plane.fleet.shards == {}
    assert plane.endpoint_table().endpoints == []


def test_a_shard_on_an_older_build_of_the_engine_is_adopted_for_the_reconciler_to_replace():
    installing = EngineInfo("llama.cpp", version="b6000", state="installing", reason="installing: downloading")
    old = EngineInfo("llama.cpp", version="b5000", state="installed")
    inventory = attrs.evolve(offer("node05", engine="llama.cpp"), engines=[old, installing])
    _, refused = adopt(entry(engine="llama.cpp", engine_version="b6000"), inventory=inventory)
    assert refused == {}


def test_an_adoption_looks_at_its_own_slots_grants_not_at_the_whole_fleets():
    # Asked about every grant's node, a register of 1024 shards against a large fleet was a million steps.
    world = World()
    for i in range(2000):
        world.fleet.place(f"gpu{i:04d}", ShardSpec(shard_id=f"other{i}/0/0", replica_id=f"other{i}/0",
                                                   model=f"other{i}", engine="sim"))
    asked = []
    status = offer("node05").shards[0]
    world.fleet.claims.check("node05", status, "10.0.0.5", adopting=True, usable=lambda n: asked.append(n) or True)
    assert asked == []
    # Its slot's holder, now node05, is still found, and named.
    with pytest.raises(ClaimRefused) as caught:
        world.fleet.claims.check("node06", attrs.evolve(status, endpoint=None), None, adopting=True,
                                 usable=lambda n: asked.append(n) or True)
    assert caught.value.why == Why.SLOT_HELD and asked == ["node05"]
    assert "node05 already serves it" in str(caught.value)
