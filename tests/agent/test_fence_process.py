"""A real agent process fences off an old leader, remembers it across a restart, and follows a standby to the leader.

The hubs are real (mutual TLS on 127.0.0.1) with a stand-in control plane
the test drives, as in tests/integration/test_rogue_control_plane.py; the
agent is ``twistd llmgw-agent``.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, ComponentConfig, RegisterOptions
from twisted.internet import reactor

from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.records import ShardSpec
from llmgw.wire import to_wire
from tests.link.conftest import close, serve
from tests.support.cluster import Cluster, Process, environment, twistd
from tests.support.wait import until

pytestmark = pytest.mark.integration

SPEC = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim")


class StandIn(ApplicationSession):
    """A control plane that answers each registration with ``answer(node_id)`` (a dict, or an error raised)."""

    def __init__(self, config, answer):
        super().__init__(config)
        self.answer = answer
        self.registrations: list[str] = []

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        opts = RegisterOptions(details_arg="details")
        await self.register(self._register, uris.AGENT_REGISTER, opts)
        for uri in (uris.AGENT_HEARTBEAT, uris.AGENT_SHARD_STATUS, uris.AGENT_PROGRESS):
            await self.register(lambda *a, details=None: None, uri, opts)

    def _register(self, inventory, details=None):
        self.registrations.append(details.caller_authid)
        return self.answer(details.caller_authid)


async def hub_with(pki, answer):
    hub = Hub(reactor)
    port = await serve(hub, pki, control=False)
    hub.control = StandIn(ComponentConfig(realm=uris.REALM), answer)
    hub.attach_local(hub.control)
    await until(lambda: hub.control.is_attached(), "the stand-in control plane to join")
    return hub, port


def start_agent(cluster: Cluster, hubs: list[str]) -> Process:
    """node01's real agent, its agent.yaml listing *hubs* in order."""
    config = cluster.agent_config("node01")
    text = config.read_text().replace(f'hub: "{cluster.hub}"', "hub: [" + ", ".join(f'"{h}"' for h in hubs) + "]")
    config.write_text(text)
    proc = Process("node01", twistd("llmgw-agent", config), config.parent / "agent.log", environment()).start()
    cluster.processes.append(proc)
    return proc


async def command(hub, verb, *args, **kwargs):
    return await hub.control.call(uris.node_uri("node01", verb), *args, options=CallOptions(timeout=10_000), **kwargs)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_a_node_refuses_an_older_leader_in_words_and_still_does_after_a_restart(tmp_path, pki):
    cluster = Cluster(tmp_path, pki)
    epochs = {"register": 5}
    hub, port = await hub_with(pki, lambda node: {"node_id": node, **({"epoch": epochs["register"]}
                                                                       if epochs["register"] else {})})
    try:
        agent = start_agent(cluster, [hub.address.url])
        await until(lambda: hub.control.registrations == ["node01"], "node01 to register", timeout=30)
        assert await command(hub, uris.NODE_CORDON, True, epoch=6) is True  # a newer leader's command: taken
        assert await command(hub, uris.NODE_CORDON, False) is False  # no epoch (no ha:): taken
        words = ("refused a command of epoch 5: this node has seen epoch 6 (a newer leader); "
                 "the server that sent it no longer leads")
        for _ in range(3):
            with pytest.raises(ApplicationError) as refused:
                await command(hub, uris.NODE_START_SHARD, to_wire(SPEC), epoch=5)
            assert (refused.value.error, refused.value.args) == (uris.ERROR_REFUSED, (words,))
        with pytest.raises(ApplicationError) as refused:
            await command(hub, uris.NODE_START_SHARD, to_wire(SPEC), epoch="6")
        assert refused.value.error == uris.ERROR_INVALID_ARGUMENT and "an epoch is a whole number" in refused.value.args[0]
        await until(lambda: words in agent.output(), "the refusal in the agent's log")
        assert agent.output().count(words) == 1  # logged once for its epoch, however often refused

        agent.stop()
        epochs["register"] = None  # the next answer names no epoch: what refuses now is what the node kept
        agent = start_agent(cluster, [hub.address.url])
        await until(lambda: hub.control.registrations == ["node01", "node01"], "node01 to register again", timeout=30)
        with pytest.raises(ApplicationError) as refused:
            await command(hub, uris.NODE_STOP_SHARD, SPEC.shard_id, epoch=5)
        assert refused.value.args == (words,)
        assert (tmp_path / "node01" / "state" / "epoch").read_text() == "6\n"
    finally:
        cluster.stop()
        await close(hub, port)


@pytest_twisted.ensureDeferred
async def test_a_node_given_two_hubs_goes_from_a_standby_to_the_leader_it_names(tmp_path, pki):
    cluster = Cluster(tmp_path, pki)
    leader, leader_port = await hub_with(pki, lambda node: {"node_id": node, "epoch": 3})

    def stand_by(node):
        raise ApplicationError(uris.ERROR_STANDBY, f"standby; the leader is serverB at {leader.address.url}",
                               leader_url=leader.address.url)

    standby, standby_port = await hub_with(pki, stand_by)
    try:
        agent = start_agent(cluster, [standby.address.url, leader.address.url])
        await until(lambda: leader.control.registrations == ["node01"], "node01 to register with the leader",
                    timeout=30)
        assert standby.control.registrations == ["node01"]
        assert await command(leader, uris.NODE_CORDON, True, epoch=3) is True
        said = agent.output()
        assert (f"the hub at {standby.address.url} stands by (standby; the leader is serverB at "
                f"{leader.address.url}); going to the leader's hub, {leader.address.url}, now") in said
        assert f"registered with the hub at {leader.address.url} as node01" in said
    finally:
        cluster.stop()
        await close(hub=standby, port=standby_port)
        await close(leader, leader_port)
