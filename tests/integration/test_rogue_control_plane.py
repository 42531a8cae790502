"""A real agent refuses a misbehaving control plane's request to delete what llmgw did not fetch.

The test runs its own hub with a control plane it controls, and a real
agent process dials it; the control plane then asks the agent to delete an
operator's file, paths outside the cache, a traversal, a symlink and
garbage. The agent checks every path itself and deletes only its own
cache-named file.
"""

from __future__ import annotations

import os

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.types import ComponentConfig, RegisterOptions
from twisted.internet import defer, endpoints, reactor
from twisted.protocols.tls import TLSMemoryBIOFactory

from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.link.tls import server_options
from llmgw.tlsfiles import TLSFiles
from llmgw.weightnames import cache_name
from tests.support.cluster import Cluster

pytestmark = pytest.mark.integration


class RogueControl(ApplicationSession):
    def __init__(self, config):
        super().__init__(config)
        self.registered = defer.Deferred()

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        opts = RegisterOptions(details_arg="details")
        await self.register(self._register, uris.AGENT_REGISTER, opts)
        await self.register(lambda *a, details=None: None, uris.AGENT_HEARTBEAT, opts)
        await self.register(lambda *a, details=None: None, uris.AGENT_SHARD_STATUS, opts)

    def _register(self, inventory, details=None):
        if not self.registered.called:
            self.registered.callback(inventory)
        return {"node_id": details.caller_authid}


@pytest_twisted.ensureDeferred
async def test_the_agent_refuses_every_path_it_cannot_prove_it_fetched(tmp_path, pki):
    cluster = Cluster(tmp_path, pki)
    hub = Hub(reactor)
    tls = TLSFiles(str(cluster.pki / "ca.crt"), str(cluster.pki / "llmgw-server.crt"), str(cluster.pki / "llmgw-server.key"))
    port = await endpoints.TCP4ServerEndpoint(reactor, cluster.link_port, interface="127.0.0.1").listen(
        TLSMemoryBIOFactory(server_options(tls), False, hub.websocket_factory()))
    control = RogueControl(ComponentConfig(realm=uris.REALM))
    hub.attach_local(control)
    try:
        weights = tmp_path / "node01" / "weights"
        weights.mkdir(parents=True)
        ours = weights / cache_name("https://example.org/old-model.gguf")
        ours.write_bytes(b"fetched by llmgw")
        operator = weights / "copied-by-hand.gguf"
        operator.write_bytes(b"an operator's week of copying")
        outside = tmp_path / "precious.gguf"
        outside.write_bytes(b"not in the cache at all")
        link = weights / cache_name("https://example.org/link.gguf")
        link.symlink_to(outside)

        agent = cluster.start_agent("node01")
        await control.registered.addTimeout(30, reactor)
        asked = [str(operator), str(outside), f"{weights}/../precious.gguf", str(link), "/etc/passwd",
                 "relative.gguf", 42, str(ours)]
        result = await control.call(uris.node_uri("node01", uris.NODE_COLLECT_WEIGHTS), asked)
    finally:
        await port.stopListening()
        cluster.stop()

    assert result["removed"] == [str(ours)]
    assert not ours.exists()
    refused = result["refused"]
    assert set(refused) == {str(operator), str(outside), f"{weights}/../precious.gguf", str(link),
                            "/etc/passwd", "relative.gguf", "42"}
    for why in refused.values():
        assert why.startswith("refused")
    assert operator.read_bytes() == b"an operator's week of copying"
    assert outside.read_bytes() == b"not in the cache at all"
    assert os.path.islink(link)
    assert "refused to delete" in agent.output()
