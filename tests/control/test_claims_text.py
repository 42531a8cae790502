"""An endpoint or rendezvous with anything around it is not a place the router may be sent.

The link refuses such a report before the claims see it (tests/test_wire_text.py);
the claims hold the rule too, for whatever reaches them another way, and the
plane answers a node that sends one with the field that is wrong.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError

from llmgw.control.claims import endpoint_refusal, rendezvous_refusal
from llmgw.link import uris
from llmgw.records import Inventory, ShardStatus
from llmgw.wire import to_wire
from tests.control.test_claims import spec
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures


@pytest.mark.parametrize("endpoint", [" http://10.0.0.1:40001", "\thttp://10.0.0.1:40001",
                                      "http://10.0.0.1:40001\n", "http://10.0.0.1:40001\u202e"])
def test_an_endpoint_with_anything_around_it_is_refused(endpoint):
    assert "an engine's endpoint is http://HOST:PORT" in endpoint_refusal(endpoint, "node01", "10.0.0.1")


@pytest.mark.parametrize("rendezvous", [" 10.0.0.1:29500", "\t10.0.0.1:29500", "10.0.0.1:29500\n"])
def test_a_rendezvous_with_anything_around_it_is_refused(rendezvous):
    assert "a rendezvous is HOST:PORT" in rendezvous_refusal(rendezvous, spec(), "node01", "10.0.0.1")


@pytest_twisted.ensureDeferred
async def test_the_plane_answers_an_endpoint_with_a_leading_space_naming_the_field_and_keeps_nothing(plane):
    node = await plane.attach("node03", uris.ROLE_NODE)
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node03", address="10.0.0.3")))
    plane.fleet.place("node03", spec())
    with pytest.raises(ApplicationError) as caught:
        await node.call(uris.AGENT_SHARD_STATUS, to_wire(ShardStatus(spec(), "ready",
                                                                     endpoint=" http://10.0.0.3:40001")))
    assert caught.value.error == uris.ERROR_INVALID_ARGUMENT
    assert caught.value.args[0] == ("ShardStatus.endpoint: ' http://10.0.0.3:40001' has whitespace around it, "
                                    "which it may not have: send it without")
    assert plane.fleet.shards == {}
