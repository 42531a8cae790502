"""OpenAI's Responses API served by an engine that speaks chat completions: the translating exchange.

A request to ``/v1/responses`` is turned into a chat completion
(``llmgw.router.responses_in.to_chat``) and sent to the engine's
``/v1/chat/completions`` on the same path as any other request: admission, the
pool, the retries before the client has a byte, the two deadlines, the
metrics.  What differs is the answer.  An engine's error (any status but 200)
is relayed as it came: the engines answer errors as OpenAI error objects
already.  A 200 is translated (``llmgw.router.responses_out``):

- not streaming: the engine's whole body is read, at most
  ``router.max_body_bytes`` of it (past that the client gets a 502 naming the
  limit), and answered as one Response object with a Content-Length;
- streaming: the engine's SSE is read event by event (an event's lines at most
  ``MAX_EVENT_BYTES``) and each ``chat.completion.chunk`` becomes the
  Responses events it stands for, chunked to an HTTP/1.1 client and until the
  connection closes to an HTTP/1.0 one.  The client's backpressure pauses the
  engine's connection as it does for the byte relay.  An engine that breaks off
  the stream (a reset, a stall) ends it with ``response.failed``.

The engine's bytes still go through the usage tail parser, so tokens are
counted as they are for chat completions (``to_chat`` asks a stream for its
usage).  This costs a JSON decode and encode per event, which the byte relay
does not pay; it is paid only on this path.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING

from twisted.logger import Logger

from llmgw.http11 import EVENT_STREAM, LAST_CHUNK, chunk, response_bytes, status_line
from llmgw.router import errors
from llmgw.router.deadlines import BETWEEN_BYTES
from llmgw.router.proxy import Exchange
from llmgw.router.response import CHUNKED, ERROR, NEED_MORE
from llmgw.router.responses_in import to_chat
from llmgw.router.responses_out import ResponsesStream, from_chat
from llmgw.router.upstream import engine_head, write_now

if TYPE_CHECKING:
    from llmgw.http11 import ParsedRequest
    from llmgw.router.dispatch import RequestInfo
    from llmgw.router.server import RouterProtocol

log = Logger()

CHAT_TARGET = "/v1/chat/completions"
# The longest SSE event (its lines together) read from an engine: a chunk
# carries a token or a piece of a tool call's arguments, kilobytes at most.
MAX_EVENT_BYTES = 1024 * 1024


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(16)


class TranslatingExchange(Exchange):
    """An ``Exchange`` for ``/v1/responses``: a chat completion on the engine, a Response for the client."""

    __slots__ = ("response_id", "created", "translating", "collected", "collected_len", "events", "line", "line_len",
                 "data", "data_len", "stream_done", "after_done")

    def __init__(self, router: RouterProtocol, request: ParsedRequest, info: RequestInfo, started: float):
        super().__init__(router, request, info, started)
        self.response_id = new_response_id()
        self.created = int(self.factory.clock.seconds())
        # The engine answered 200: its body is translated (else relayed as it is).
        self.translating = False
        # Not streaming: the engine's body so far.
        self.collected: list[bytes] = []
        self.collected_len = 0
        # Streaming: the Responses events, the pieces of the SSE line begun and the data lines of the event begun.
        self.events: ResponsesStream | None = None
        self.line: list[bytes] = []
        self.line_len = 0
        self.data: list[bytes] = []
        self.data_len = 0
        self.stream_done = False
        # Bytes of the engine's body read since the stream's end ([DONE]), in the pieces that held it.
        self.after_done = 0

    def start(self) -> None:
        try:
            body = json.dumps(to_chat(self.info.body), separators=(",", ":"), ensure_ascii=False).encode()
        except errors.RouterError as e:
            self.router.answer_error(self, e)
            return
        self.payload = engine_head(CHAT_TARGET, len(body), self.info.request_id), body
        super().start()

    def _send(self, conn) -> None:
        # Each attempt starts afresh (a non-streaming answer cut off before the client had any is retried).
        self.translating = False
        self.collected, self.collected_len = [], 0
        super()._send(conn)

    # The engine's answer ----------------------------------------------------------

    def upstream_data(self, data: bytes) -> None:
        if self.head is not None and not self.translating:
            super().upstream_data(data)
            return
        conn = self.upstream
        parser = conn.parser
        start = 0
        if self.head is None:
            head = self._engine_head(conn, data)
            if head is None:
                return
            if head.status != 200:
                # The byte relay answers it (the error relayed, or a retry elsewhere): it reads the head again.
                raw = parser.raw
                parser.reset()
                super().upstream_data(raw)
                return
            self.head = head
            self.status = 200
            self.translating = True
            self._arm(self.factory.between_bytes_timeout_s, BETWEEN_BYTES)
            data = parser.raw
            start = parser.body_start
            if self.info.stream:
                self._start_stream()
        self._keep_tail(data)
        out: list[bytes] = []
        end = parser.body(data, start, out)
        if end == ERROR:
            self._engine_failed("malformed", "%s answered a body that cannot be read: %s" % (self.endpoint.id, parser.error))
            return
        if self.info.stream:
            if end == NEED_MORE and not self.registered and not self.client_left:
                self.registered = True
                self.router.lend_transport(conn)
            if self.ttft is None and out:
                self.ttft = self.factory.clock.seconds() - self.started
            broken = self._relay_events(out)
            if broken is not None:
                self._broken("malformed", "%s broke its stream: %s" % (self.endpoint.id, broken))
                return
            if self.stream_done and end == NEED_MORE:
                self.after_done += sum(map(len, out))
                if self.after_done > MAX_EVENT_BYTES:
                    # The client has its whole answer; what an engine sends after it is not waited for without end.
                    self._complete(reusable=False)
                    return
        elif self._collect(out):
            return
        if end == NEED_MORE:
            if self.head.framing != CHUNKED or parser.between_chunks():
                conn.deadline = self.factory.clock.seconds() + self.factory.between_bytes_timeout_s
            return
        self._complete(reusable=end == len(data) and self.head.keep_alive)

    def upstream_lost(self, conn, reason) -> None:
        if self.translating and not self.committed and conn is self.upstream and not self.finished and conn.parser.eof():
            # A body that runs until the engine closes has ended.
            self._complete(reusable=False)
            return
        super().upstream_lost(conn, reason)

    def client_gone(self) -> None:
        if self.translating and self.stream_done and self.upstream is not None and not (self.finished or self.client_left):
            # It had the whole translated stream: the engine's answer is not cut short; read its end, count it done.
            self.client_left = True
            self.registered = False
            self.upstream.resumeProducing()
            return
        super().client_gone()

    def _engine_failed(self, kind: str, message: str) -> None:
        if self.committed:
            self._broken(kind, message)
        else:
            self._failed(kind, message)

    def _complete(self, reusable: bool) -> None:
        if self.translating and not self._answer():
            return
        super()._complete(reusable)

    def _answer(self) -> bool:
        """Write the end of the translated answer; False when it is an error answered instead."""
        if self.info.stream:
            if not self.stream_done:
                self._write(self.events.fail("the engine ended its stream before [DONE]", "server_error"), last=True)
            return True
        body = b"".join(self.collected)
        self.collected = []
        try:
            chat = json.loads(body)
            answer = json.dumps(from_chat(chat, self.info.body, self.response_id, self.created),
                                separators=(",", ":"), ensure_ascii=False).encode()
        except RecursionError:
            self._give_up("%s answered 200 with a body nested deeper than JSON parsers go, not a chat completion"
                          % self.endpoint.id)
            return False
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self._give_up("%s answered 200 with a body llmgw cannot answer as a Response: %s" % (self.endpoint.id, e))
            return False
        close = b"Connection: close\r\n" if self.close_after else b""
        write_now(self.router.transport, response_bytes(200, answer, self.factory.date(), connection=close, extra=self.fields))
        self.relayed += len(answer)
        self.committed = True
        return True

    def _give_up(self, message: str) -> None:
        """The engine's answer cannot be translated: the engine is released and the client told so in a 502."""
        conn, self.upstream = self.upstream, None
        if conn is not None:
            conn.abort()
        self._unregister()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release("error")
        log.warn("{message}: answered 502", message=message)
        self.router.answer_error(self, errors.UpstreamFailed(message))

    # Not streaming ------------------------------------------------------------------

    def _collect(self, out: list[bytes]) -> bool:
        """Keep the engine's body; True when it went over the limit (and the client was answered)."""
        for piece in out:
            self.collected_len += len(piece)
            self.collected.append(piece)
        limit = self.factory.max_body_bytes
        if self.collected_len <= limit:
            return False
        self.collected = []
        self._give_up("%s answered over %d bytes for %s, more than router.max_body_bytes (%d bytes) allows a "
                      "translated response; raise it, or ask for fewer tokens" % (self.endpoint.id, limit, self.info.model, limit))
        return True

    # Streaming ----------------------------------------------------------------------

    def _start_stream(self) -> None:
        info = self.info
        self.events = ResponsesStream(info.body, self.response_id, self.created, info.model)
        fields = [status_line(200), self.factory.date(), b"Content-Type: ", EVENT_STREAM, b"\r\nCache-Control: no-cache\r\n"]
        if self.version11:
            fields.append(b"Transfer-Encoding: chunked\r\n")
        else:
            self.close_after = True
        if self.close_after:
            fields.append(b"Connection: close\r\n")
        fields.append(self.fields)
        fields.append(b"\r\n")
        write_now(self.router.transport, b"".join(fields))
        self.committed = True
        self._write(self.events.start())

    def _write(self, events: bytes, last: bool = False) -> None:
        if self.version11:
            out = (chunk(events) if events else b"") + (LAST_CHUNK if last else b"")
        else:
            out = events
        if out and not self.client_left:
            self.relayed += len(events)
            write_now(self.router.transport, out)

    def _relay_events(self, pieces: list[bytes]) -> str | None:
        """Read the engine's SSE out of *pieces* and write the Responses events of each whole event.

        Returns why the engine's stream cannot be read on, or None.
        """
        if self.stream_done:
            return None
        written: list[bytes] = []
        broken = None
        for piece in pieces:
            lines = piece.split(b"\n")
            if len(lines) == 1:
                # No line ends in it: kept as a piece, not joined to the rest once a piece (an engine's
                # one-byte chunks would make that quadratic).
                self.line.append(piece)
                self.line_len += len(piece)
                lines = []
            else:
                if self.line:
                    self.line.append(lines[0])
                    lines[0] = b"".join(self.line)
                last = lines.pop()
                self.line, self.line_len = ([last], len(last)) if last else ([], 0)
            for line in lines:
                if line.endswith(b"\r"):
                    line = line[:-1]
                if line.startswith(b"data:"):
                    value = line[6:] if line.startswith(b"data: ") else line[5:]
                    self.data.append(value)
                    # The line as it came counts, newline and all: an event of empty data lines grows too.
                    self.data_len += len(line) + 1
                elif not line and self.data:
                    data, self.data, self.data_len = b"\n".join(self.data), [], 0
                    try:
                        written.append(self._event(data))
                    except (ValueError, RecursionError):
                        broken = "it sent an event that is not JSON: %r" % data[:80]
                    if self.stream_done or broken:
                        break
            if broken is None and self.line_len + self.data_len > MAX_EVENT_BYTES:
                broken = "it sent an event over %d bytes" % MAX_EVENT_BYTES
            if self.stream_done or broken:
                self.line, self.line_len, self.data, self.data_len = [], 0, [], 0
                break
        if written:
            self._write(b"".join(written), last=self.stream_done)
        return broken

    def _event(self, data: bytes) -> bytes:
        """The Responses events for one of the engine's SSE events (ValueError or RecursionError: it is not JSON)."""
        if data == b"[DONE]":
            self.stream_done = True
            return self.events.finish()
        parsed = json.loads(data)
        if parsed.__class__ is dict and parsed.get("error") is not None:
            # An engine's error in the middle of its stream (vLLM sends them so): it ends the stream.
            error = parsed["error"]
            self.stream_done = True
            message = error.get("message") if error.__class__ is dict else error
            return self.events.fail(str(message or "the engine failed"), "server_error")
        return self.events.feed(parsed)

    # Endings -------------------------------------------------------------------------

    def _cut_short(self, message: str) -> None:
        if self.events is not None and not self.stream_done and not self.client_left:
            self.stream_done = True
            self._write(self.events.fail("the engine serving %s failed in the middle of its answer: %s"
                                         % (self.info.model, message), "server_error"), last=True)
        super()._cut_short(message)

    def _stall_end(self, told: str, between_chunks: bool) -> tuple[bytes | None, bool]:
        if not self.translating or self.events is None:
            return super()._stall_end(told, between_chunks)
        self.stream_done = True
        events = self.events.fail(told, "server_error")
        if not self.version11:
            return events, True
        return chunk(events) + LAST_CHUNK, False
