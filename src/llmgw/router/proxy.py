"""One request's trip through the router: admission, an engine, the relay, the release.

The request path is written on Twisted's raw ``Protocol``/transport API rather
than twisted.web: twisted.web's server and its client ``Agent`` build a request
object, header objects, a producer chain and several Deferreds per request, and
re-frame every body they relay; together that is a few hundred microseconds of
CPU per request, over the router's whole budget (0.25 ms).  Here a request is
parsed once (``llmgw.http11``), its JSON body decoded once to read the model,
the stream flag and the prompt's prefix, and the original bytes go to the
engine unchanged; the engine's response goes back as the bytes it arrived in,
chunked framing included, unless the client needs another framing (HTTP/1.0,
``Connection: close``).  Callbacks rather than coroutines on this path for the
same reason: a coroutine and its Deferred cost more than the work they wrap.

The contract with the rest of the router is ``Admitter.admit`` →
``EngineLease``, ``EngineLease.usage``/``release``/``retry`` and the ``Metrics``
hooks (``llmgw.router.contract``); ``dispatch.Dispatcher`` and its ``Lease``
meet it.  A request is retried on another engine only while nothing of its answer has
gone to the client: a connection refused or timed out, one closed before a
whole response head arrived, a response head that cannot be read, or an
engine answering 502 or 503.  Once a byte went out, a streamed answer is
continued on another engine (``llmgw.router.continuing``); any other is cut.

Two clocks run against the engine once the request is sent; what they are
and how a stream that stalls ends is ``llmgw.router.deadlines``.

The request's id goes to the engine and back to the client in ``X-Request-Id``,
and the client's CORS fields (``llmgw.router.cors``) with the head: both are
put after the status line, the rest of the engine's head goes as it came.  A
request to ``/v1/responses`` is an ``llmgw.router.translate.TranslatingExchange``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.logger import Logger

from llmgw.router import errors
from llmgw.router.bodies import read_usage
from llmgw.router.cors import cors_fields
from llmgw.router.deadlines import BETWEEN_BYTES, FIRST_BYTE, stall_event
from llmgw.router.response import CHUNKED, ERROR, NEED_MORE, UNTIL_CLOSE, ParseError, relay_head
from llmgw.router.routes import FORM_ROUTES, RESPONSES
from llmgw.router.upstream import UpstreamConnection, engine_head, failure_kind, with_fields, write_now

if TYPE_CHECKING:
    from llmgw.http11 import ParsedRequest
    from llmgw.router.contract import EngineAddress, EngineLease
    from llmgw.router.dispatch import RequestInfo
    from llmgw.router.server import RouterProtocol

log = Logger()

# The last bytes of a response kept to find its "usage" in: an OpenAI body or
# stream ends with it (before "[DONE]" in a stream).
USAGE_TAIL_BYTES = 4096
MAX_ATTEMPTS = 3


class Exchange:
    """A request from admission until its response is relayed (or it fails)."""

    __slots__ = (
        "router", "factory", "info", "started", "payload", "close_after", "version11",
        "lease", "endpoint", "upstream", "head", "passthrough", "dechunk", "registered", "committed",
        "finished", "attempts", "fresh_only", "admitting", "ttft", "tail", "tail_len", "status", "client_left",
        "timer_kind", "sent", "relayed", "fields",
    )

    def __new__(cls, router: RouterProtocol, request: ParsedRequest, info: RequestInfo, started: float):
        if cls is Exchange and (info.stream or info.path == RESPONSES):
            # Here, not at the top: these exchanges are subclasses of this one.
            from llmgw.router.continuing import ContinuingExchange, wanted
            from llmgw.router.translate import TranslatingExchange

            cls = TranslatingExchange if info.path == RESPONSES else ContinuingExchange if wanted(router.factory, info) else cls
        return object.__new__(cls)

    def __init__(self, router: RouterProtocol, request: ParsedRequest, info: RequestInfo, started: float):
        self.router = router
        self.factory = router.factory
        self.info = info
        self.started = started
        # The request line and fields for the engine; Host is added per engine.
        # A form (an audio upload) goes with its own Content-Type, which names its boundary.
        content_type = request.headers.get("content-type", "") if info.path in FORM_ROUTES else None
        rid = info.request_id
        self.payload = engine_head(request.target, len(request.body), rid, content_type), request.body
        # Put in every head relayed to the client, after its status line.
        fields = cors_fields(request, self.factory.door.cors)
        self.fields = b"X-Request-Id: %s\r\n%s" % (rid.encode(), fields) if rid else fields
        self.close_after = not request.keep_alive or request.version < (1, 1)
        self.version11 = request.version >= (1, 1)
        self.lease: EngineLease | None = None
        # The engine of the latest attempt; it outlives the lease when an
        # engine's 502/503 is relayed after the lease was released.
        self.endpoint: EngineAddress | None = None
        self.upstream: UpstreamConnection | None = None
        self.head = None
        self.passthrough = False
        self.dechunk = False
        self.registered = False
        self.committed = False
        self.finished = False
        self.attempts = 0
        self.fresh_only = False
        self.admitting: defer.Deferred | None = None
        self.ttft: float | None = None
        self.tail: list[bytes] = []
        self.tail_len = 0
        self.status = 0
        # The client left after the stream's last event: the rest is read and dropped.
        self.client_left = False
        # Which of the engine's two deadlines runs (the connection keeps the time).
        self.timer_kind = FIRST_BYTE
        # Body bytes sent to engines (each attempt's) and relayed to the client.
        self.sent = 0
        self.relayed = 0

    # Admission ----------------------------------------------------------------

    def start(self) -> None:
        try:
            d = self.factory.dispatcher.admit(self.info.model, self.info)
        except Exception:
            d = defer.fail()
        self._wait_for(d)

    def _wait_for(self, d: defer.Deferred) -> None:
        self.admitting = d
        d.addCallbacks(self._admitted, self._refused)
        d.addErrback(self._internal_error)

    def _admitted(self, lease: EngineLease) -> None:
        self.admitting = None
        if self.finished:
            lease.release("client_gone")
            return
        self.lease = lease
        endpoint = self.endpoint = lease.endpoint
        conn = None if self.fresh_only else self.factory.pool.take(endpoint.host, endpoint.port)
        if conn is not None:
            self._send(conn)
        else:
            d = self.factory.pool.connect(endpoint.host, endpoint.port)
            d.addCallbacks(self._connected, self._connect_failed, errbackArgs=(lease,))
            d.addErrback(self._internal_error)

    def _refused(self, failure) -> None:
        self.admitting = None
        if self.finished:
            return
        error = failure.value
        if isinstance(error, errors.RouterError):
            self.router.answer_error(self, error)
        else:
            self._internal_error(failure)

    def _internal_error(self, failure) -> None:
        log.failure("the request path failed on {path} for model {model}", failure, path=self.info.path, model=self.info.model)
        if self.finished:
            return
        if self.lease is not None:
            lease, self.lease = self.lease, None
            lease.release("error")
        if self.upstream is not None:
            self.upstream.abort()
            self.upstream = None
        self._unregister()
        if self.committed:
            self.finished = True
            self.router.exchange_broken(self)
        else:
            self.router.answer_error(self, errors.RouterError("the router failed to answer: %s" % failure.getErrorMessage()))

    # The engine ---------------------------------------------------------------

    def _connected(self, conn: UpstreamConnection) -> None:
        if self.finished or self.lease is None:
            # The client left while this connection was being made: keep it.
            self.factory.pool.give_back(conn)
            return
        self._send(conn)

    def _connect_failed(self, failure, lease: EngineLease) -> None:
        if self.finished or lease is not self.lease:
            return
        self._failed(failure_kind(failure), "%s: %s" % (lease.endpoint.id, failure.getErrorMessage()))

    def _send(self, conn: UpstreamConnection) -> None:
        self.upstream = conn
        self.head = None
        endpoint = self.endpoint
        head, body = self.payload
        host = endpoint.host.encode()
        if b":" in host:
            host = b"[" + host + b"]"
        conn.send(self, b"%bHost: %b:%d\r\n\r\n%b" % (head, host, endpoint.port, body))
        self.sent += len(body)
        self._arm(self.factory.first_byte_timeout_s, FIRST_BYTE)

    def upstream_data(self, data: bytes) -> None:
        conn = self.upstream
        parser = conn.parser
        head = self.head
        if head is None:
            head = self._engine_head(conn, data)
            if head is None:
                return
            self.head = head
            self.status = head.status
            if (head.status == 502 or head.status == 503) and self._retry_unavailable():
                return
            self._arm(self.factory.between_bytes_timeout_s, BETWEEN_BYTES)
            data = parser.raw
            start = parser.body_start
            transport = self.router.transport
            self.passthrough = head.clean and self.version11 and not self.close_after
            if not self.passthrough:
                if head.framing == UNTIL_CLOSE:
                    self.close_after = True
                self.dechunk = head.framing == CHUNKED and not self.version11
                transport.write(with_fields(relay_head(head, close=self.close_after, dechunk=self.dechunk), self.fields))
            self.committed = True
        else:
            start = 0
            transport = self.router.transport
        self._keep_tail(data)
        out: list[bytes] | None = [] if self.dechunk else None
        end = parser.body(data, start, out)
        if end == ERROR:
            self._broken("malformed", parser.error)
            return
        if end == NEED_MORE and not self.registered and not self.client_left:
            # Before writing: a first write over the transport's buffer size
            # pauses the engine at once.
            self.registered = True
            self.router.lend_transport(conn)
        if out is not None:
            piece = b"".join(out)
        elif self.passthrough and start:
            # The head goes as it came, together with the body in this read.
            piece = data if end == NEED_MORE or end == len(data) else data[:end]
        elif end == NEED_MORE:
            piece = data if not start else data[start:]
        else:
            piece = data[start:end]
        if piece:
            # A passthrough's first piece carries the engine's head too.
            self.relayed += len(piece) - start if self.passthrough else len(piece)
            if self.ttft is None and self.info.stream and (end == NEED_MORE and len(data) > start or end > start):
                self.ttft = self.factory.clock.seconds() - self.started
            if start and self.passthrough and self.fields:
                # After the status line: one copy of this read, no parse.
                piece = piece.replace(b"\n", b"\n" + self.fields, 1)
            write_now(transport, piece)
        if end == NEED_MORE:
            # Progress is a whole chunk: an engine dribbling a byte at a time
            # does not keep a chunked stream alive.
            if self.head.framing != CHUNKED or parser.between_chunks():
                conn.deadline = self.factory.clock.seconds() + self.factory.between_bytes_timeout_s
            return
        self._complete(reusable=end == len(data) and self.head.keep_alive)

    def _engine_head(self, conn: UpstreamConnection, data: bytes):
        """The engine's response head once all of it is here; None until then, or after failing a malformed one."""
        head = conn.parser.head(data)
        if head.__class__ is ParseError:
            conn.abort()
            self._failed("malformed", "%s answered something that is not HTTP/1.1: %s" % (self.endpoint.id, head.message))
            return None
        return head

    def _keep_tail(self, data: bytes) -> None:
        tail = self.tail
        tail.append(data)
        self.tail_len += len(data)
        while len(tail) > 1 and self.tail_len - len(tail[0]) >= USAGE_TAIL_BYTES:
            self.tail_len -= len(tail.pop(0))

    def upstream_lost(self, conn: UpstreamConnection, reason) -> None:
        if self.finished or conn is not self.upstream:
            return
        if not self.committed:
            if self.head is None and conn.requests > 1 and conn.parser.buffered == 0 and not self.fresh_only:
                # A reused connection the engine closed as the request went out:
                # the engine never read it; send it again, on a new connection.
                self.upstream = None
                self.fresh_only = True
                lease, self.lease = self.lease, None
                self._admitted(lease)
                return
            self._failed("reset", "%s closed the connection before answering" % self.endpoint.id)
            return
        if self.head is not None and conn.parser.eof():
            # A body that runs until the engine closes has ended.
            self._complete(reusable=False)
            return
        self._broken("reset", "the engine closed the connection in the middle of its answer")

    # Endings --------------------------------------------------------------------

    def _unregister(self) -> None:
        # Before the client's transport may close: one that still has a paused
        # producer resumes it when its buffer drains instead of closing.
        if self.registered:
            self.registered = False
            self.router.take_back_transport(relayed=True)

    def _complete(self, reusable: bool) -> None:
        conn, self.upstream = self.upstream, None
        self._unregister()
        if reusable:
            self.factory.pool.give_back(conn)
        else:
            conn.abort()
        self.finished = True
        tail = self.tail
        blob = tail[0] if len(tail) == 1 else b"".join(tail)
        prompt, completion = read_usage(blob if len(blob) <= USAGE_TAIL_BYTES else blob[-USAGE_TAIL_BYTES:])
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.usage(prompt, completion)
            lease.release("error" if self.status >= 500 else "ok")
        self.factory.metrics.request_done(self.info.model, self.info.path, self.status,
                                          self.factory.clock.seconds() - self.started, self.ttft, prompt, completion)
        self.router.exchange_done(self, self.close_after)

    def _retry_unavailable(self) -> bool:
        """An engine answered 502/503 before anything reached the client: go elsewhere if the dispatcher has somewhere."""
        lease = self.lease
        self.factory.metrics.upstream_error(self.info.model, self.endpoint.id, "unavailable")
        self.lease = None
        lease.release("upstream_failed")
        d = self._next(lease)
        if d is None:
            # Nowhere else: the client gets this engine's answer as it is.
            return False
        conn, self.upstream = self.upstream, None
        conn.abort()
        self._wait_for(d)
        return True

    def _failed(self, kind: str, message: str) -> None:
        """The engine failed before anything reached the client: retry elsewhere, or answer 502."""
        conn, self.upstream = self.upstream, None
        if conn is not None:
            conn.abort()
        lease, self.lease = self.lease, None
        self.factory.metrics.upstream_error(self.info.model, self.endpoint.id, kind)
        lease.release("upstream_failed")
        d = self._next(lease)
        if d is None:
            self.router.answer_error(self, errors.UpstreamFailed(
                "no engine serving %s answered; the last one tried, %s" % (self.info.model, message)))
        else:
            self._wait_for(d)

    def _next(self, lease: EngineLease) -> defer.Deferred | None:
        self.attempts += 1
        if self.attempts >= self.factory.max_attempts:
            return None
        d = lease.retry()
        if d is not None:
            self.fresh_only = False
            self.factory.metrics.retried(self.info.model)
        return d

    def _broken(self, kind: str, message: str) -> None:
        """The engine failed after part of its answer went to the client: cut the client off too."""
        conn, self.upstream = self.upstream, None
        if conn is not None:
            conn.abort()
        self._unregister()
        lease, self.lease = self.lease, None
        self.finished = True
        endpoint_id = self.endpoint.id
        log.warn("{endpoint} broke off its answer for {model}: {message}", endpoint=endpoint_id, model=self.info.model, message=message)
        self.factory.metrics.upstream_error(self.info.model, endpoint_id, kind)
        if lease is not None:
            lease.release("upstream_failed")
        self._cut_short(message)

    def _cut_short(self, message: str) -> None:
        """End the client's response the engine broke off: here by closing the connection mid-answer."""
        self.router.exchange_broken(self)

    def ended(self) -> None:
        """The client is done with this exchange, however it ended: out of the in-flight count, its bytes counted."""
        metrics, model = self.factory.metrics, self.info.model
        metrics.request_finished(model)
        if self.sent:
            metrics.bytes_relayed(model, "request", self.sent)
        if self.relayed:
            metrics.bytes_relayed(model, "response", self.relayed)

    def client_gone(self) -> None:
        """The client's connection closed before its response was complete."""
        if self.finished or self.client_left:
            return
        conn = self.upstream
        if conn is not None and self.info.stream and self.tail and self.tail[-1].rstrip().endswith(b"data: [DONE]"):
            # It had the whole stream and left before the final empty chunk
            # (the openai client stops at [DONE]): the engine's answer is not
            # cut short, so read its end, reuse the connection, count it done.
            self.client_left = True
            self.registered = False
            conn.resumeProducing()
            return
        self.finished = True
        self.factory.metrics.client_gone(self.info.model)
        self.upstream = None
        if conn is not None:
            conn.abort()
        lease, self.lease = self.lease, None
        if lease is not None:
            tail = self.tail
            if tail:
                lease.usage(*read_usage(b"".join(tail)[-USAGE_TAIL_BYTES:]))
            lease.release("client_gone")
        elif self.admitting is not None:
            # Still queued: give the place up (admission's errback sees `finished`).
            self.admitting.cancel()

    # The engine's deadlines ---------------------------------------------------------

    def _arm(self, seconds: float, kind: str) -> None:
        self.timer_kind = kind
        self.upstream.watch(self.factory.clock, seconds)

    def writes_paused(self) -> None:
        """The client's transport is full: its reader, not the engine, is slow; the engine's clock stops."""
        if self.upstream is not None:
            self.upstream.deadline = math.inf
        self.router.writes_paused()

    def writes_resumed(self) -> None:
        self.router.writes_resumed()
        if self.upstream is not None and not self.finished:
            self._arm(self.factory.between_bytes_timeout_s if self.head is not None else self.factory.first_byte_timeout_s,
                      self.timer_kind)

    def timed_out(self) -> None:
        """The connection's deadline passed (``UpstreamConnection.watch``)."""
        if self.finished or self.upstream is None:
            return
        factory = self.factory
        model = self.info.model
        endpoint_id = self.endpoint.id
        if self.timer_kind == FIRST_BYTE:
            seconds = factory.first_byte_timeout_s
            limit = "router.engines.first_byte_timeout_s (%g s)" % seconds
            what = "sent no whole response head"
        else:
            seconds = factory.between_bytes_timeout_s
            limit = "router.engines.between_bytes_timeout_s (%g s)" % seconds
            what = "stopped sending its answer"
        conn, self.upstream = self.upstream, None
        between_chunks = conn.parser.between_chunks()
        conn.abort()
        self._unregister()
        factory.metrics.upstream_error(model, endpoint_id, self.timer_kind)
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release("upstream_failed")
        message = "%s %s for %s within %s" % (endpoint_id, what, model, limit)
        if not self.committed:
            log.warn("{message}: answered 504", message=message)
            self.router.answer_error(self, errors.GatewayTimeout(
                "the engine serving %s did not answer within %g s; it may have done the work, so sending the "
                "request again costs it twice" % (model, seconds)))
            return
        self.finished = True
        if self.client_left:
            return
        final, close = self._stall_end("the engine serving %s stopped sending its answer for %g s; it is cut short here"
                                       % (model, factory.between_bytes_timeout_s), between_chunks)
        if final is None:
            log.warn("{message}: the client's response is cut off", message=message)
            self.router.exchange_broken(self)
            return
        if close:
            self.close_after = True
        log.warn("{message}: the stream ends with an error event", message=message)
        write_now(self.router.transport, final)
        self.relayed += len(final)
        factory.metrics.request_done(model, self.info.path, self.status, factory.clock.seconds() - self.started,
                                     self.ttft, None, None)
        self.router.exchange_done(self, self.close_after)

    def _stall_end(self, told: str, between_chunks: bool) -> tuple[bytes | None, bool]:
        """What ends the client's response when the engine stalled, *told* it why, and whether its connection closes after."""
        head = self.head
        return stall_event(told, self.info.stream, head.framing if head is not None else None, b"".join(self.tail),
                           self.dechunk, between_chunks)
