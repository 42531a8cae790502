"""The hub over real mutual TLS on 127.0.0.1, with an in-process control plane that the tests drive."""

from __future__ import annotations

import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.types import ComponentConfig, RegisterOptions
from twisted.internet import defer, endpoints, reactor
from twisted.protocols.tls import TLSMemoryBIOFactory

from llmgw.huburl import HubAddress
from llmgw.link import uris
from llmgw.link.client import connect_once
from llmgw.link.hub import Hub
from llmgw.link.tls import server_options
from llmgw.tlsfiles import TLSFiles


def files(pki, name):
    return TLSFiles(str(pki / "ca.crt"), str(pki / f"{name}.crt"), str(pki / f"{name}.key"))


class Control(ApplicationSession):
    """Stands in for the control plane: attached in process, full rights."""

    def __init__(self, config):
        super().__init__(config)
        self.ready = defer.Deferred()
        self.events: list = []
        # The Deferreds "never" handed out, to see whether an INTERRUPT cancelled them.
        self.pending: list[defer.Deferred] = []

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        opts = RegisterOptions(details_arg="details")
        await self.register(lambda details=None: {"authid": details.caller_authid, "role": details.caller_authrole},
                            uris.CP_AGENT + "whoami", opts)
        await self.register(self._never, uris.CP_AGENT + "never")
        await self.register(lambda details=None: ["node list for " + details.caller_authid], uris.CP_NODES, opts)
        self.ready.callback(self)

    def _never(self):
        self.pending.append(defer.Deferred())
        return self.pending[-1]


class Joined(ApplicationSession):
    """A session attached in process (``Hub.attach_local``) that only joins: ``ready`` fires once it has."""

    def __init__(self, config):
        super().__init__(config)
        self.ready = defer.Deferred()

    def onConnect(self):
        self.join(self.config.realm)

    def onJoin(self, details):
        self.ready.callback(self)


async def serve(hub: Hub, pki, control: bool = True):
    """Listen for *hub* on a free port of 127.0.0.1 and attach a ``Control`` (unless not *control*); returns the port."""
    tls = TLSFiles(str(pki / "ca.crt"), str(pki / "llmgw-server.crt"), str(pki / "llmgw-server.key"))
    factory = TLSMemoryBIOFactory(server_options(tls), False, hub.websocket_factory())
    port = await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    hub.address = HubAddress(f"wss://127.0.0.1:{port.getHost().port}/", "127.0.0.1", port.getHost().port)
    if control:
        hub.control = Control(ComponentConfig(realm=uris.REALM))
        hub.attach_local(hub.control)
        await hub.control.ready.addTimeout(5, reactor)
    return port


async def close(hub: Hub, port) -> None:
    for session in list(hub.sessions.values()):
        session.drop()
    await port.stopListening()


@pytest_twisted.async_yield_fixture
async def hub(pki):
    hub = Hub(reactor)
    port = await serve(hub, pki)
    yield hub
    await close(hub, port)


async def join(hub, pki, name, **kw):
    return await connect_once(reactor, hub.address, files(pki, name), timeout=5, **kw)


