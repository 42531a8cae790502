"""HTTP/1.1 servers' half, shared by the simulator and the router: a request parser and response bytes.

The parser is a plain object with no I/O, fed whatever arrived on a socket.
``next_request()`` answers one of three things: a complete ``ParsedRequest``,
``None`` (more bytes are needed), or a ``BadRequest`` carrying the status to
answer before closing the connection.  It never raises on any input: the
simulator sits behind routers under test, and a router bug must show up as a
400, not as a dead simulator; the router sits in front of every client, and a
client's mistake must show up as a 400, not as a broken connection.

It is strict where leniency lets one request be read two ways (request
smuggling): lines end in CRLF only, no folded headers, no whitespace before a
colon, one Content-Length, never both Content-Length and Transfer-Encoding.
"""

from __future__ import annotations

import re
import time
import zlib
from email.utils import formatdate

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_BODY_BYTES = 16 * 1024 * 1024
# A chunk-size line is a hex number and extensions nobody uses.
MAX_CHUNK_LINE = 4096

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# The head is decoded as latin-1 (every byte one character) and matched as text.
_REQUEST_LINE = re.compile(r"(" + _TOKEN + r") ([^\x00-\x20\x7f]+) HTTP/([0-9])\.([0-9])")
# Field values: visible characters, obs-text, space and tab; no other controls.
_VALUE = r"[\t\x20-\x7e\x80-\xff]*"
_FIELDS = re.compile(r"(?:" + _TOKEN + r":" + _VALUE + r"\r\n)*")
_FIELD = re.compile(r"(" + _TOKEN + r"):[ \t]*(" + _VALUE + r")\r\n")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CHUNK_EXT = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_TRAILER = re.compile(rb"" + _TOKEN.encode() + rb":[\t\x20-\x7e\x80-\xff]*")
_BARE_LF = re.compile(rb"(?<!\r)\n")
BARE_LF = "a line ends in a bare LF: HTTP/1.1 lines end in CRLF (\\r\\n)"



def header_fields(head: str, start: int) -> list[tuple[str, str]] | None:
    """The (name, value) fields of a latin-1 ``head`` from ``start`` (each line ending in CRLF), or None when one is malformed.

    Names keep their case and values their inner spaces; trailing spaces and tabs are dropped.
    """
    if _FIELDS.fullmatch(head, start) is None:
        return None
    return [(name, value.rstrip(" \t")) for name, value in _FIELD.findall(head, start)]


def chunk_size(line: bytes) -> int | None:
    """The size a chunk-size line (without its CRLF) announces, or None when it is malformed."""
    size, _, ext = line.partition(b";")
    size = size.rstrip(b" \t")
    if _CHUNK_SIZE.fullmatch(size) is None or _CHUNK_EXT.fullmatch(ext) is None:
        return None
    return int(size, 16)


def is_trailer_field(line: bytes) -> bool:
    return _TRAILER.fullmatch(line) is not None


STATUS_REASONS = {
    100: "Continue",
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    421: "Misdirected Request",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


class ParsedRequest:
    """One parsed request: header names are lower case, values latin-1 text."""

    __slots__ = ("method", "target", "path", "version", "headers", "body", "keep_alive")

    def __init__(self, method: str, target: str, version: tuple[int, int], headers: dict[str, str], body: bytes):
        self.method = method
        self.target = target
        self.path = target.split("?", 1)[0]
        self.version = version
        self.headers = headers
        self.body = body
        connection = headers.get("connection", "").lower()
        if version >= (1, 1):
            self.keep_alive = "close" not in connection
        else:
            self.keep_alive = "keep-alive" in connection

    def __repr__(self) -> str:
        version = f"{self.version[0]}.{self.version[1]}"
        return f"<ParsedRequest {self.method} {self.target} HTTP/{version} body={len(self.body)}>"


class BadRequest:
    """The request cannot be read: answer ``status`` and close the connection."""

    __slots__ = ("status", "message")

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"<BadRequest {self.status} {self.message!r}>"


_HEAD, _BODY, _CHUNK_SIZE_LINE, _CHUNK_DATA, _TRAILERS, _FAILED = range(6)


class RequestParser:
    """Reads requests one after another from a byte stream (pipelining included)."""

    def __init__(self, *, max_head_bytes: int = MAX_HEAD_BYTES, max_body_bytes: int = MAX_BODY_BYTES):
        self._max_head = max_head_bytes
        self._max_body = max_body_bytes
        self._buf = bytearray()
        self._state = _HEAD
        self._error: BadRequest | None = None
        # The request whose head is read and whose body is still arriving.
        self._method = self._target = ""
        self._version = (1, 1)
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._remaining = 0
        self._trailer_bytes = 0
        # How far the head being read has been searched for a bare LF.
        self._lf_checked = 0
        # Set when a head asked for "Expect: 100-continue" and its body has not
        # arrived yet; the connection sends the interim response and clears it.
        self.continue_wanted = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as part of a request."""
        return len(self._buf)

    @property
    def phase(self) -> str:
        """Where the next request stands: ``idle`` (none of it yet), ``head``, ``body``, or ``failed``."""
        state = self._state
        if state == _HEAD:
            return "head" if self._buf else "idle"
        return "failed" if state == _FAILED else "body"

    def feed(self, data: bytes) -> None:
        if self._state != _FAILED:
            self._buf += data

    def next_request(self) -> ParsedRequest | BadRequest | None:
        state = self._state
        if state == _HEAD:
            return self._read_head()
        if state == _BODY:
            return self._read_body()
        if state == _FAILED:
            return self._error
        return self._read_chunked()

    def _fail(self, status: int, message: str) -> BadRequest:
        self._state = _FAILED
        self._error = BadRequest(status, message)
        self._buf.clear()
        self.continue_wanted = False
        return self._error

    def _read_head(self) -> ParsedRequest | BadRequest | None:
        buf = self._buf
        # RFC 9112 §2.2: ignore empty lines before a request line (some clients
        # send a CRLF after a body).
        while buf.startswith(b"\r\n"):
            del buf[:2]
            self._lf_checked = 0
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            # A client that ends lines in LF alone would otherwise wait for a
            # CRLFCRLF that never comes; only the new bytes are searched.
            if _BARE_LF.search(buf, max(0, self._lf_checked - 1)) is not None:
                return self._fail(400, BARE_LF)
            self._lf_checked = len(buf)
            if len(buf) > self._max_head:
                return self._fail(431, "the request line and headers are over %d bytes" % self._max_head)
            return None
        if end > self._max_head:
            return self._fail(431, "the request line and headers are over %d bytes" % self._max_head)
        head = buf[: end + 2].decode("latin-1")
        del buf[: end + 4]
        self._lf_checked = 0
        eol = head.index("\r\n")
        m = _REQUEST_LINE.fullmatch(head, 0, eol)
        if m is None:
            return self._fail(400, BARE_LF if "\n" in head[:eol] else "malformed request line")
        method, target, major, minor = m.groups()
        if major != "1":
            return self._fail(505, "only HTTP/1.x is served")
        if _FIELDS.fullmatch(head, eol + 2) is None:
            return self._fail(400, BARE_LF if _BARE_LF.search(head.encode("latin-1")) else "malformed header field")
        fields = _FIELD.findall(head, eol + 2)
        if len(fields) > MAX_HEADERS:
            return self._fail(431, "more than %d header fields" % MAX_HEADERS)
        headers = {name.lower(): value.rstrip(" \t") for name, value in fields}
        if len(headers) != len(fields):
            # Repeated fields: join them, except Content-Length, which must agree.
            headers = {}
            for name, value in fields:
                name = name.lower()
                value = value.rstrip(" \t")
                if name not in headers:
                    headers[name] = value
                elif name == "content-length":
                    if value != headers[name]:
                        return self._fail(400, "conflicting Content-Length fields")
                else:
                    headers[name] = headers[name] + ", " + value
        self._method = method
        self._target = target
        self._version = (1, int(minor))
        self._headers = headers

        te = headers.get("transfer-encoding")
        cl = headers.get("content-length")
        if te is not None:
            if cl is not None:
                return self._fail(400, "both Content-Length and Transfer-Encoding")
            codings = [c.strip().lower() for c in te.split(",")]
            if codings[-1] != "chunked":
                return self._fail(400, "Transfer-Encoding does not end in chunked")
            if len(codings) != 1:
                return self._fail(501, "transfer coding %r is not supported" % te)
            self._body = bytearray()
            self._trailer_bytes = 0
            self._state = _CHUNK_SIZE_LINE
            self._want_continue()
            return self._read_chunked()
        if cl is not None:
            if not (cl.isascii() and cl.isdigit()) or len(cl) > 18:
                return self._fail(400, "malformed Content-Length")
            length = int(cl)
            if length > self._max_body:
                return self._fail(413, "the body is over %d bytes" % self._max_body)
            if length:
                self._remaining = length
                self._state = _BODY
                self._want_continue()
                return self._read_body()
        return self._complete(b"")

    def _want_continue(self) -> None:
        if self._version >= (1, 1) and self._headers.get("expect", "").lower() == "100-continue":
            self.continue_wanted = True

    def _complete(self, body: bytes) -> ParsedRequest:
        self._state = _HEAD
        self.continue_wanted = False
        return ParsedRequest(self._method, self._target, self._version, self._headers, body)

    def _read_body(self) -> ParsedRequest | None:
        buf = self._buf
        n = self._remaining
        if len(buf) < n:
            return None
        if len(buf) == n:
            body = bytes(buf)
            buf.clear()
        else:
            body = bytes(buf[:n])
            del buf[:n]
        return self._complete(body)

    def _read_chunked(self) -> ParsedRequest | BadRequest | None:
        buf = self._buf
        while True:
            state = self._state
            if state == _CHUNK_SIZE_LINE:
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > MAX_CHUNK_LINE:
                        return self._fail(400, "chunk-size line too long")
                    return None
                if i > MAX_CHUNK_LINE:
                    return self._fail(400, "chunk-size line too long")
                size, _, ext = bytes(buf[:i]).partition(b";")
                del buf[: i + 2]
                size = size.rstrip(b" \t")
                if _CHUNK_SIZE.fullmatch(size) is None or _CHUNK_EXT.fullmatch(ext) is None:
                    return self._fail(400, "malformed chunk-size line")
                n = int(size, 16)
                if n == 0:
                    self._state = _TRAILERS
                elif len(self._body) + n > self._max_body:
                    return self._fail(413, "the body is over %d bytes" % self._max_body)
                else:
                    self._remaining = n
                    self._state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                n = self._remaining
                if len(buf) < n + 2:
                    return None
                if buf[n : n + 2] != b"\r\n":
                    return self._fail(400, "chunk data does not end in CRLF")
                self._body += buf[:n]
                del buf[: n + 2]
                self._state = _CHUNK_SIZE_LINE
            else:  # _TRAILERS: read and drop; nothing here uses them
                i = buf.find(b"\r\n")
                if i < 0:
                    if self._trailer_bytes + len(buf) > self._max_head:
                        return self._fail(431, "trailer fields over %d bytes" % self._max_head)
                    return None
                line = bytes(buf[:i])
                del buf[: i + 2]
                if not line:
                    return self._complete(bytes(self._body))
                self._trailer_bytes += i + 2
                if self._trailer_bytes > self._max_head:
                    return self._fail(431, "trailer fields over %d bytes" % self._max_head)
                if _TRAILER.fullmatch(line) is None:
                    return self._fail(400, "malformed trailer field")


# Content codings of request bodies -----------------------------------------

# A coding's zlib window bits: gzip's header and trailer, zlib's (deflate).
_CODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}
# Decompressed in pieces this large, so a bomb is caught at the limit, not after it.
_INFLATE_STEP = 256 * 1024
MAX_CODINGS = 2
# gzip members one after another (RFC 1952 §2.2): a client sends one; each
# further one copies the rest of the body (zlib's unused_data), so thousands of
# empty ones would hold the reactor for minutes.
MAX_GZIP_MEMBERS = 16


def decoded_body(coding: str, body: bytes, limit: int) -> bytes | BadRequest:
    """``body`` undone of its ``Content-Encoding`` (``gzip``, ``deflate``, ``identity``, in the order
    applied), or a BadRequest: 413 once the decompressed body passes ``limit`` bytes, 415 for
    another coding, 400 for one that does not decode.
    """
    codings = [c.strip().lower() for c in coding.split(",") if c.strip()]
    if len(codings) > MAX_CODINGS:
        return BadRequest(400, "the body's Content-Encoding lists %d codings; the router undoes at most %d"
                               % (len(codings), MAX_CODINGS))
    for name in reversed(codings):
        if name == "identity":
            continue
        wbits = _CODINGS.get(name)
        if wbits is None:
            return BadRequest(415, "the body's Content-Encoding %r is not one the router decodes: send it as gzip, "
                                   "deflate or uncompressed" % name)
        out = _inflate(body, wbits, limit)
        if out.__class__ is BadRequest and name == "deflate":
            # Some clients send deflate without zlib's header (raw DEFLATE).
            raw = _inflate(body, -15, limit)
            if raw.__class__ is not BadRequest or raw.status == 413:
                out = raw
        if out.__class__ is BadRequest:
            return out
        body = out
    return body


def _inflate(data: bytes, wbits: int, limit: int) -> bytes | BadRequest:
    parts: list[bytes] = []
    size = 0
    members = 0
    while True:
        members += 1
        if members > MAX_GZIP_MEMBERS:
            return BadRequest(400, "the body's gzip data is more than %d members one after another: compress it as "
                                   "one" % MAX_GZIP_MEMBERS)
        inflater = zlib.decompressobj(wbits)
        try:
            piece = inflater.decompress(data, _INFLATE_STEP)
            while True:
                size += len(piece)
                if size > limit:
                    return BadRequest(413, "the body is over %d bytes once decompressed (router.max_body_bytes)" % limit)
                parts.append(piece)
                if not inflater.unconsumed_tail:
                    break
                piece = inflater.decompress(inflater.unconsumed_tail, _INFLATE_STEP)
            rest = inflater.flush()
        except zlib.error as e:
            return BadRequest(400, "the body does not decode as its Content-Encoding says: %s" % e)
        size += len(rest)
        if size > limit:
            return BadRequest(413, "the body is over %d bytes once decompressed (router.max_body_bytes)" % limit)
        parts.append(rest)
        if not inflater.eof:
            return BadRequest(400, "the body does not decode as its Content-Encoding says: it ends before its "
                                   "compressed data does")
        data = inflater.unused_data
        # gzip allows members one after another (RFC 1952 §2.2).
        if not data or wbits != 31:
            break
    if data:
        return BadRequest(400, "the body does not decode as its Content-Encoding says: bytes follow its end")
    return b"".join(parts)


# Responses ---------------------------------------------------------------

_STATUS_LINES = {code: b"HTTP/1.1 %d %s\r\n" % (code, reason.encode()) for code, reason in STATUS_REASONS.items()}
JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"


class DateHeader:
    """The Date field, formatted once a second rather than once a response."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._second = -1
        self._line = b""

    def __call__(self) -> bytes:
        now = int(self._clock())
        if now != self._second:
            self._second = now
            self._line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d Status %d\r\n" % (status, status)
    return line


def connection_field(request: ParsedRequest | None, keep_alive: bool) -> bytes:
    """What the response says about the connection: close, keep-alive for HTTP/1.0, or nothing."""
    if not keep_alive:
        return b"Connection: close\r\n"
    if request is not None and request.version < (1, 1):
        return b"Connection: keep-alive\r\n"
    return b""


def response_bytes(
    status: int,
    body: bytes,
    date: bytes,
    *,
    content_type: bytes = JSON,
    connection: bytes = b"",
    extra: bytes = b"",
) -> bytes:
    """A whole response with a Content-Length body; ``extra`` is ready-made header lines."""
    return b"".join(
        (
            status_line(status),
            date,
            b"Content-Type: ",
            content_type,
            b"\r\nContent-Length: ",
            str(len(body)).encode(),
            b"\r\n",
            connection,
            extra,
            b"\r\n",
            body,
        )
    )


def chunk(data: bytes) -> bytes:
    """One chunk of a Transfer-Encoding: chunked body (``data`` must not be empty)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
