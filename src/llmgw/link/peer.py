"""One client of the hub as the hub sees it: its identity, its peer address, its WebSocket.

``HubSession`` is what autobahn's server protocol drives (``HubProtocol``
hands it raw frames and pongs); it keeps what the hub needs to know about
one peer — what it announced in HELLO, its subscriptions, its invocation
ids — and passes every message to its ``Hub``.
"""

from __future__ import annotations

import http
import os
from typing import TYPE_CHECKING

import attrs
import txaio
from autobahn.exception import Disconnected
from autobahn.twisted.websocket import WampWebSocketServerProtocol
from autobahn.wamp import message
from autobahn.wamp.exception import SerializationError, TransportLost
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.link.session import NoDelay, PingWhenQuiet
from llmgw.link.tls import SessionRefusal

if TYPE_CHECKING:
    from llmgw.link.hub import Hub

log = Logger()

_OPEN = WebSocketProtocol.STATE_OPEN

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
        self.refusal: SessionRefusal | None = None  # why its certificate gets no session, for the ABORT answering HELLO
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
            found = self._hub._identity_from(transport)
            self._identity, self.refusal = (None, found) if isinstance(found, SessionRefusal) else (found, None)
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

    #: Whole frames read, and messages sent, by the hub's own framing (``processData``, ``send``); False: autobahn's always.
    own_framing = True

    def dataReceived(self, data: bytes) -> None:
        # autobahn's formats a debug line's arguments (hltype, hlval) for every
        # chunk read, logged or not: 1.4 % of the server at 10,000 nodes.
        self._dataReceived(data)

    # autobahn reads a frame through nine methods (a frame's header, its data,
    # its end, a message's begin, its frames, its end...) and makes an
    # unmasking object for each, and sends a message through four that format
    # a debug line's arguments on every call: about a sixth of the hub's time
    # per heartbeat at 5,000 nodes (py-spy, bench/fleet.py).  Nearly every
    # message on the link is one whole, masked, uncompressed text frame, read
    # in one piece, and one unfragmented frame out: the hub reads and writes
    # those itself, with the same checks and counters, and hands every other
    # case (a fragment, a control frame, a frame not yet all here, too long,
    # not UTF-8, anything unexpected) to autobahn as it is, whose answer
    # (its close codes, its violations) is then the same as ever.

    def processData(self) -> bool:
        if (self.own_framing and self.current_frame is None and not self.inside_message and self.state == _OPEN
                and not self.failedByMe and self._perMessageCompress is None and not self.trackedTimings
                and not self.logFrames):
            taken = self._whole_text_frame()
            if taken is not None:
                return taken
        return super().processData()

    def _whole_text_frame(self) -> bool | None:
        """One whole, final, masked text frame from the buffer to ``onMessage``; None: autobahn's to read."""
        data = self.data
        if len(data) < 6 or data[0] != 0x81 or not data[1] & 0x80:
            return None  # not here yet, a fragment, not text, a control frame, unmasked: autobahn's
        length = data[1] & 0x7F
        if length < 126:
            start = 6
        elif length == 126 and len(data) >= 8:
            length = (data[2] << 8) | data[3]
            if length < 126:
                return None  # not the shortest form: autobahn's violation
            start = 8
        else:
            return None  # 64 KiB or more, or its length not here yet
        end = start + length
        if len(data) < end or 0 < self.maxFramePayloadSize < length or 0 < self.maxMessagePayloadSize < length:
            return None
        payload = unmask(data[start:end], data[start - 4:start]) if self.applyMask else data[start:end]
        if self.utf8validateIncoming:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                return None  # autobahn's validator finds it and closes with its code
        self.data = data[end:]
        stats = self.trafficStats
        stats.incomingOctetsWebSocketLevel += length
        stats.incomingOctetsAppLevel += length
        stats.incomingWebSocketFrames += 1
        stats.incomingWebSocketMessages += 1
        if self.autoPingTimeoutCall and self.autoPingRestartOnAnyTraffic:
            self._cancelAutoPingTimeoutCall()
        self._onMessage(payload, False)
        if self._listeners is not None or self._parent is not None:
            fired = self.fire("message", payload, is_binary=False)
            txaio.add_callbacks(fired, None, lambda f: log.error("Firing signal 'message' failed: {f}", f=f))
        return len(self.data) > 0

    def send(self, msg) -> None:
        if self._session is None:
            raise TransportLost()
        try:
            payload, is_binary = self._serializer.serialize(msg)
        except Exception as e:
            log.error("WAMP message serialization error: {e}", e=e)
            raise SerializationError(f"WAMP message serialization error: {e}") from e
        n = len(payload)
        if (not self.own_framing or n > 0xFFFF or self.state != _OPEN or self._perMessageCompress is not None
                or self.send_queue or self.trackedTimings or self.logFrames or self.logOctets or self.maskServerFrames
                or 0 < self.autoFragmentSize < n or 0 < self.maxMessagePayloadSize < n):
            self.sendMessage(payload, is_binary)
            return
        first = 0x82 if is_binary else 0x81
        frame = (bytes((first, n)) if n < 126 else bytes((first, 126, n >> 8, n & 0xFF))) + payload
        self.transport.write(frame)
        stats = self.trafficStats
        stats.outgoingWebSocketMessages += 1
        stats.outgoingOctetsAppLevel += n
        stats.outgoingOctetsWebSocketLevel += n
        stats.outgoingWebSocketFrames += 1
        stats.outgoingOctetsWireLevel += len(frame)

    def failHandshake(self, reason: str, code: int = 400, responseHeaders=None) -> None:
        """autobahn's refusal of a WebSocket opening handshake, its words logged and the peer told in llmgw's.

        autobahn puts its reason in the status line (an exception's text,
        for an extension it could not parse); the peer gets the status's own
        phrase and a sentence saying what this port is.
        """
        log.info("refused a WebSocket opening handshake from {peer}: {why}", peer=self.peer, why=reason)
        self.wasNotCleanReason = reason
        self.sendHttpErrorResponse(code, _PHRASES.get(code, "Bad Request"), responseHeaders, body=NOT_A_LINK_CLIENT)
        self.dropConnection(abort=False)

    def sendHttpErrorResponse(self, code, reason, responseHeaders=None, body: str = "") -> None:
        head = f"HTTP/1.1 {code} {reason}\r\n" + "".join(f"{h}: {v}\r\n" for h, v in responseHeaders or ())
        data = body.encode()
        head += f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(data)}\r\n\r\n"
        self.sendData(head.encode() + data)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.heard()
        if self._session is not None:
            self._session.onFrame(payload, isBinary)

    def onPong(self, payload: bytes) -> None:
        if self._session is not None:
            self._session.onPong(payload)


NOT_A_LINK_CLIENT = ("This is llmgw's link port: WAMP (wamp.2.json) over WebSocket, over TLS with a client "
                     "certificate from the cluster CA, for llmgw's agents, ctl, TUI and routers.\n")
_PHRASES = {status.value: status.phrase for status in http.HTTPStatus}


def unmask(payload: bytes, mask: bytes) -> bytes:
    """*payload* XORed with the four bytes of *mask*, repeated (RFC 6455, 5.3)."""
    n = len(payload)
    if not n:
        return payload
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")
