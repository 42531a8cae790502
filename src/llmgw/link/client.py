"""Dialling the hub: once (ctl) or forever (agents, the TUI, router workers).

A session class passed in is an autobahn ``ApplicationSession``; this module
only connects it over mutual TLS and says, in words, why a connection failed.
"""

from __future__ import annotations

import random
from typing import Callable

from autobahn.twisted.wamp import ApplicationSession
from autobahn.twisted.websocket import WampWebSocketClientFactory, WampWebSocketClientProtocol
from autobahn.wamp.serializer import JsonSerializer
from autobahn.wamp.types import ComponentConfig
from twisted.application.internet import ClientService
from twisted.internet import defer, endpoints, error
from twisted.logger import Logger

from llmgw.config.common import verbose_logs
from llmgw.errors import HubUnreachable
from llmgw.huburl import HubAddress
from llmgw.link import uris
from llmgw.link.tls import client_options
from llmgw.tlsfiles import TLSFiles

log = Logger()


class _Protocol(WampWebSocketClientProtocol):
    def connectionLost(self, reason):
        super().connectionLost(reason)
        notify = getattr(self.factory, "on_lost", None)
        if notify is not None:
            notify(reason)


def _factory(hub: HubAddress, make_session: Callable[[ComponentConfig], ApplicationSession]):
    config = ComponentConfig(realm=uris.REALM)
    factory = WampWebSocketClientFactory(lambda: make_session(config), url=hub.url, serializers=[JsonSerializer()])
    factory.protocol = _Protocol
    factory.noisy = verbose_logs()  # "Starting factory" on every reconnect says nothing
    factory.setProtocolOptions(
        maxMessagePayloadSize=16 * 1024 * 1024,
        maxFramePayloadSize=16 * 1024 * 1024,
        autoPingInterval=10,
        autoPingTimeout=20,
    )
    return factory


def _endpoint(reactor, hub: HubAddress, tls: TLSFiles, timeout: float):
    tcp = endpoints.HostnameEndpoint(reactor, hub.host, hub.port, timeout=timeout)
    return endpoints.wrapClientTLS(client_options(tls, hub.host), tcp)


def jittered_backoff(initial: float = 1.0, maximum: float = 10.0, factor: float = 2.0) -> Callable[[int], float]:
    """Exponential backoff with wide jitter, so a fleet does not reconnect in lockstep.

    The ceiling is short because a restarted control plane waits only
    ``fleet.settle_s`` for the fleet before it places; a handshake every ten
    seconds per node is nothing to the hub.
    """

    def delay(attempt: int) -> float:
        ceiling = min(maximum, initial * factor ** min(attempt, 32))
        return random.uniform(ceiling / 2, ceiling)

    return delay


def client_service(reactor, hub: HubAddress, tls: TLSFiles, make_session) -> ClientService:
    """A service that keeps a session to the hub open, reconnecting forever."""
    factory = _factory(hub, make_session)
    factory.on_lost = lambda reason: log.info(
        "link to {hub} lost: {why}", hub=hub.url, why=describe_failure(reason, hub)
    )
    return ClientService(_endpoint(reactor, hub, tls, timeout=10), factory, retryPolicy=jittered_backoff(), clock=reactor)


class OneShotSession(ApplicationSession):
    """A session that reports, once, whether it joined or why it did not."""

    def __init__(self, config, outcome: defer.Deferred):
        super().__init__(config)
        self._outcome = outcome

    def onConnect(self):
        self.join(self.config.realm)

    def onJoin(self, details):
        if not self._outcome.called:
            self._outcome.callback(self)

    def onLeave(self, details):
        if not self._outcome.called:
            self._outcome.errback(HubUnreachable(f"the hub refused the session: {details.message or details.reason}"))
        self.disconnect()


async def connect_once(reactor, hub: HubAddress, tls: TLSFiles, timeout: float = 5.0) -> OneShotSession:
    """Open one session to the hub, or raise ``HubUnreachable`` within *timeout*."""
    outcome: defer.Deferred = defer.Deferred()

    def lost(reason):
        if not outcome.called:
            outcome.errback(HubUnreachable(describe_failure(reason, hub)))

    factory = _factory(hub, lambda config: OneShotSession(config, outcome))
    factory.on_lost = lost
    outcome.addTimeout(timeout, reactor)
    try:
        await _endpoint(reactor, hub, tls, timeout).connect(factory)
    except defer.CancelledError:
        raise HubUnreachable(f"cannot reach the hub at {hub.url}: no answer within {timeout:g} s") from None
    except Exception as e:
        if not outcome.called:
            outcome.cancel()
        outcome.addErrback(lambda _: None)
        raise HubUnreachable(f"cannot reach the hub at {hub.url}: {_words(e)}") from None
    try:
        return await outcome
    except defer.TimeoutError:
        raise HubUnreachable(
            f"the hub at {hub.url} accepted the connection but opened no session within {timeout:g} s"
        ) from None


def describe_failure(reason, hub: HubAddress) -> str:
    value = getattr(reason, "value", reason)
    if isinstance(value, error.ConnectionDone):
        return f"the hub at {hub.url} closed the connection"
    return f"link to {hub.url} failed: {_words(value)}"


def _words(e: BaseException) -> str:
    from OpenSSL import SSL

    if isinstance(e, SSL.Error):
        details = "; ".join(part[-1] for part in (e.args[0] if e.args else []) if isinstance(part, tuple)) or str(e)
        return (
            f"TLS handshake failed ({details}): check that the CA file is the cluster CA "
            "and that the certificate and key were issued by it"
        )
    if isinstance(e, error.ConnectionRefusedError):
        return "connection refused (is the server running and listening there?)"
    if isinstance(e, error.DNSLookupError):
        return f"cannot resolve the host name ({e})"
    if isinstance(e, error.ConnectionLost) and e.args and hasattr(e.args[0], "value"):
        return _words(e.args[0].value)
    return str(e) or type(e).__name__
