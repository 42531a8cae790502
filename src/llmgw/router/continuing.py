"""A streamed answer that outlives its engine: continued on another replica when the first fails mid-answer.

``ContinuingExchange`` is the ``Exchange`` of a streamed chat completion or
completion while ``router.continuation.max_attempts`` is above 0.  Until its
engine fails it is the plain exchange, plus one list append per read (the
bytes relayed, kept for ``continuation.Delivered``).  When the engine closes
or resets the connection mid-answer, or stalls past
``router.engines.between_bytes_timeout_s``, and the answer can be continued
(``continuation.refusal``, ``Delivered.refusal``), it takes a lease on
another endpoint of the model (``Lease.retry``: one this request has not
used), sends it the continuation request (``continuation_body``) and relays
that engine's events through ``continuation.Splice`` in the client's framing.
The client reads one answer.  When it cannot be continued, or no replica
takes it, the stream ends with an OpenAI error event (``deadlines.stall_event``
in the first engine's framing; whole events after a continuation began).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.logger import Logger

from llmgw.http11 import LAST_CHUNK, chunk
from llmgw.router import errors
from llmgw.router.continuation import CONTINUABLE_PATHS, Delivered, Splice, client_wants_usage, continuation_body, refusal
from llmgw.router.deadlines import BETWEEN_BYTES
from llmgw.router.proxy import Exchange
from llmgw.router.response import CHUNKED, ERROR, NEED_MORE, UNTIL_CLOSE
from llmgw.router.upstream import engine_head, write_now

if TYPE_CHECKING:
    from llmgw.http11 import ParsedRequest
    from llmgw.router.dispatch import RequestInfo
    from llmgw.router.server import RouterProtocol

log = Logger()

# router.continuation.max_attempts when the router was given no settings (tests that build a factory).
MAX_CONTINUATIONS = 1


def continuation_attempts(factory) -> int:
    settings = getattr(factory, "continuation", None)
    return MAX_CONTINUATIONS if settings is None else settings.max_attempts


def wanted(factory, info: RequestInfo) -> bool:
    """Whether *info*'s exchange is to be a ContinuingExchange: a stream of a continuable route, continuation on."""
    return info.stream and info.path in CONTINUABLE_PATHS and continuation_attempts(factory) > 0


class ContinuingExchange(Exchange):
    """An exchange whose stream goes on on another engine when its own fails after the first byte."""

    __slots__ = ("delivered", "splice", "refused", "continuations", "client_chunked", "broke_at", "broke_from")

    def __init__(self, router: RouterProtocol, request: ParsedRequest, info: RequestInfo, started: float):
        super().__init__(router, request, info, started)
        self.refused = refusal(info.path, info.body)
        self.delivered = None if self.refused else Delivered(CONTINUABLE_PATHS[info.path], self.factory.max_body_bytes)
        self.splice: Splice | None = None
        self.continuations = 0
        # How the client's body is framed: chunked, or raw until the connection closes.
        self.client_chunked = False
        self.broke_at = 0.0
        self.broke_from = ""

    def _keep_tail(self, data: bytes) -> None:
        super()._keep_tail(data)
        if self.delivered is not None and self.splice is None:
            self.delivered.keep(data)

    # The first engine failing ---------------------------------------------------

    def _broken(self, kind: str, message: str) -> None:
        if self.splice is not None:
            self._splice_failed(kind, message)
        elif not self._continue(kind, message):
            super()._broken(kind, message)

    def timed_out(self) -> None:
        if self.finished or self.upstream is None:
            return
        if self.splice is not None:
            self._splice_failed(self.timer_kind, "%s stopped sending the continuation for %g s"
                                % (self.endpoint.id, self.factory.between_bytes_timeout_s))
            return
        if self.committed and self.timer_kind == BETWEEN_BYTES and not self.client_left:
            seconds = self.factory.between_bytes_timeout_s
            told = ("the engine serving %s stopped sending its answer for %g s; it is cut short here"
                    % (self.info.model, seconds), errors.GatewayTimeout.code)
            if self._continue(BETWEEN_BYTES, "%s stopped sending its answer for %g s (router.engines."
                              "between_bytes_timeout_s)" % (self.endpoint.id, seconds), told):
                return
        super().timed_out()

    def _why_not(self) -> str | None:
        if self.refused:
            return self.refused
        if self.client_left:
            return "client_gone"
        attempts = continuation_attempts(self.factory)
        if attempts <= 0:
            return "off"
        if self.info.model in getattr(self.factory, "no_continuation", ()):
            return "model_off"
        if self.continuations >= attempts:
            return "attempts"
        head = self.head
        if head is None or head.framing not in (CHUNKED, UNTIL_CLOSE):
            return "framing"
        return self.delivered.refusal()

    def _continue(self, kind: str, message: str, told: tuple[str, str] | None = None) -> bool:
        """Send the rest of the answer for on another engine; False when it cannot be (the caller ends the stream)."""
        model, endpoint_id = self.info.model, self.endpoint.id
        counts = getattr(self.factory.metrics, "continuation", None)
        reason = self._why_not()
        body = None
        if reason is None:
            delivered = self.delivered
            body = continuation_body(self.info.path, self.info.body, delivered.text, delivered.tokens)
            if body is None:
                reason = "at_limit"
        if reason is not None:
            log.warn("{endpoint} broke off its answer for {model} ({message}); not continued: {reason}",
                     endpoint=endpoint_id, model=model, message=message, reason=reason)
            if counts is not None:
                counts.not_continuable(model, reason)
            return False
        conn, self.upstream = self.upstream, None
        if conn is not None:
            conn.abort()
        self._unregister()
        self.factory.metrics.upstream_error(model, endpoint_id, kind)
        lease, self.lease = self.lease, None
        lease.release("upstream_failed")
        d = lease.retry()
        self.client_chunked = self.head.framing == CHUNKED and not self.dechunk
        if self.head.framing == UNTIL_CLOSE:
            self.close_after = True
        self.continuations += 1
        self.broke_at = self.factory.clock.seconds()
        self.broke_from = endpoint_id
        self.payload = engine_head(self.info.path, len(body), self.info.request_id), body
        self.splice = Splice(self.delivered, client_wants_usage(self.info.body))
        self.head = None
        if d is None:
            self._give_up("no_replica", "%s broke off its answer (%s) and no other replica of %s is ready to "
                          "continue it" % (endpoint_id, message, model), told)
            return True
        log.info("{endpoint} broke off its answer for {model} after {tokens} tokens ({message}); continuing it "
                 "on another replica", endpoint=endpoint_id, model=model, tokens=self.delivered.tokens, message=message)
        self.fresh_only = False
        self._wait_for(d)
        return True

    # The continuation ---------------------------------------------------------

    def _admitted(self, lease) -> None:
        if self.splice is not None and self.lease is None and not self.finished:
            log.info("the answer {endpoint} broke off for {model} continues on {next}", endpoint=self.broke_from,
                     model=self.info.model, next=lease.endpoint.id)
        super()._admitted(lease)

    def _refused(self, failure) -> None:
        if self.splice is None:
            super()._refused(failure)
            return
        self.admitting = None
        if not self.finished:
            self._give_up("no_replica", "no replica of %s could take the rest of the answer: %s"
                          % (self.info.model, failure.getErrorMessage()))

    def _failed(self, kind: str, message: str) -> None:
        if self.splice is None:
            super()._failed(kind, message)
        else:
            self._splice_failed(kind, message)

    def upstream_lost(self, conn, reason) -> None:
        if self.splice is not None and conn is self.upstream and not self.finished and self.head is None \
                and conn.requests > 1 and conn.parser.buffered == 0 and not self.fresh_only:
            # A pooled connection the engine closed as the continuation went out: send it on a new one.
            self.upstream = None
            self.fresh_only = True
            lease, self.lease = self.lease, None
            super()._admitted(lease)
            return
        super().upstream_lost(conn, reason)

    def upstream_data(self, data: bytes) -> None:
        if self.splice is None:
            super().upstream_data(data)
            return
        conn = self.upstream
        parser = conn.parser
        start = 0
        if self.head is None:
            head = self._engine_head(conn, data)
            if head is None:
                return
            self.head = head
            if head.status != 200:
                self._splice_failed("unavailable", "%s answered %d to the continuation" % (self.endpoint.id, head.status))
                return
            self._arm(self.factory.between_bytes_timeout_s, BETWEEN_BYTES)
            data, start = parser.raw, parser.body_start
        out: list[bytes] = []
        end = parser.body(data, start, out)
        if end == ERROR:
            self._splice_failed("malformed", parser.error)
            return
        splice = self.splice
        started = splice.started
        events = splice.events(b"".join(out)) if out else []
        if splice.delivered.broken:
            self._splice_failed("malformed", "%s sent a continuation that is not OpenAI's stream" % self.endpoint.id)
            return
        if splice.started and not started:
            self._first_token()
        if events:
            self._write(b"".join(events))
        if end == NEED_MORE:
            if not self.registered and not self.client_left:
                self.registered = True
                self.router.lend_transport(conn)
            if self.head.framing != CHUNKED or parser.between_chunks():
                conn.deadline = self.factory.clock.seconds() + self.factory.between_bytes_timeout_s
            return
        self._splice_done(reusable=end == len(data) and self.head.keep_alive)

    def _first_token(self) -> None:
        model = self.info.model
        counts = getattr(self.factory.metrics, "continuation", None)
        if counts is not None:
            counts.continued(model)
            counts.gap(model, self.factory.clock.seconds() - self.broke_at)

    def _write(self, events: bytes) -> None:
        framed = chunk(events) if self.client_chunked else events
        write_now(self.router.transport, framed)
        self.relayed += len(framed)

    def _splice_done(self, reusable: bool) -> None:
        conn, self.upstream = self.upstream, None
        self._unregister()
        if reusable:
            self.factory.pool.give_back(conn)
        else:
            conn.abort()
        self.finished = True
        if self.client_chunked:
            write_now(self.router.transport, LAST_CHUNK)
            self.relayed += len(LAST_CHUNK)
        usage = self.splice.usage
        prompt, completion = usage if usage is not None else (None, None)
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.usage(prompt, completion)
            lease.release("ok")
        factory = self.factory
        factory.metrics.request_done(self.info.model, self.info.path, 200, factory.clock.seconds() - self.started,
                                     self.ttft, prompt, completion)
        self.router.exchange_done(self, self.close_after)

    def _splice_failed(self, kind: str, message: str) -> None:
        """The continuation's engine failed: continue again from what the client has now, or end the stream."""
        conn, self.upstream = self.upstream, None
        if conn is not None:
            conn.abort()
        self._unregister()
        endpoint_id = self.endpoint.id
        self.factory.metrics.upstream_error(self.info.model, endpoint_id, kind)
        counts = getattr(self.factory.metrics, "continuation", None)
        if counts is not None:
            counts.failed(self.info.model, kind)
        lease, self.lease = self.lease, None
        delivered = self.delivered
        reason = None if self.continuations < continuation_attempts(self.factory) else "attempts"
        reason = reason or delivered.refusal()
        body = None
        if reason is None:
            body = continuation_body(self.info.path, self.info.body, delivered.text, delivered.tokens)
            reason = None if body is not None else "at_limit"
        if lease is not None:
            lease.release("upstream_failed")
        d = lease.retry() if lease is not None and reason is None else None
        if d is None:
            self._give_up(reason or "no_replica", "the continuation of the answer failed too: %s" % message)
            return
        self.continuations += 1
        self.broke_at = self.factory.clock.seconds()
        self.broke_from = endpoint_id
        self.payload = engine_head(self.info.path, len(body), self.info.request_id), body
        self.splice = Splice(delivered, self.splice.client_usage)
        self.head = None
        self.fresh_only = False
        self._wait_for(d)

    def _give_up(self, reason: str, message: str, told: tuple[str, str] | None = None) -> None:
        """End the client's stream with an error event: the answer cannot go on; *told*: (what the client reads, code)."""
        log.warn("the answer for {model} ends unfinished: {message}", model=self.info.model, message=message)
        counts = getattr(self.factory.metrics, "continuation", None)
        if counts is not None and reason not in ("attempts",):
            counts.not_continuable(self.info.model, reason)
        self.finished = True
        if self.client_left:
            self.router.exchange_done(self, True)
            return
        if told is None:
            told = ("the engine serving %s failed in the middle of the answer and it could not be continued (%s); "
                    "it is cut short here" % (self.info.model, reason), errors.UpstreamFailed.code)
        event = b"data: " + errors.error_body("server_error", told[0], None, told[1]) + b"\n\n"
        self._write(event)
        if self.client_chunked:
            write_now(self.router.transport, LAST_CHUNK)
        factory = self.factory
        factory.metrics.request_done(self.info.model, self.info.path, self.status, factory.clock.seconds() - self.started,
                                     self.ttft, None, None)
        self.router.exchange_done(self, self.close_after)
