"""Every command that changes a node carries the leader's epoch, and a server that does not lead sends none.

The control plane and the nodes are sessions attached in process to a real
hub: what the tests read is what each node's procedure received, keywords
included.  ``command_epoch`` stands in for the election (helper I3 wires it).
"""

from __future__ import annotations

import contextlib

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.logger import capturedLogs, formatEvent

from llmgw.ha.fence import NotLeading, no_ha
from llmgw.link import uris
from llmgw.records import CollectResult, EnginePlan, Inventory, ShardSpec, ShardStatus, WeightsFile, WeightsReport
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR
from llmgw.weightnames import cache_name
from llmgw.wire import to_wire
# The control plane on a real hub, with attach(authid, role): test_plane's fixtures.
from tests.control.test_plane import clock, plane  # noqa: F401



def spec(node_id: str) -> ShardSpec:
    """A shard of a model of *node_id*'s own, so no two nodes claim one slot."""
    return ShardSpec(shard_id=f"{node_id}m/0/0", replica_id=f"{node_id}m/0", model=f"{node_id}m", engine="sim")


FETCHED = "/data/weights/" + cache_name("https://example.org/dropped.gguf")
FENCED = (uris.NODE_START_SHARD, uris.NODE_STOP_SHARD, uris.NODE_DRAIN_SHARD, uris.NODE_CORDON,
          uris.NODE_COLLECT_WEIGHTS, uris.NODE_SET_ENGINES)


async def node(plane, node_id: str, fencing: bool | None):
    """*node_id* registered (saying *fencing*), its six procedures each noting (verb, args, kwargs); and the answer."""
    session = await plane.attach(node_id, ROLE_NODE)
    session.heard = []
    shard = spec(node_id)
    answers = {uris.NODE_START_SHARD: to_wire(ShardStatus(shard, "starting")),
               uris.NODE_STOP_SHARD: to_wire(ShardStatus(shard, "stopped")),
               uris.NODE_DRAIN_SHARD: to_wire(ShardStatus(shard, "draining")),
               uris.NODE_CORDON: True, uris.NODE_COLLECT_WEIGHTS: to_wire(CollectResult(removed=[FETCHED])),
               uris.NODE_SET_ENGINES: None}
    for verb, answer in answers.items():
        def procedure(*args, verb=verb, answer=answer, **kwargs):
            session.heard.append((verb, args, kwargs))
            return answer
        await session.register(procedure, uris.node_uri(node_id, verb))
    report = WeightsReport(files=[WeightsFile(FETCHED, 7)], listed=True, cache_dir="/data/weights")
    said = await session.call(uris.AGENT_REGISTER, to_wire(Inventory(
        node_id=node_id, address="10.0.0.1", fencing=fencing, weights=report,
        shards=[ShardStatus(shard, "ready", endpoint="http://10.0.0.1:4001")])))
    return session, said


async def every_command(plane, node_id: str, alice) -> None:
    """The control plane sends *node_id* each of the six commands, the operator's through the hub."""
    await alice.call(uris.CP_DRAIN, node_id)  # cordon, drain and stop the shard the node reported
    with contextlib.suppress(ApplicationError):  # sent; the fleet refuses a start it did not place, not this test's
        await plane.start_shard(node_id, spec(node_id))
    await plane.stop_shard(node_id, spec(node_id).shard_id)
    await plane._set_engines(node_id, to_wire(EnginePlan(builds=[])))
    await alice.call(uris.CP_WEIGHTS, True)


@pytest_twisted.ensureDeferred
async def test_each_command_to_a_node_that_checks_epochs_carries_the_leader_s(plane):
    plane.command_epoch = lambda: 7
    node01, said = await node(plane, "node01", fencing=True)
    assert said == {"node_id": "node01", "epoch": 7}  # the register answer tells the node its leader's epoch
    alice = await plane.attach("alice", ROLE_OPERATOR)
    await every_command(plane, "node01", alice)
    assert {verb for verb, _, _ in node01.heard} == set(FENCED)
    assert [(verb, kwargs) for verb, _, kwargs in node01.heard if kwargs != {"epoch": 7}] == []


@pytest_twisted.ensureDeferred
async def test_without_ha_and_to_an_agent_older_than_fencing_no_command_carries_an_epoch(plane):
    node01, said = await node(plane, "node01", fencing=True)
    assert plane.command_epoch is no_ha and said == {"node_id": "node01"}
    plane.command_epoch = lambda: 7
    with capturedLogs() as events:
        old, said = await node(plane, "old02", fencing=None)
    assert said == {"node_id": "old02", "epoch": 7}  # an older agent ignores the key it does not know
    assert any("old02's agent is older than fencing" in formatEvent(e) and "upgrade its llmgw" in formatEvent(e)
               for e in events)
    alice = await plane.attach("alice", ROLE_OPERATOR)
    await every_command(plane, "old02", alice)
    assert node01.heard == [(uris.NODE_COLLECT_WEIGHTS, ([FETCHED],), {"epoch": 7})]  # its weights were collected too
    node01.heard.clear()
    plane.command_epoch = no_ha
    await every_command(plane, "node01", alice)
    for session in (node01, old):
        assert {verb for verb, _, _ in session.heard} == set(FENCED)
        assert [kwargs for _, _, kwargs in session.heard if kwargs] == []


@pytest_twisted.ensureDeferred
async def test_a_server_that_does_not_lead_sends_nothing_and_says_why(plane):
    words = "serverA no longer leads: serverB at wss://b.example.org:7443/ does (epoch 12); run the command there"

    def not_leading():
        raise NotLeading(words)

    node01, _ = await node(plane, "node01", fencing=True)
    plane.command_epoch = not_leading
    with pytest.raises(NotLeading) as refused:
        await plane.start_shard("node01", spec("node01"))
    assert refused.value.words == words
    with pytest.raises(NotLeading):
        await plane.stop_shard("node01", spec("node01").shard_id)
    alice = await plane.attach("alice", ROLE_OPERATOR)
    for uri, args in ((uris.CP_CORDON, ("node01",)), (uris.CP_DRAIN, ("node01",)), (uris.CP_WEIGHTS, (True,))):
        with pytest.raises(ApplicationError) as heard:
            await alice.call(uri, *args)
        assert (heard.value.error, heard.value.args) == (uris.ERROR_REFUSED, (words,)), uri
    assert node01.heard == []
    # A server that cannot command still takes a registration; it tells no epoch it cannot stand behind.
    _, said = await node(plane, "node03", fencing=True)
    assert said == {"node_id": "node03"}
