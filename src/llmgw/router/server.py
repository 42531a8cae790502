"""The router's HTTP/1.1 server: OpenAI's routes on a raw Twisted ``Protocol``.

Why not twisted.web: see ``llmgw.router.proxy``.  A connection serves one
request at a time, in order: requests a client pipelines wait in the parser's
buffer (reading pauses past ``PIPELINE_LIMIT``) and are answered after the one
in progress.  HTTP/1.0 clients are answered and the connection closed.  A
request that cannot be read is answered 400/413/431/501/505 in OpenAI's error
shape and the connection closed, after reading and dropping what the client
still sends for ``LINGER_S`` (closing with unread bytes makes the kernel reset
the connection, which can destroy the answer before the client reads it).

A client is on a clock and a budget (``router.clients``, docs/router.rst
"Limits"): idle between requests, reading a head, reading a body, and not
reading its answers each have a limit, and connections over
``max_connections`` are answered 503 and closed.  HEAD is answered as GET
would be, without the body.  ``llmgw.router.door`` says whom the API answers
at all (a key-less one: only requests for its own names).

The routes, and how a request is read to route it: ``llmgw.router.routes``.
Every answer carries the request's id (``llmgw.router.requestid``) and, for a
page ``router.cors`` allows, CORS fields (``llmgw.router.cors``).  Every answer
the router makes itself is an OpenAI error, ``{"error": {"message", "type",
"param", "code", "request_id"}}``; ``answer_error`` is the one place that turns
a ``RouterError`` into a response.
"""

from __future__ import annotations

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from zope.interface import implementer

from llmgw.config.routing import ClientLimits
from llmgw.http11 import BadRequest, DateHeader, ParsedRequest, RequestParser, response_bytes
from llmgw.router import errors
from llmgw.router.contract import Admitter, Metrics
from llmgw.router.cors import no_content
from llmgw.router.deadlines import BETWEEN_BYTES_TIMEOUT_S, FIRST_BYTE_TIMEOUT_S
from llmgw.router.door import Door, OverCapacity
from llmgw.router.metrics import NullMetrics, rejection_reason
from llmgw.router.proxy import MAX_ATTEMPTS, Exchange
from llmgw.router.requestid import error_json, id_field, request_id
from llmgw.router.routes import MODELS, PROXIED, Unroutable, model_list, model_object, not_found, read_info
from llmgw.router.stall import StallWatch, limit_unsent
from llmgw.router.upstream import CONNECT_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_IDLE_PER_ENDPOINT, RELAY_BUFFER_BYTES, UpstreamPool

log = Logger()

PIPELINE_LIMIT = 256 * 1024
LINGER_S = 2.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n"


@implementer(IPushProducer)
class RouterProtocol(Protocol):
    """One client connection.

    Between relays the protocol is its own transport's producer, so the
    transport says when the answers it made itself (errors, /v1/models) pile
    up unread: it then stops answering pipelined requests and reading new ones
    until they drain.  During a relay the engine connection is the producer
    (``lend_transport``/``take_back_transport``).
    """

    def __init__(self, factory: RouterFactory):
        self.factory = factory
        self.parser = RequestParser(max_body_bytes=factory.max_body_bytes)
        self.exchange: Exchange | None = None
        self.lost = False
        self._serving = False
        self._close_after = False
        self._reading_paused = False
        self._writes_blocked = False
        self._producing = False
        self._linger = None
        self._head_only = False
        # The request in hand's id, and the fields every answer to it carries (its id, CORS).
        self._rid = ""
        self._fields = b""
        # The wait on the client now (idle, header or body); its write stalls are the factory's ``stalls``.
        self._timer = None
        self._timer_phase = ""
        self._deadline = 0.0

    # Protocol

    def connectionMade(self) -> None:
        transport = self.transport
        transport.setTcpNoDelay(True)
        transport.bufferSize = RELAY_BUFFER_BYTES
        limit_unsent(transport, RELAY_BUFFER_BYTES)
        self.client = getattr(transport.getPeer(), "host", "")
        self.factory.connection_made()
        self.take_back_transport()
        self._watch()

    def dataReceived(self, data: bytes) -> None:
        if self._linger is not None:
            return
        parser = self.parser
        parser.feed(data)
        if self.exchange is None and not self._writes_blocked:
            self._serve()
        elif not self._reading_paused and parser.buffered > PIPELINE_LIMIT:
            self._reading_paused = True
            self.transport.pauseProducing()

    def connectionLost(self, reason=None) -> None:
        self.lost = True
        self.factory.connection_lost()
        for call in (self._linger, self._timer):
            if call is not None and call.active():
                call.cancel()
        exchange, self.exchange = self.exchange, None
        self.factory.stalls.resumed(self)
        if exchange is not None:
            exchange.client_gone()
            exchange.ended()

    # IPushProducer, for this connection's own transport

    def pauseProducing(self) -> None:
        if not self._writes_blocked:
            self._writes_blocked = True
            self.writes_paused()

    def resumeProducing(self) -> None:
        if self._writes_blocked:
            self._writes_blocked = False
            self.writes_resumed()
            if self.exchange is None and not self.lost:
                self._serve()

    def stopProducing(self) -> None:
        pass

    def lend_transport(self, producer) -> None:
        """A relay begins: ``producer`` (the engine connection) is paused and resumed by the client's transport."""
        if self._producing:
            self._producing = False
            self.transport.unregisterProducer()
        self.transport.registerProducer(producer, True)

    def take_back_transport(self, relayed: bool = False) -> None:
        """The relay is over (``relayed``: it had the transport): this protocol is the producer again."""
        transport = self.transport
        if relayed:
            transport.unregisterProducer()
            if self in self.factory.stalls:
                # The transport paused the relay and has not resumed it: it
                # will resume this protocol instead once its buffer drains.
                self._writes_blocked = True
        if not self._producing and not self.lost:
            self._producing = True
            transport.registerProducer(self, True)

    def _close(self, write_only: bool = False) -> None:
        # A transport whose producer is paused resumes it when its buffer
        # drains instead of closing: nothing is registered when it closes.
        if self._producing:
            self._producing = False
            self.transport.unregisterProducer()
        if write_only:
            self.transport.loseWriteConnection()
        else:
            self.transport.loseConnection()

    # Limits on the client

    def _watch(self) -> None:
        """Start the clock the client is on now: idle between requests, reading a head, or reading a body.

        One call per connection checks the deadline, and is moved only to be
        sooner: a busy connection changes phase at every request and costs no
        timer for it.
        """
        if self.exchange is not None or self._writes_blocked or self._close_after or self.lost or self._linger is not None:
            phase = ""
        else:
            phase = self.parser.phase
        if phase == self._timer_phase:
            return
        self._timer_phase = phase
        if phase == "" or phase == "failed":
            return
        limits = self.factory.clients
        seconds = (limits.idle_timeout_s if phase == "idle" else
                   limits.header_timeout_s if phase == "head" else limits.body_timeout_s)
        clock = self.factory.clock
        deadline = self._deadline = clock.seconds() + seconds
        timer = self._timer
        if timer is None:
            self._timer = clock.callLater(seconds, self._check)
        elif timer.getTime() > deadline:
            timer.reset(seconds)

    def _check(self) -> None:
        self._timer = None
        phase = self._timer_phase
        if self.lost or phase == "" or phase == "failed":
            return
        left = self._deadline - self.factory.clock.seconds()
        if left > 0:
            self._timer = self.factory.clock.callLater(left, self._check)
        else:
            self._timed_out()

    def _timed_out(self) -> None:
        phase = self._timer_phase
        self._timer_phase = ""
        factory = self.factory
        factory.metrics.client_timeout(phase)
        if phase == "idle":
            log.debug("closed {peer}: no request for router.clients.idle_timeout_s ({s:g} s)",
                      peer=_peer(self.transport), s=factory.clients.idle_timeout_s)
            self._close()
            return
        if phase == "head":
            limit = "router.clients.header_timeout_s (%g s)" % factory.clients.header_timeout_s
            what = "the request line and headers did not arrive within %g s" % factory.clients.header_timeout_s
        else:
            limit = "router.clients.body_timeout_s (%g s)" % factory.clients.body_timeout_s
            what = "the request body did not arrive within %g s of its head" % factory.clients.body_timeout_s
        self._refuse(BadRequest(408, what + ": send the request whole, without pauses"))
        log.info("{peer} sent no whole request within {limit}: answered 408 (request {request_id}) and closed",
                 peer=_peer(self.transport), limit=limit, request_id=self._rid)

    def writes_paused(self) -> None:
        """The client's transport holds more of its answer than it may: the client has that long to read."""
        self.factory.stalls.paused(self)
        self._watch()

    def writes_resumed(self) -> None:
        self.factory.stalls.resumed(self)
        self._watch()

    def write_stalled(self) -> None:
        """The client read nothing for ``write_stall_timeout_s`` (``stall.StallWatch`` keeps the clock)."""
        if self.lost:
            return
        factory = self.factory
        factory.metrics.client_timeout("write_stall")
        log.info("{peer} read none of its answer to request {request_id} for router.clients.write_stall_timeout_s "
                 "({s:g} s): closed, its engine slot freed", peer=_peer(self.transport), request_id=self._rid,
                 s=factory.clients.write_stall_timeout_s)
        self.transport.abortConnection()

    # Requests

    def _serve(self) -> None:
        if self._serving:
            return
        self._serving = True
        parser = self.parser
        try:
            while self.exchange is None and not self._close_after and not self.lost and not self._writes_blocked:
                item = parser.next_request()
                if item is None:
                    if parser.continue_wanted:
                        parser.continue_wanted = False
                        self.transport.write(_CONTINUE)
                    break
                if item.__class__ is BadRequest:
                    self._refuse(item)
                    return
                self._handle(item)
        finally:
            self._serving = False
        if self.exchange is None and not self.lost:
            if self._close_after:
                self._close()
            elif self._reading_paused and not self._writes_blocked:
                self._reading_paused = False
                self.transport.resumeProducing()
            elif self._writes_blocked and not self._reading_paused and parser.buffered > PIPELINE_LIMIT:
                self._reading_paused = True
                self.transport.pauseProducing()
        self._watch()

    def _handle(self, request: ParsedRequest) -> None:
        # A request in hand: the idle clock starts afresh after it.
        self._timer_phase = ""
        factory = self.factory
        started = factory.clock.seconds()
        path = request.path
        close = not request.keep_alive or request.version < (1, 1)
        method = request.method
        door = factory.door
        rid = self._rid = request_id(request.headers.get("x-request-id"))
        self._fields = id_field(rid) + door.cors.fields(request)
        # HEAD is answered as GET would be, without the body (RFC 9110 §9.3.2).
        self._head_only = method == "HEAD"
        if self._head_only:
            method = "GET"
        if method == "OPTIONS":
            # Before the door: a preflight carries no API key, and says only whether to ask.
            self._preflight(request, close, path, started)
            return
        refusal = door.refusal(request)
        if refusal is not None:
            self._error(refusal, close, "", path, started)
        elif path in PROXIED and method == "POST":
            factory.metrics.request_body(path, len(request.body))
            try:
                info = read_info(request, path, factory.max_body_bytes, rid, self.client)
            except Unroutable as refused:
                self._reject(refused.error, close, refused.model, path, started)
                return
            exchange = self.exchange = Exchange(self, request, info, started)
            factory.metrics.request_started(info.model)
            exchange.start()
        elif path == MODELS and method == "GET":
            served = door.models(request, factory.dispatcher.models())
            self._answer(200, model_list(served, factory.created), close, "", path, started)
        elif path.startswith("/v1/models/") and method == "GET":
            model = path[len("/v1/models/"):]
            if model in door.models(request, factory.dispatcher.models()):
                self._answer(200, model_object(model, factory.created), close, model, path, started)
            else:
                self._error(errors.UnknownModel("no model %r is served here: GET /v1/models lists those that are" % model),
                            close, model, path, started)
        else:
            self._error(not_found(request.method, path), close, "", path, started)

    def _preflight(self, request: ParsedRequest, close: bool, path: str, started: float) -> None:
        """OPTIONS: a browser's CORS preflight, allowed (204) or refused (403) as ``router.cors`` says."""
        allowed = self.factory.door.cors.answer_preflight(request)
        if allowed.__class__ is not bytes:
            self._fields = id_field(self._rid)
            self._error(allowed, close, "", path, started)
            return
        if close:
            self._close_after = True
        self.transport.write(no_content(self.factory.date(), id_field(self._rid) + allowed, _CLOSE if close else b""))
        self.factory.metrics.request_done("", path, 204, self.factory.clock.seconds() - started, None, None, None)

    def _refuse(self, bad: BadRequest) -> None:
        """A request that cannot be read: answer, then drop what still comes for LINGER_S, then close."""
        self._close_after = True
        error = (errors.BodyTooLarge(bad.message) if bad.status == 413 else
                 errors.RequestTimeout(bad.message) if bad.status == 408 else errors.InvalidRequest(bad.message))
        # No request was read, so no id of the client's: one is made for this answer.
        rid = self._rid = request_id(None)
        self.transport.write(response_bytes(bad.status, error_json(error, rid), self.factory.date(), connection=_CLOSE,
                                            extra=id_field(rid)))
        metrics = self.factory.metrics
        metrics.request_done("", "", bad.status, 0.0, None, None, None)
        reason = rejection_reason(error)
        if reason is not None:
            metrics.admission_rejected("", reason)
        self._close(write_only=True)
        self._linger = self.factory.clock.callLater(LINGER_S, self.transport.loseConnection)
        self._watch()

    # Answers

    def _answer(self, status: int, body: bytes, close: bool, model: str, path: str, started: float, extra: bytes = b"") -> None:
        if close:
            self._close_after = True
        response = response_bytes(status, body, self.factory.date(), connection=_CLOSE if close else b"",
                                  extra=self._fields + extra)
        if self._head_only:
            response = response[: len(response) - len(body)]
        self.transport.write(response)
        self.factory.metrics.request_done(model, path, status, self.factory.clock.seconds() - started, None, None, None)

    def _error(self, error: errors.RouterError, close: bool, model: str, path: str, started: float) -> None:
        extra = b"".join(b"%s: %s\r\n" % (name.encode(), value.encode()) for name, value in error.headers)
        self._answer(error.status, error_json(error, self._rid), close, model, path, started, extra)

    def _reject(self, error: errors.RouterError, close: bool, model: str, path: str, started: float) -> None:
        """``_error``, counted as an admission rejection when it is one (an engine's failure is not)."""
        reason = rejection_reason(error)
        if reason is not None:
            self.factory.metrics.admission_rejected(model, reason)
        self._error(error, close, model, path, started)

    def answer_error(self, exchange: Exchange, error: errors.RouterError) -> None:
        """The answer to ``exchange`` is ``error`` (nothing of another answer has been sent)."""
        exchange.finished = True
        info = exchange.info
        self._reject(error, exchange.close_after, info.model, info.path, exchange.started)
        self.exchange_done(exchange, exchange.close_after)

    def exchange_done(self, exchange: Exchange, close: bool) -> None:
        """The response to ``exchange`` went out in full: on to the next request."""
        if self.exchange is exchange:
            self.exchange = None
            exchange.ended()
        if close:
            self._close_after = True
        if not self.lost and not self._serving:
            self._serve()

    def exchange_broken(self, exchange: Exchange) -> None:
        """The response to ``exchange`` cannot be completed: close, so the client sees it cut short."""
        if self.exchange is exchange:
            self.exchange = None
            exchange.ended()
        self._close_after = True
        if not self.lost:
            self._close()


def _peer(transport) -> str:
    peer = transport.getPeer()
    host = getattr(peer, "host", None)
    return "%s:%s" % (host, peer.port) if host is not None else str(peer)


class RouterFactory(Factory):
    """The router's listener: ``endpoint.listen(RouterFactory(dispatcher, reactor, max_body_bytes=...))``.

    ``clock`` gives time (``seconds``, ``callLater``); ``reactor`` (default: ``clock``)
    makes connections to the engines.  Call ``close()`` on shutdown to close the
    idle engine connections.
    """

    noisy = False
    # Who the API answers (``llmgw.router.door``): everyone, unless the service says otherwise.
    door = Door()

    def __init__(
        self,
        dispatcher: Admitter,
        clock,
        *,
        max_body_bytes: int,
        metrics: Metrics | None = None,
        reactor=None,
        pool: UpstreamPool | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        max_idle_per_endpoint: int = MAX_IDLE_PER_ENDPOINT,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S,
        between_bytes_timeout_s: float = BETWEEN_BYTES_TIMEOUT_S,
        clients: ClientLimits = ClientLimits(),
        max_connections: int | None = None,
    ):
        self.dispatcher = dispatcher
        self.clients = clients
        # None: no cap (the service always gives one).
        self.max_connections = max_connections
        self.connections = 0
        self._refused = 0
        self._refusals_logged_at: float | None = None
        self.first_byte_timeout_s = first_byte_timeout_s
        self.between_bytes_timeout_s = between_bytes_timeout_s
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics if metrics is not None else NullMetrics()
        self.max_attempts = max_attempts
        self.pool = pool if pool is not None else UpstreamPool(
            reactor if reactor is not None else clock,
            max_idle_per_endpoint=max_idle_per_endpoint,
            idle_timeout_s=idle_timeout_s,
            connect_timeout_s=connect_timeout_s,
        )
        self.date = DateHeader(clock.seconds)
        self.stalls = StallWatch.for_router(self)
        self.created = int(clock.seconds())

    def buildProtocol(self, addr) -> Protocol:
        cap = self.max_connections
        if cap is not None and self.connections >= cap:
            self._refuse_connection(addr)
            refused = OverCapacity()
            refused.factory = self
            return refused
        return RouterProtocol(self)

    def connection_made(self) -> None:
        self.connections += 1
        self.metrics.client_connections(self.connections)

    def connection_lost(self) -> None:
        self.connections -= 1
        self.metrics.client_connections(self.connections)

    def _refuse_connection(self, addr) -> None:
        self.metrics.connection_refused()
        self._refused += 1
        now = self.clock.seconds()
        # One line a minute at most: a flood must not become a flood of log lines.
        if self._refusals_logged_at is None or now - self._refusals_logged_at >= 60:
            self._refusals_logged_at = now
            log.warn("router.clients.max_connections ({cap}) reached: refused {peer}, {n} refused in all; "
                     "raise the limit (and the open-files limit) or add routers",
                     cap=self.max_connections, peer="%s:%s" % (getattr(addr, "host", addr), getattr(addr, "port", "")),
                     n=self._refused)

    def close(self) -> None:
        self.pool.close()
