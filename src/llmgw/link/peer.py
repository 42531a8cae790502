"""One client of the hub as the hub sees it: its identity, its peer address, its WebSocket.

``HubSession`` is what autobahn's server protocol drives (``HubProtocol``
hands it raw frames and pongs); it keeps what the hub needs to know about
one peer — what it announced in HELLO, its subscriptions, its invocation
ids — and passes every message to its ``Hub``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import attrs
from autobahn.exception import Disconnected
from autobahn.twisted.websocket import WampWebSocketServerProtocol
from autobahn.wamp import message
from autobahn.wamp.exception import TransportLost
from twisted.internet import defer

from llmgw.link.session import NoDelay, PingWhenQuiet

if TYPE_CHECKING:
    from llmgw.link.hub import Hub

# What a client may send once its session is open.  Anything else (a WELCOME,
# an EVENT, a second HELLO) is a protocol violation and ends the session.
_CLIENT_MESSAGES = (
    message.Goodbye,
    message.Abort,
    message.Register,
    message.Unregister,
    message.Call,
    message.Cancel,
    message.Yield,
    message.Error,
    message.Subscribe,
    message.Unsubscribe,
    message.Publish,
)


@attrs.frozen
class SessionIdentity:
    """Who a hub session is: its WAMP authid and authrole, from its certificate or ``attach_local``."""

    authid: str
    role: str
    # When the certificate that proved it expires (seconds since the epoch);
    # None for a local session.  Not part of who it is.
    not_after: float | None = attrs.field(default=None, eq=False)


class HubSession:
    """One client's session, remote (over WebSocket) or local (the control plane)."""

    def __init__(self, hub: Hub, identity: SessionIdentity | None = None):
        self._hub = hub
        self._identity = identity
        self._transport = None
        self._session_id: int | None = None
        self._authid: str | None = None
        self.peer = "in process"
        # Announced in HELLO: a callee that did not may not be sent INTERRUPT.
        self.cancellable = False
        self.hello_seen = False
        self.hello_timer = None
        self.subscriptions: set[int] = set()
        self._invocation_ids = 0
        self._pings: dict[bytes, defer.Deferred] = {}

    # -- the ISession side autobahn's WebSocket protocol drives --

    def onOpen(self, transport) -> None:
        self._transport = transport
        tcp = getattr(transport, "transport", None)
        if tcp is not None:
            address = tcp.getPeer()
            self.peer = f"{getattr(address, 'host', address)}:{getattr(address, 'port', '')}"
        if self._identity is None:
            self._identity = self._hub._identity_from(transport)
        self._hub._opened(self)

    def onFrame(self, payload: bytes, is_binary: bool) -> None:
        self._hub._frame(self, payload, is_binary)

    def onMessage(self, msg) -> None:
        if self._session_id is None:
            self._hub._hello(self, msg)
        elif isinstance(msg, _CLIENT_MESSAGES):
            self._hub._dispatch(self, msg)
        elif isinstance(msg, message.Hello):
            self._hub._violation(self, "HELLO after the session was established")
        else:
            self._hub._violation(self, f"a client may not send {type(msg).__name__.upper()}")

    def onPong(self, payload: bytes) -> None:
        waiting = self._pings.pop(payload, None)
        if waiting is not None and not waiting.called:
            waiting.callback(True)

    def onClose(self, wasClean: bool) -> None:
        self._hub._left(self)
        self._transport = None
        for waiting in self._pings.values():
            if not waiting.called:
                waiting.callback(False)
        self._pings.clear()

    # -- used by the hub --

    @property
    def authid(self) -> str | None:
        return self._authid

    @property
    def role(self) -> str | None:
        return self._identity.role if self._identity else None

    @property
    def not_after(self) -> float | None:
        return self._identity.not_after if self._identity else None

    @property
    def transport(self):
        """The WebSocket protocol this session speaks through; None in process or once closed."""
        return self._transport

    @property
    def session_id(self) -> int | None:
        return self._session_id

    @property
    def open(self) -> bool:
        return self._transport is not None and self._transport.isOpen()

    def next_invocation_id(self) -> int:
        # INVOCATION.Request is session-scope: 1, 2, 3... per callee.
        self._invocation_ids += 1
        return self._invocation_ids

    def ping(self, clock, timeout: float) -> defer.Deferred:
        """Fires True if the peer answers a WebSocket ping within *timeout* seconds, else False."""
        send = getattr(self._transport, "sendPing", None)
        if send is None:
            return defer.succeed(self.open)  # in process: alive while open
        payload = os.urandom(8)
        answered = defer.Deferred()
        self._pings[payload] = answered

        def silent():
            self._pings.pop(payload, None)
            if not answered.called:
                answered.callback(False)

        timer = clock.callLater(timeout, silent)

        def done(alive):
            if timer.active():
                timer.cancel()
            return alive

        answered.addCallback(done)
        send(payload)
        return answered

    def send(self, msg) -> None:
        if self._transport is not None and self._transport.isOpen():
            try:
                self._transport.send(msg)
            except (Disconnected, TransportLost):
                pass  # the peer is gone; its onClose cleans up

    def drop(self) -> None:
        if self._transport is not None and self._transport.isOpen():
            self._transport.close()

    def __repr__(self) -> str:
        who = f"{self.role}:{self._authid}" if self._authid else "(no session)"
        return f"<session {self._session_id} {who} from {self.peer}>"


class HubProtocol(NoDelay, PingWhenQuiet, WampWebSocketServerProtocol):
    """autobahn's server protocol with frames parsed by the hub, pongs passed on, and pings only on a quiet link."""

    def _onOpen(self) -> None:
        # autobahn's fills its transport details with the peer certificate's
        # fingerprints, subject and issuer here, for sessions that read them:
        # 6 % of a registering fleet's server time.  The hub reads the
        # certificate itself (``Hub._identity_from``), and its sessions are
        # not autobahn's.
        self.onOpen()

    def dataReceived(self, data: bytes) -> None:
        # autobahn's formats a debug line's arguments (hltype, hlval) for every
        # chunk read, logged or not: 1.4 % of the server at 10,000 nodes.
        self._dataReceived(data)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.heard()
        if self._session is not None:
            self._session.onFrame(payload, isBinary)

    def onPong(self, payload: bytes) -> None:
        if self._session is not None:
            self._session.onPong(payload)
