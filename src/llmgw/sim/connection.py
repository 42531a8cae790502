"""One HTTP/1.1 connection: keep-alive, pipelining in order, streaming, aborts.

A connection serves one exchange at a time.  Requests that arrive while an
exchange is in progress (pipelined, or sent early by an eager client) stay in
the parser's buffer, in order, and reading pauses when that buffer grows past
``pipeline_limit``.  An exchange is either finished inside ``handle`` (the
simulator's fast path: no waiting, no task) or is a coroutine run as a task;
when the client goes away the task is cancelled, which is how the simulator
notices an abort.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from typing import Any, Coroutine, Protocol

from llmgw.http11 import (
    JSON,
    LAST_CHUNK,
    BadRequest,
    DateHeader,
    ParsedRequest,
    RequestParser,
    chunk,
    connection_field,
    response_bytes,
    status_line,
)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
PIPELINE_LIMIT = 256 * 1024
# After refusing a request, read and drop what the client still sends for this
# long before closing: closing with unread bytes makes the kernel send a reset,
# which can destroy the error response before the client reads it.
LINGER_S = 2.0


class Application(Protocol):
    def handle(self, conn: HTTPConnection, request: ParsedRequest) -> Coroutine[Any, Any, None] | None:
        """Answer ``request`` now through ``conn`` and return None, or return a coroutine that will."""

    def bad_request(self, conn: HTTPConnection, error: BadRequest) -> None:
        """Answer a request that could not be read; the connection closes after it."""


class HTTPConnection(asyncio.Protocol):
    def __init__(
        self,
        app: Application,
        connections: set[HTTPConnection],
        date: DateHeader,
        *,
        max_body_bytes: int,
        pipeline_limit: int = PIPELINE_LIMIT,
    ):
        self._app = app
        self._connections = connections
        self._date = date
        self._parser = RequestParser(max_body_bytes=max_body_bytes)
        self._pipeline_limit = pipeline_limit
        self.transport: asyncio.Transport | None = None
        self.peer = "-"
        self.lost = False
        self._task: asyncio.Task | None = None
        self._current: ParsedRequest | None = None
        self._close_after = False
        self._chunked = True
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiter: asyncio.Future | None = None
        self._linger: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"
        self._connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            return
        self._parser.feed(data)
        if self._task is None:
            self._serve()
        elif not self._reading_paused and self._parser.buffered > self._pipeline_limit:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> None:
        # A client that shuts its side is treated as gone: HTTP clients do not
        # half-close while they wait for an answer, and a stream nobody reads
        # must stop (returning None lets the transport close).
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._connections.discard(self)
        if self._linger is not None:
            self._linger.cancel()
        if self._task is not None:
            self._task.cancel()
        self._wake_drain()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drain()

    # Exchanges

    def _serve(self) -> None:
        parser = self._parser
        while self._task is None and not self._close_after and not self.lost:
            item = parser.next_request()
            if item is None:
                if parser.continue_wanted:
                    parser.continue_wanted = False
                    self.transport.write(_CONTINUE)
                return
            if item.__class__ is BadRequest:
                self._current = None
                self._close_after = True
                self._app.bad_request(self, item)
                if not self.lost:
                    if self.transport.can_write_eof():
                        self.transport.write_eof()
                    self._linger = asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
                return
            self._current = item
            if not item.keep_alive:
                self._close_after = True
            pending = self._app.handle(self, item)
            if pending is not None:
                self._task = asyncio.get_running_loop().create_task(pending)
                self._task.add_done_callback(self._exchange_done)
                return
        if self._close_after and self._task is None and not self.lost:
            self.transport.close()

    def _exchange_done(self, task: asyncio.Task) -> None:
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            print("sim: internal error while answering %s:" % self.peer, file=sys.stderr)
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            self._close_after = True
        if self.lost:
            return
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        self._serve()

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()

    # What an application writes with

    def respond(self, status: int, body: bytes, *, content_type: bytes = JSON, extra: bytes = b"", close: bool = False) -> None:
        """A whole response with a Content-Length body; ``close`` ends the connection after it."""
        if close:
            self._close_after = True
        if self.lost:
            return
        self.transport.write(
            response_bytes(
                status,
                body,
                self._date(),
                content_type=content_type,
                connection=connection_field(self._current, not self._close_after),
                extra=extra,
            )
        )

    def start_stream(self, status: int, content_type: bytes, *, extra: bytes = b"") -> None:
        """The head of a streamed response: chunked for HTTP/1.1, ended by closing for HTTP/1.0."""
        if not self.lost:
            self.transport.write(self._stream_head(status, content_type, extra))

    def stream_whole(self, status: int, content_type: bytes, parts: list[bytes]) -> None:
        """A streamed response whose every part is ready now: head, parts and end in one write."""
        head = self._stream_head(status, content_type, b"")
        if not self.lost:
            self.transport.write(head + self._frame(parts) + (LAST_CHUNK if self._chunked else b""))

    def _stream_head(self, status: int, content_type: bytes, extra: bytes) -> bytes:
        self._chunked = self._current is not None and self._current.version >= (1, 1)
        if not self._chunked:
            self._close_after = True
        return b"".join(
            (
                status_line(status),
                self._date(),
                b"Content-Type: ",
                content_type,
                b"\r\nCache-Control: no-cache\r\n",
                b"Transfer-Encoding: chunked\r\n" if self._chunked else b"",
                connection_field(self._current, not self._close_after),
                extra,
                b"\r\n",
            )
        )

    def _frame(self, parts: list[bytes]) -> bytes:
        if self._chunked:
            return b"".join([b"%x\r\n%b\r\n" % (len(p), p) for p in parts])
        return b"".join(parts)

    def send(self, data: bytes) -> None:
        """Part of a streamed body (not empty)."""
        if not self.lost:
            self.transport.write(chunk(data) if self._chunked else data)

    def send_all(self, parts: list[bytes]) -> None:
        """Parts of a streamed body in one write, each its own chunk (none empty)."""
        if not self.lost:
            self.transport.write(self._frame(parts))

    def end_stream(self) -> None:
        if self._chunked and not self.lost:
            self.transport.write(LAST_CHUNK)

    async def drain(self) -> None:
        """Wait while the client reads more slowly than the simulator writes."""
        if self._writing_paused and not self.lost:
            waiter = self._drain_waiter
            if waiter is None:
                waiter = self._drain_waiter = asyncio.get_running_loop().create_future()
            await waiter

    def _wake_drain(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
