"""Dialling the hub: once (ctl) or forever (agents, the TUI, router workers).

A session class passed in is an autobahn ``ApplicationSession``; this module
only connects it over mutual TLS and says, in words, why a connection failed.
"""

from __future__ import annotations

import random
from typing import Callable

from autobahn.twisted.wamp import ApplicationSession
from autobahn.twisted.websocket import WampWebSocketClientFactory, WampWebSocketClientProtocol
from autobahn.wamp.types import ComponentConfig
from twisted.application.internet import ClientService
from twisted.internet import defer, endpoints, error
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger
from zope.interface import implementer

from llmgw.verbose import verbose_logs
from llmgw.errors import HubUnreachable
from llmgw.huburl import HubAddress
from llmgw.link import uris
from llmgw.link.hubs import SINGLE_HANDSHAKE_TIMEOUT_S, HubList
from llmgw.link.session import LinkJsonSerializer, NoDelay, PingWhenQuiet, quiet_cancellations, sweep_pings
from llmgw.link.tls import HubNameMismatch, client_options
from llmgw.tlsfiles import TLSFiles

log = Logger()


class _Protocol(NoDelay, PingWhenQuiet, WampWebSocketClientProtocol):
    def onMessage(self, payload, isBinary):
        self.heard()
        super().onMessage(payload, isBinary)

    def onOpen(self):
        super().onOpen()
        if self._session is not None:
            self._session.on("join", self._joined)
            self._session.on("leave", self._left)

    def _joined(self, session, details):
        notify = getattr(self.factory, "on_join", None)
        if notify is not None:
            notify()

    def _left(self, session, details):
        notify = getattr(self.factory, "on_leave", None)
        if notify is not None:
            notify(details)

    def connectionLost(self, reason):
        super().connectionLost(reason)
        notify = getattr(self.factory, "on_lost", None)
        if notify is not None:
            notify(reason)


def _factory(hub: HubAddress, make_session: Callable[[ComponentConfig], ApplicationSession],
             handshake_timeout_s: float = SINGLE_HANDSHAKE_TIMEOUT_S):
    config = ComponentConfig(realm=uris.REALM)
    factory = WampWebSocketClientFactory(lambda: quiet_cancellations(make_session(config)), url=hub.url, serializers=[LinkJsonSerializer()])
    factory.protocol = _Protocol
    factory.noisy = verbose_logs()  # "Starting factory" on every reconnect says nothing
    factory.setProtocolOptions(
        maxMessagePayloadSize=16 * 1024 * 1024,
        maxFramePayloadSize=16 * 1024 * 1024,
        autoPingInterval=10,
        autoPingTimeout=20,
        # autobahn gives up on TLS and the WebSocket upgrade after 5 s.  A hub
        # taking a whole fleet back after a restart can be slower than that;
        # a client that hangs up then only comes back to the queue it left,
        # and the hub sees its handshakes cut off (OpenSSL's "decode error").
        # The hub's own limit (link.hello_timeout_s, 10 s) decides instead;
        # a client of several hubs moves on sooner (``llmgw.link.hubs``).
        openHandshakeTimeout=handshake_timeout_s,
    )
    sweep_pings(factory)
    return factory


def _endpoint(reactor, hub: HubAddress, tls: TLSFiles, timeout: float):
    tcp = endpoints.HostnameEndpoint(reactor, hub.host, hub.port, timeout=timeout)
    return endpoints.wrapClientTLS(client_options(tls, hub.host), tcp)


class HubRefused(Exception):
    """The hub answered HELLO with ABORT; the text is its reason."""


RETRY_CEILING_S = 10.0


def jittered_backoff(rng: random.Random, initial: float = 1.0, maximum: float = RETRY_CEILING_S,
                     factor: float = 2.0) -> Callable[[int], float]:
    """Exponential backoff with wide jitter drawn from *rng*, so a fleet does not reconnect in lockstep.

    The ceiling is short because a restarted control plane waits only
    ``fleet.settle_s`` for the fleet before it places; a handshake every ten
    seconds per node is nothing to the hub.
    """

    def delay(attempt: int) -> float:
        ceiling = min(maximum, initial * factor ** min(attempt, 32))
        return rng.uniform(ceiling / 2, ceiling)

    return delay


class _Reconnecting(ClientService):
    # Its "Scheduling retry N to connect <_WrapperEndpoint object at 0x…>" names
    # nothing a person can act on; the retry policy below says why, in words.
    _log = Logger(observer=lambda event: None)


def client_service(reactor, hub: HubAddress | HubList, tls: TLSFiles, make_session,
                   rng: random.Random | None = None) -> ClientService:
    """A service that keeps a session to the hub open, reconnecting forever.

    *hub* may be a ``HubList``: the service dials its hubs in order, the
    next after each failed attempt, and the leader a standby names
    (``llmgw.link.hubs``).  Its backoff's jitter comes from *rng*; by
    default a generator of its own, seeded from the system, so that no two
    processes wait in step.
    """
    hubs = hub if isinstance(hub, HubList) else HubList([hub])
    dial = {address: _endpoint(reactor, address, tls, timeout=10) for address in hubs.hubs}
    return reconnecting(reactor, hubs, dial, _factory(hubs.current, make_session, hubs.handshake_timeout_s),
                        jittered_backoff(rng if rng is not None else random.Random()))


def reconnecting(clock, hub: HubAddress | HubList, endpoint, factory, backoff: Callable[[int], float]) -> ClientService:
    """*factory*'s session kept open over *endpoint*; each failed attempt logged with why and when the next is.

    The backoff counts attempts until a session joins, not until TCP
    connects: ClientService starts again on every accepted connection, so a
    hub that TLS refuses was dialled every second or so, forever.  With a
    ``HubList``, *endpoint* is a mapping of each hub to its endpoint; a
    failed attempt and a lost session move to the next hub (the lost one's
    server may be hung, and a standby sends the client back to a live
    leader at once), and a standby's refusal goes where
    ``HubList.after_refusal`` says.
    """
    hubs = hub if isinstance(hub, HubList) else HubList([hub])
    endpoints_of = endpoint if isinstance(endpoint, dict) else {hubs.current: endpoint}
    state = {"failures": 0, "why": None, "joined": False}

    def joined():
        state.update(failures=0, why=None, joined=True)

    def left(details):
        # An ABORT before WELCOME says why in words (the hub's sentence); keep it for the retry line.
        if not state["joined"] and details.message:
            state["why"] = HubRefused(f"the hub refused the session: {details.message}")

    def lost(reason):
        if state["joined"]:
            state["joined"] = False
            if hubs.refused:
                return  # the standby's refusal is the retry line's to say
            log.info("link to {hub} lost: {why}", hub=hubs.current.url, why=describe_failure(reason, hubs.current))
        elif not isinstance(state["why"], HubRefused):
            state["why"] = reason

    def refused(failure):
        state["why"] = failure
        return failure

    def retry(_attempts_since_tcp_connected: int) -> float:
        state["failures"] += 1
        moved = hubs.after_refusal()
        if moved is not None:
            said, at_once = moved
            state["why"] = None
            delay = 0.0 if at_once else backoff(hubs.refusals)
            log.info("{said} in {delay:.1f} s", said=said, delay=delay)
            return delay
        delay = backoff(state["failures"])
        was = hubs.current
        if hubs.several:
            hubs.advance()  # a failed attempt, or a session lost: the next hub
        if state["why"] is None:
            log.info("reconnecting to {hub} in {delay:.1f} s", hub=hubs.current.url, delay=delay)
        else:
            why = retry_reason(state["why"], was)
            state["why"] = None
            sep = "; " if ": " in why else ", "
            if hubs.current == was:
                log.info("{why}{sep}retrying in {delay:.1f} s", why=why, sep=sep, delay=delay)
            else:
                log.info("{why}{sep}trying {hub} in {delay:.1f} s", why=why, sep=sep, hub=hubs.current.url, delay=delay)
        return delay

    def connect(f):
        aim(factory, hubs.current)
        return endpoints_of[hubs.current].connect(f).addErrback(refused)

    factory.on_join = joined
    factory.on_leave = left
    factory.on_lost = lost
    return _Reconnecting(_Dialling(connect), factory, retryPolicy=retry, clock=clock)


def aim(factory, hub: HubAddress) -> None:
    """*factory*'s next WebSocket handshake names *hub* (its Host header and URL); all else as it was."""
    if factory.url != hub.url:
        factory.setSessionParameters(url=hub.url, origin=factory.origin, protocols=factory.protocols,
                                     useragent=factory.useragent, headers=factory.headers, proxy=factory.proxy)


@implementer(IStreamClientEndpoint)
class _Dialling:
    """*connect*, as an endpoint."""

    def __init__(self, connect):
        self.connect = connect


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


def retry_reason(reason, hub: HubAddress) -> str:
    """Why an attempt to reach the hub failed, for the line that says when the next one is."""
    value = getattr(reason, "value", reason)
    if isinstance(value, HubRefused):
        return str(value)
    if isinstance(value, error.ConnectionRefusedError):
        return f"connection refused by {hub.host}:{hub.port}"
    if isinstance(value, HubNameMismatch):
        return str(value)
    if isinstance(value, (error.TimeoutError, defer.TimeoutError)):
        return f"no answer from {hub.host}:{hub.port}"
    if isinstance(value, error.ConnectionDone):
        return f"the hub at {hub.url} closed the connection before a session opened"
    return f"cannot reach the hub at {hub.url}: {_words(value)}"


def describe_failure(reason, hub: HubAddress) -> str:
    value = getattr(reason, "value", reason)
    if isinstance(value, error.ConnectionDone):
        return f"the hub at {hub.url} closed the connection"
    return f"link to {hub.url} failed: {_words(value)}"


# What a hub's TLS alert about this client's certificate means, for a hub that does not say so in an ABORT.
_HUB_SAYS = {
    "certificate revoked": "the hub's revocation list names this certificate; issue a new one with "
                           "`llmgw pki issue DIR NAME --role ROLE --force` where the CA is",
    "certificate expired": "the hub says this certificate has expired (or is not valid yet: check the clocks); "
                           "issue a new one with `llmgw pki issue DIR NAME --role ROLE --force` where the CA is",
    "certificate required": "the hub needs a client certificate and this client sent none; give it one "
                            "from `llmgw pki issue`",
}


def _words(e: BaseException) -> str:
    from OpenSSL import SSL

    if isinstance(e, SSL.Error):
        details = "; ".join(part[-1] for part in (e.args[0] if e.args else []) if isinstance(part, tuple)) or str(e)
        for alert, meaning in _HUB_SAYS.items():
            if alert in details:
                return f"TLS handshake failed ({details}): {meaning}"
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
