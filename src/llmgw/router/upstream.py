"""Persistent HTTP/1.1 connections to the engines, pooled per (host, port).

An engine connection is opened once and carries one request after another:
opening one costs a handshake and a slot in the engine's accept loop, which at
a few thousand requests a second is most of what a router in front could save.
Connections are kept last-in first-out (the most recently used first, so a quiet
period lets the oldest ones age out), at most ``max_idle_per_endpoint`` of them
idle per engine, and each is closed after ``idle_timeout_s`` unused: shorter than
the keep-alive timeout of the engines' HTTP servers (uvicorn's is 5 s), so the
router, not the engine, closes a quiet connection and a request is rarely sent
on one the engine is closing at that very moment.

``TCP_NODELAY`` is set on every connection: a reused connection that waits for
the ACK of the previous response before sending a small request stalls ~40 ms
(Nagle with delayed ACKs).

While a response is relayed, the connection is the *producer* of the client's
transport (``IPushProducer``): when the client reads slowly, the client
transport's buffer fills, it pauses this producer, and the router stops reading
from the engine; the engine's own socket buffers fill and it stops writing.
Memory per stream stays at about one socket read plus the transport's buffer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from twisted.internet import defer, error, tcp
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from llmgw.router.response import ResponseParser

if TYPE_CHECKING:
    from llmgw.router.proxy import Exchange

log = Logger()

MAX_IDLE_PER_ENDPOINT = 64
# Both the size of one read from a socket and how much a transport holds
# before it pauses its producer (Twisted uses one attribute for both).  What
# a stream to a client that does not read costs: about two of these.
RELAY_BUFFER_BYTES = 16 * 1024
IDLE_TIMEOUT_S = 4.0
CONNECT_TIMEOUT_S = 5.0


@implementer(IPushProducer)
class UpstreamConnection(Protocol):
    """One connection to an engine: idle in the pool, or carrying one exchange's request and response."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int], made: defer.Deferred | None):
        self.pool = pool
        self.key = key
        self.parser = ResponseParser()
        self.exchange: Exchange | None = None
        self.requests = 0
        self.idle_since = 0.0
        self.paused = False
        self.pauses = 0
        self.lost = False
        # Counted in the pool's open connections (from connectionMade to connectionLost).
        self.counted = False
        self._made = made
        # When the exchange's wait on the engine ends (inf: stopped), and the
        # one call that checks it: moving a deadline later costs no timer.
        self.deadline = math.inf
        self._timer = None

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.transport.bufferSize = RELAY_BUFFER_BYTES
        self.pool.made(self.key)
        self.counted = True
        made, self._made = self._made, None
        if made is not None:
            made.callback(self)

    def dataReceived(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.upstream_data(data)
        else:
            # An idle engine connection has nothing to say; one that does is
            # out of step with its requests and cannot be trusted again.
            self.transport.abortConnection()

    def connectionLost(self, reason=None) -> None:
        self.lost = True
        if self.counted:
            self.pool.closed(self.key)
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.upstream_lost(self, reason)
        else:
            self.pool.discard(self)

    def send(self, exchange: Exchange, data: bytes) -> None:
        self.exchange = exchange
        self.requests += 1
        self.parser.reset()
        write_now(self.transport, data)

    def watch(self, clock, seconds: float) -> None:
        """Call the exchange's ``timed_out`` unless ``deadline`` is moved on within ``seconds``."""
        deadline = self.deadline = clock.seconds() + seconds
        timer = self._timer
        if timer is None:
            self._timer = clock.callLater(seconds, self._check, clock)
        elif timer.getTime() > deadline:
            timer.reset(seconds)

    def _check(self, clock) -> None:
        self._timer = None
        exchange = self.exchange
        if exchange is None or self.lost or self.deadline == math.inf:
            return
        left = self.deadline - clock.seconds()
        if left > 0:
            self._timer = clock.callLater(left, self._check, clock)
        else:
            exchange.timed_out()

    def detach(self) -> None:
        """The exchange is done with this connection; it must be reading again before it idles."""
        self.exchange = None
        if self.paused:
            self.paused = False
            self.transport.resumeProducing()

    def abort(self) -> None:
        """Close now, dropping what is unsent: the engine sees its client go and stops generating."""
        self.exchange = None
        if not self.lost:
            self.transport.abortConnection()

    # IPushProducer, for the client's transport

    def pauseProducing(self) -> None:
        if not self.paused and not self.lost:
            self.paused = True
            self.pauses += 1
            self.transport.pauseProducing()
            if self.exchange is not None:
                self.exchange.writes_paused()

    def resumeProducing(self) -> None:
        if self.paused and not self.lost:
            self.paused = False
            self.transport.resumeProducing()
            if self.exchange is not None:
                self.exchange.writes_resumed()

    def stopProducing(self) -> None:
        # The client's connection is gone; its protocol tells the exchange,
        # which aborts this connection.
        pass


class _Connecting(ClientFactory):
    noisy = False

    def __init__(self, pool: UpstreamPool, key: tuple[str, int], d: defer.Deferred):
        self.pool = pool
        self.key = key
        self.d = d

    def buildProtocol(self, addr) -> UpstreamConnection:
        self.pool.opened += 1
        return UpstreamConnection(self.pool, self.key, self.d)

    def clientConnectionFailed(self, connector, reason) -> None:
        if not self.d.called:
            self.d.errback(reason)


class UpstreamPool:
    """Idle engine connections by (host, port), and new ones when none is idle."""

    def __init__(
        self,
        reactor,
        *,
        max_idle_per_endpoint: int = MAX_IDLE_PER_ENDPOINT,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ):
        self._reactor = reactor
        self.max_idle_per_endpoint = max_idle_per_endpoint
        self.idle_timeout_s = idle_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self._reaper: LoopingCall | None = None
        self._closed = False
        # Connections opened over the pool's life: what a test of reuse counts.
        self.opened = 0
        # Connections open now, idle or carrying a request, by (host, port).
        self._open: dict[tuple[str, int], int] = {}

    def idle(self, host: str, port: int) -> int:
        """How many connections to (host, port) are idle now."""
        return len(self._idle.get((host, port), ()))

    def open(self, host: str, port: int) -> int:
        """How many connections to (host, port) are open now, idle ones included."""
        return self._open.get((host, port), 0)

    def made(self, key: tuple[str, int]) -> None:
        self._open[key] = self._open.get(key, 0) + 1

    def closed(self, key: tuple[str, int]) -> None:
        n = self._open.get(key, 0) - 1
        if n > 0:
            self._open[key] = n
        else:
            self._open.pop(key, None)

    def take(self, host: str, port: int) -> UpstreamConnection | None:
        """The most recently used idle connection to (host, port), or None."""
        idle = self._idle.get((host, port))
        if not idle:
            return None
        conn = idle.pop()
        if self._reactor.seconds() - conn.idle_since > self.idle_timeout_s:
            # Past its time (the reaper has not run yet): so are all below it.
            for old in (conn, *idle):
                old.transport.loseConnection()
            idle.clear()
            return None
        return conn

    def connect(self, host: str, port: int) -> defer.Deferred[UpstreamConnection]:
        d: defer.Deferred[UpstreamConnection] = defer.Deferred()
        self._reactor.connectTCP(host, port, _Connecting(self, (host, port), d), timeout=self.connect_timeout_s)
        return d

    def give_back(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request to its engine, or close it when the pool is full."""
        conn.detach()
        if conn.lost:
            return
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = []
        if self._closed or len(idle) >= self.max_idle_per_endpoint:
            conn.transport.loseConnection()
            return
        conn.idle_since = self._reactor.seconds()
        idle.append(conn)
        if self._reaper is None:
            self._reaper = LoopingCall(self._reap)
            self._reaper.clock = self._reactor
            self._reaper.start(self.idle_timeout_s / 2, now=False)

    def discard(self, conn: UpstreamConnection) -> None:
        """``conn`` closed while idle."""
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _reap(self) -> None:
        oldest = self._reactor.seconds() - self.idle_timeout_s
        for key, idle in list(self._idle.items()):
            stale = 0
            while stale < len(idle) and idle[stale].idle_since < oldest:
                stale += 1
            if stale:
                old, idle[:stale] = idle[:stale], []
                for conn in old:
                    conn.transport.loseConnection()
            if not idle:
                del self._idle[key]

    def close(self) -> None:
        """Close every idle connection and keep none from now on (connections in use finish their exchange)."""
        self._closed = True
        if self._reaper is not None and self._reaper.running:
            self._reaper.stop()
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.loseConnection()
        self._idle.clear()


_PLAIN_TCP = (tcp.Server, tcp.Client)


def write_now(transport, data: bytes) -> None:
    """``transport.write(data)``, but sent at once when nothing waits to be sent before it.

    Twisted queues every write until the reactor's next turn, and registering
    for and unregistering from writability costs two ``epoll_ctl`` calls and a
    turn of the loop per write: a tenth of the router's CPU per request and a
    loop turn of latency.  Sending at once when the transport's buffer is empty
    keeps the order of bytes; whatever the socket does not take now, and any
    error, goes the usual way.  Only for Twisted's plain TCP transports, whose
    buffer this reads (TLS and others fall back to ``write``).
    """
    if transport.__class__ not in _PLAIN_TCP or transport._tempDataLen or transport.dataBuffer or transport.disconnecting or not transport.connected:
        transport.write(data)
        return
    try:
        sent = transport.socket.send(data)
    except OSError:
        sent = 0
    if sent < len(data):
        transport.write(data[sent:] if sent else data)


def engine_head(target: str, length: int, request_id: str, content_type: str | None = None) -> bytes:
    """The request line and fields for the engine, but Host (added per engine) and the blank line.

    ``content_type``: None for JSON, the common case, which costs one format.
    """
    if content_type is None and request_id:
        return _JSON_HEAD % (target.encode("latin-1"), length, request_id.encode())
    head = b"POST %s HTTP/1.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        target.encode("latin-1"), (content_type or "application/json").encode("latin-1"), length)
    return head + b"X-Request-Id: %s\r\n" % request_id.encode() if request_id else head


_JSON_HEAD = b"POST %s HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Request-Id: %s\r\n"


def with_fields(head: bytes, fields: bytes) -> bytes:
    """``head`` (a status line first) with ``fields`` after its status line."""
    return head.replace(b"\n", b"\n" + fields, 1) if fields else head


def failure_kind(reason) -> str:
    """A word for why a connection to an engine failed, for metrics: refused, timeout or failed."""
    exc = getattr(reason, "value", reason)
    if isinstance(exc, error.ConnectionRefusedError):
        return "refused"
    if isinstance(exc, (error.TimeoutError, defer.TimeoutError)):
        return "timeout"
    return "failed"
