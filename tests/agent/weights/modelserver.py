"""A model file server on 127.0.0.1 whose misbehaviour a test chooses.

It honours ``Range: bytes=N-`` (or ignores it, as some servers do), sends a
Content-Length or none (chunked), sends slowly, cuts the connection after N
bytes, stalls, redirects, or refuses — and records every request it saw and
how many body bytes it sent for each, which is how the tests prove a resume
transferred only the rest and eight shards made one download.
"""

from __future__ import annotations

import hashlib
import os
import re

import attrs
from twisted.internet import reactor
from twisted.web import resource, server


@attrs.define
class Served:
    data: bytes = b""
    length: bool = True  # send Content-Length; without it the body is chunked
    ranges: bool = True  # honour Range; False answers 200 with the whole file
    cut_after: int | None = None  # close the connection after this many body bytes...
    cuts: int = 1  # ...in this many requests
    stall_after: int | None = None  # send this many bytes, then nothing, connection open
    chunk: int = 16 * 1024
    delay: float = 0.0  # seconds between chunks
    redirect: str | None = None  # answer 302 to this URL
    hang: bool = False  # never answer at all
    status: int = 200  # anything else: an error page
    body: bytes = b""  # the error page
    headers: dict = attrs.Factory(dict)  # more response headers (X-Linked-Etag), on a redirect too


@attrs.define
class Seen:
    path: str
    headers: dict[str, str]
    status: int = 0
    sent: int = 0  # body bytes written
    done: bool = False


class ModelServer(resource.Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.files: dict[str, Served] = {}
        self.seen: list[Seen] = []
        self._pending: list = []
        self._channels: list = []
        self.port = None

    def start(self, tls=None) -> ModelServer:
        """Listen on 127.0.0.1; with *tls* (a server context factory), speak https as "localhost"."""
        site = server.Site(self)
        if tls is None:
            self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
            self.scheme, self.host = "http", "127.0.0.1"
        else:
            self.port = reactor.listenSSL(0, site, tls, interface="127.0.0.1")
            self.scheme, self.host = "https", "localhost"
        return self

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port.getHost().port}"

    def url(self, path: str) -> str:
        return self.base + path

    def requests_for(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def stop(self) -> None:
        for call in self._pending:
            if call.active():
                call.cancel()
        for request in self._channels:
            if getattr(request, "channel", None) is not None and not request.finished:
                request.channel.transport.abortConnection()
        stopped = self.port.stopListening()
        if stopped is not None:
            await stopped

    def render_GET(self, request):
        path = request.path.decode()
        seen = Seen(path=path, headers={k.decode().lower(): v[0].decode()
                                         for k, v in request.requestHeaders.getAllRawHeaders()})
        self.seen.append(seen)
        served = self.files.get(path)
        if served is None:
            seen.status = 404
            request.setResponseCode(404)
            return b"no such model\n"
        for name, value in served.headers.items():
            request.setHeader(name.encode(), value.encode())
        if served.hang:
            self._channels.append(request)
            return server.NOT_DONE_YET
        if served.redirect:
            seen.status = 302
            request.redirect(served.redirect.encode())
            return b""
        if served.status != 200:
            seen.status = served.status
            request.setResponseCode(served.status)
            return served.body
        data, start = served.data, 0
        wanted = re.fullmatch(r"bytes=(\d+)-", seen.headers.get("range", ""))
        if wanted and served.ranges:
            start = int(wanted.group(1))
            if start >= len(data):
                seen.status = 416
                request.setResponseCode(416)
                request.setHeader(b"Content-Range", f"bytes */{len(data)}".encode())
                return b""
            request.setResponseCode(206)
            request.setHeader(b"Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}".encode())
            seen.status = 206
        else:
            seen.status = 200
        body = data[start:]
        if served.length:
            request.setHeader(b"Content-Length", str(len(body)).encode())
        limit = len(body)
        cut = served.cut_after is not None and served.cuts > 0
        if cut:
            served.cuts -= 1
            limit = min(limit, served.cut_after)
        if served.stall_after is not None:
            limit = min(limit, served.stall_after)
        self._channels.append(request)
        self._send(request, served, seen, body, 0, limit, cut)
        return server.NOT_DONE_YET

    def _send(self, request, served: Served, seen: Seen, body: bytes, pos: int, limit: int, cut: bool):
        if getattr(request, "channel", None) is None or request.finished:
            return  # the client went away
        piece = body[pos:min(pos + served.chunk, limit)]
        if piece:
            request.write(piece)
            seen.sent += len(piece)
            pos += len(piece)
        if pos < limit:
            if served.delay:
                self._pending.append(reactor.callLater(served.delay, self._send, request, served, seen,
                                                       body, pos, limit, cut))
            else:
                self._send(request, served, seen, body, pos, limit, cut)
            return
        if cut:
            # The channel is the transport's producer; a registered producer keeps a
            # connection open through loseConnection, so let go of it first.
            request.transport.unregisterProducer()
            request.transport.loseConnection()
        elif served.stall_after is not None:
            pass  # say nothing more, and keep the connection open
        else:
            seen.done = True
            request.finish()


def model_bytes(size: int, seed: int = 0) -> bytes:
    """*size* bytes that differ at every offset, so a misplaced byte changes the sha256."""
    out = bytearray()
    block = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{block}".encode()).digest()
        block += 1
    return bytes(out[:size])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def listing(directory) -> list[str]:
    return sorted(os.listdir(directory))
