"""What a node reports of a shard it was granted: nothing around its endpoint, and the GPUs and engine granted.

The link refuses such a report before the claims see it (tests/test_wiretext.py);
the claims hold the rule too, for whatever reaches them another way, and the
plane answers a node that sends one with the field that is wrong.
"""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError

from llmgw.control.claims import ClaimRefused, Why, endpoint_refusal, rendezvous_refusal
from llmgw.link import uris
from llmgw.records import Inventory, ShardStatus
from llmgw.roles import ROLE_NODE
from llmgw.wire import to_wire
from tests.control.test_claims import VICTIM, spec
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.control.test_reconciler import World, entry


@pytest.mark.parametrize("endpoint", [" http://10.0.0.1:40001", "\thttp://10.0.0.1:40001",
                                      "http://10.0.0.1:40001\n", "http://10.0.0.1:40001\u202e"])
def test_an_endpoint_with_anything_around_it_is_refused(endpoint):
    assert "an engine's endpoint is http://HOST:PORT" in endpoint_refusal(endpoint, "node01", "10.0.0.1")


@pytest.mark.parametrize("rendezvous", [" 10.0.0.1:29500", "\t10.0.0.1:29500", "10.0.0.1:29500\n"])
def test_a_rendezvous_with_anything_around_it_is_refused(rendezvous):
    assert "a rendezvous is HOST:PORT" in rendezvous_refusal(rendezvous, spec(), "node01", "10.0.0.1")


@pytest_twisted.ensureDeferred
async def test_the_plane_answers_an_endpoint_with_a_leading_space_naming_the_field_and_keeps_nothing(plane):
    node = await plane.attach("node03", ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node03", address="10.0.0.3")))
    plane.fleet.place("node03", spec())
    with pytest.raises(ApplicationError) as caught:
        await node.call(uris.AGENT_SHARD_STATUS, to_wire(ShardStatus(spec(), "ready",
                                                                     endpoint=" http://10.0.0.3:40001")))
    assert caught.value.error == uris.ERROR_INVALID_ARGUMENT
    assert caught.value.args[0] == ("ShardStatus.endpoint: ' http://10.0.0.3:40001' has whitespace around it, "
                                    "which it may not have: send it without")
    assert plane.fleet.shards == {}


def test_a_placed_or_adopted_shard_reported_later_on_other_gpus_or_another_engine_is_refused():
    world = World()
    world.serve(entry())
    adopted = ShardStatus(spec(gpus=[0]), "ready", endpoint="http://10.0.0.2:40001", adopted=True)
    assert world.fleet.register("node02", 1, Inventory(node_id="node02", address="10.0.0.2", shards=[adopted])) == {}
    for moved, words in [(spec(gpus=[0, 1, 2, 3]), "sim with GPUs 0, 1, 2, 3"), (spec(gpus=[0], engine="vllm"),
                                                                                 "vllm with GPUs 0")]:
        with pytest.raises(ClaimRefused) as caught:
            world.fleet.shard_status("node02", attrs.evolve(adopted, spec=moved))
        assert caught.value.why == Why.SPEC
        assert str(caught.value).endswith(f"it was accepted on sim with GPUs 0, and is reported on {words}")
    assert world.shard(VICTIM).status.spec.gpus == [0]
