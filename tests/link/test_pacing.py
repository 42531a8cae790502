"""Arrivals paced by the link's ConnectionBudget: at most ``link.max_handshakes`` connections in their handshakes.

Real sockets and mutual TLS on 127.0.0.1: connections that connect and then
say nothing hold their handshake open, so the test decides when each ends.
"""

from __future__ import annotations

import pytest_twisted
from autobahn.wamp.types import ComponentConfig
from twisted.internet import defer, endpoints, protocol, reactor
from twisted.protocols.tls import TLSMemoryBIOFactory

from llmgw.huburl import HubAddress
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.link.tls import server_options
from llmgw.process.common import ConnectionBudget
from llmgw.tlsfiles import TLSFiles
from tests.link.conftest import Control, join
from tests.support.wait import until


async def _paced_hub(pki, max_pending: int):
    hub = Hub(reactor)
    tls = TLSFiles(str(pki / "ca.crt"), str(pki / "llmgw-server.crt"), str(pki / "llmgw-server.key"))
    budget = ConnectionBudget(100, "listen.link (link.max_connections)", max_pending)
    budget.wrap(TLSMemoryBIOFactory(server_options(tls), False, hub.websocket_factory()))
    port = budget.listening(await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(budget))
    hub.admitted = budget.admit
    hub.address = HubAddress(f"wss://127.0.0.1:{port.getHost().port}/", "127.0.0.1", port.getHost().port)
    hub.control = Control(ComponentConfig(realm=uris.REALM))
    hub.attach_local(hub.control)
    await hub.control.ready.addTimeout(5, reactor)
    return hub, budget, port


async def _silent(port):
    """A TCP connection that never starts its TLS handshake."""
    where = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)
    return await where.connect(protocol.Factory.forProtocol(protocol.Protocol))


@pytest_twisted.ensureDeferred
async def test_the_port_stops_accepting_while_max_handshakes_are_open_and_takes_the_next_when_one_ends(pki):
    hub, budget, port = await _paced_hub(pki, max_pending=2)
    silent = [await _silent(port), await _silent(port)]
    try:
        await until(lambda: len(budget.pending) == 2, "the hub to accept both silent connections")
        assert port not in reactor.getReaders()
        assert budget.paused == 1
        # A real agent arrives now: it waits in the kernel's queue, not in the hub.
        joining = defer.ensureDeferred(join(hub, pki, "node01"))
        assert not joining.called and len(budget.pending) == 2
        silent.pop().transport.loseConnection()
        await until(lambda: port in reactor.getReaders(), "the port to accept again")
        session = await joining
        assert session.is_attached()
        # Welcomed: its handshakes are over, so it is no longer pending.
        assert len(budget.pending) == 1
        assert budget.held == 2
        session.leave()
    finally:
        for s in silent:
            s.transport.loseConnection()
        for session in list(hub.sessions.values()):
            session.drop()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_welcomed_session_is_no_longer_pending(pki):
    hub, budget, port = await _paced_hub(pki, max_pending=1)
    try:
        first = await join(hub, pki, "node01")
        assert budget.pending == set()
        assert port in reactor.getReaders()  # the one pending place is free again
        second = await join(hub, pki, "node02")
        assert second.is_attached() and first.is_attached()
        assert budget.paused == 2  # each arrival filled the one place while it shook hands
    finally:
        for session in list(hub.sessions.values()):
            session.drop()
        await port.stopListening()


def test_the_link_listens_with_a_deep_accept_queue_unless_listen_link_says_otherwise():
    from llmgw.process.server import LINK_BACKLOG, link_endpoint

    assert LINK_BACKLOG > 50  # Twisted's default, which a reconnecting fleet overflows
    assert link_endpoint(reactor, "ssl:7443:interface=127.0.0.1")._backlog == LINK_BACKLOG
    assert link_endpoint(reactor, "ssl:7443:backlog=128:interface=127.0.0.1")._backlog == 128
