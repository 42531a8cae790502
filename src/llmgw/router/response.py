"""Reading an engine's responses: where each one's head and body end, without copying what can be relayed.

The router relays an engine's bytes as they arrive, chunked framing included,
so the parser's job is to find boundaries, not to rebuild messages:
``head(data)`` says where the head ends, ``body(data, start)`` where the body
does.  Like the request parser in ``llmgw.http11`` it is a plain object with no
I/O, and it never raises on any input: an engine that answers garbage is an
upstream failure, not a crash of the router.

Framing follows RFC 9112 §6.3 for the responses to POST and GET: no body for
1xx, 204 and 304; chunked when Transfer-Encoding ends in chunked; else
Content-Length; else the body runs until the engine closes.  Interim 1xx
responses are skipped.  Both Content-Length and Transfer-Encoding, two
different Content-Lengths, or a transfer coding other than one "chunked" are
refused: an engine that says its length two ways cannot be relayed safely.
"""

from __future__ import annotations

import re

from llmgw.http11 import MAX_CHUNK_LINE, MAX_HEAD_BYTES, STATUS_REASONS, chunk_size, header_fields, is_trailer_field

NEED_MORE = -1
"""``body()``: every byte given belonged to the body, and it goes on."""
ERROR = -2
"""``body()``: the framing is broken; ``parser.error`` says how."""

# How a body is delimited.
NONE, LENGTH, CHUNKED, UNTIL_CLOSE = range(4)

_STATUS_LINE = re.compile(r"HTTP/1\.([0-9]) ([0-9]{3})(?: [\t\x20-\x7e\x80-\xff]*)?")
# Fields that describe one connection and must not be passed to another.
HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "te", "upgrade", "transfer-encoding"))
# Fields an engine's answer loses on its way to a client: the engine's
# software and version (uvicorn's for vLLM) are nobody's business but the
# operator's, as llmgw's own listeners name none (docs/security.rst); and the
# engine's CORS fields (llama.cpp's server sends Access-Control-Allow-Origin
# always): router.cors alone says which pages may read an answer, and a
# browser refuses an answer with two Access-Control-Allow-Origin fields.  The
# engine's X-Request-Id too (vLLM's --enable-request-id-headers): the
# router's is the request's, and two make the clients read "a, b".
NOT_RELAYED = HOP_BY_HOP | frozenset((
    "server", "x-powered-by", "x-request-id", "access-control-allow-origin", "access-control-allow-credentials",
    "access-control-allow-methods", "access-control-allow-headers", "access-control-expose-headers",
    "access-control-max-age"))

_SIZE, _DATA, _DATA_CRLF, _TRAILER, _DONE = range(5)
# Interim responses skipped before a final one.
MAX_INTERIM = 8
_PLAIN_CHUNK = re.compile(rb"([0-9A-Fa-f]{1,16})\r\n")


class ResponseHead:
    """A response's status line and fields, and how its body is delimited."""

    __slots__ = ("status", "minor", "fields", "framing", "length", "keep_alive", "clean", "size")

    def __init__(self, status: int, minor: int, fields: list[tuple[str, str]], framing: int, length: int, keep_alive: bool, clean: bool, size: int):
        self.status = status
        self.minor = minor
        self.fields = fields
        self.framing = framing
        self.length = length
        self.keep_alive = keep_alive
        # Can go as it is to an HTTP/1.1 client on a kept-alive connection:
        # HTTP/1.1, nothing hop-by-hop or NOT_RELAYED but "Transfer-Encoding: chunked".
        self.clean = clean
        self.size = size

    def field(self, name: str) -> str | None:
        """The value of field ``name`` (lower case), or None."""
        for n, value in self.fields:
            if n.lower() == name:
                return value
        return None

    def __repr__(self) -> str:
        return f"<ResponseHead {self.status} framing={self.framing} length={self.length} keep_alive={self.keep_alive}>"


class ParseError:
    """The engine's response cannot be read."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return f"<ParseError {self.message!r}>"


class ResponseParser:
    """The boundaries of one response after another on one connection."""

    __slots__ = ("_buf", "_framing", "_remaining", "_state", "_line", "_trailer_bytes", "_interim", "raw", "body_start",
                 "error")

    def __init__(self) -> None:
        self._buf = b""
        self._framing = NONE
        self._remaining = 0
        self._state = _SIZE
        self._line = b""
        self._trailer_bytes = 0
        # Interim (1xx) responses before the one being read.
        self._interim = 0
        # After head() returned a head: the bytes it was read from (the data
        # given, or what was buffered with it) and where the body starts in them.
        self.raw = b""
        self.body_start = 0
        self.error = ""

    def reset(self) -> None:
        """Expect the head of a new response."""
        self._buf = b""
        self.raw = b""
        self._interim = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    # The head -----------------------------------------------------------------

    def head(self, data: bytes) -> ResponseHead | ParseError | None:
        """Read ``data`` for a head: the head when it is complete (the body starts at ``self.body_start`` of ``self.raw``), None for more."""
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0 or end > MAX_HEAD_BYTES:
                if end > MAX_HEAD_BYTES or len(buf) > MAX_HEAD_BYTES:
                    self._buf = b""
                    return ParseError("the response head is over %d bytes" % MAX_HEAD_BYTES)
                self._buf = bytes(buf)
                return None
            result = self._parse_head(buf, end)
            if result.__class__ is ResponseHead and 100 <= result.status < 200:
                if result.status == 101:
                    return self._refuse("the engine switched protocols")
                # The router sends no Expect, so an engine has no reason for one; each skipped copies the rest.
                self._interim += 1
                if self._interim > MAX_INTERIM:
                    return self._refuse("the engine sent more than %d interim (1xx) responses" % MAX_INTERIM)
                buf = buf[end + 4 :]
                continue
            self._buf = b""
            self._interim = 0
            if result.__class__ is ResponseHead:
                self.raw = buf
                self.body_start = end + 4
            return result

    def _refuse(self, message: str) -> ParseError:
        self._buf = b""
        return ParseError(message)

    def _parse_head(self, buf: bytes, end: int) -> ResponseHead | ParseError:
        text = buf[: end + 2].decode("latin-1")
        eol = text.index("\r\n")
        m = _STATUS_LINE.fullmatch(text, 0, eol)
        if m is None:
            return self._refuse("malformed status line %r" % text[:eol][:80])
        minor = int(m.group(1))
        status = int(m.group(2))
        fields = header_fields(text, eol + 2)
        if fields is None:
            return self._refuse("malformed header field")
        length = -1
        te = connection = None
        clean = minor == 1
        for name, value in fields:
            lname = name.lower()
            if lname == "content-length":
                if not (value.isascii() and value.isdigit()) or len(value) > 18 or (length >= 0 and int(value) != length):
                    return self._refuse("malformed Content-Length %r" % value[:40])
                length = int(value)
            elif lname in NOT_RELAYED:
                if lname == "transfer-encoding":
                    # Engines chunk and do nothing else; a relay that passes
                    # framing through cannot re-code gzip or a doubled chunked.
                    if te is not None or value.strip().lower() != "chunked":
                        return self._refuse("transfer coding %r is not supported" % value[:40])
                    te = value
                else:
                    clean = False
                    if lname == "connection":
                        connection = value.lower() if connection is None else connection + ", " + value.lower()
        if status < 200 or status in (204, 304):
            framing, length = NONE, 0
        elif te is not None:
            if length >= 0:
                return self._refuse("both Content-Length and Transfer-Encoding")
            framing = CHUNKED
        elif length >= 0:
            framing = LENGTH
        else:
            framing = UNTIL_CLOSE
        if framing == UNTIL_CLOSE:
            keep_alive = clean = False
        elif minor >= 1:
            keep_alive = connection is None or "close" not in connection
        else:
            keep_alive = connection is not None and "keep-alive" in connection
        self._framing = framing
        self._remaining = length
        self._state = _SIZE
        self._line = b""
        self._trailer_bytes = 0
        return ResponseHead(status, minor, fields, framing, length, keep_alive, clean, end + 4)

    # The body -----------------------------------------------------------------

    def body(self, data: bytes, start: int = 0, out: list[bytes] | None = None) -> int:
        """Read ``data[start:]`` as body: where in ``data`` the body ended, NEED_MORE, or ERROR.

        With ``out``, the body's content (without chunked framing) is appended to it.
        """
        framing = self._framing
        if framing == LENGTH:
            remaining = self._remaining
            available = len(data) - start
            if available < remaining:
                self._remaining = remaining - available
                if out is not None and available:
                    out.append(data[start:])
                return NEED_MORE
            self._remaining = 0
            self._framing = NONE
            if out is not None and remaining:
                out.append(data[start : start + remaining])
            return start + remaining
        if framing == CHUNKED:
            return self._chunked(data, start, out)
        if framing == UNTIL_CLOSE:
            if out is not None and len(data) > start:
                out.append(data[start:])
            return NEED_MORE
        return start

    def between_chunks(self) -> bool:
        """A chunked body is read up to the end of a chunk: what comes next is a chunk-size line, not yet begun."""
        return self._framing == CHUNKED and self._state == _SIZE and not self._line

    def eof(self) -> bool:
        """The engine closed the connection: whether that completed the body."""
        return self._framing == UNTIL_CLOSE or self._framing == NONE

    def _fail(self, message: str) -> int:
        self.error = message
        self._framing = NONE
        self._state = _DONE
        return ERROR

    def _chunked(self, data: bytes, i: int, out: list[bytes] | None) -> int:
        n = len(data)
        state = self._state
        match = _PLAIN_CHUNK.match
        while i < n:
            if state == _SIZE and not self._line:
                # The common case, a whole "SIZE\r\nDATA\r\n" in this read, in one
                # regex match; anything else (extensions, a split line) below.
                m = match(data, i)
                if m is not None:
                    size = int(m.group(1), 16)
                    j = m.end()
                    if not size:
                        i = j
                        state = self._state = _TRAILER
                        if data[i : i + 2] == b"\r\n":
                            self._state = _DONE
                            self._framing = NONE
                            return i + 2
                        continue
                    e = j + size
                    if e + 2 <= n and data[e] == 13 and data[e + 1] == 10:
                        if out is not None:
                            out.append(data[j:e])
                        i = e + 2
                        continue
                    i = j
                    self._remaining = size
                    state = self._state = _DATA
                    continue
            if state == _DATA:
                remaining = self._remaining
                if n - i < remaining:
                    if out is not None:
                        out.append(data[i:])
                    self._remaining = remaining - (n - i)
                    return NEED_MORE
                if out is not None:
                    out.append(data[i : i + remaining])
                i += remaining
                # The CRLF after the data, which may itself arrive split.
                self._remaining = 2
                state = self._state = _DATA_CRLF
            elif state == _DATA_CRLF:
                want = self._remaining
                got = data[i : i + want]
                if got != b"\r\n"[2 - want : 2 - want + len(got)]:
                    return self._fail("chunk data does not end in CRLF")
                i += len(got)
                self._remaining = want - len(got)
                if self._remaining:
                    return NEED_MORE
                state = self._state = _SIZE
            elif state == _SIZE or state == _TRAILER:
                j = data.find(b"\n", i)
                if j < 0:
                    line = self._line + data[i:] if self._line else data[i:]
                    if len(line) > MAX_CHUNK_LINE:
                        return self._fail("chunk-size or trailer line too long")
                    self._line = line
                    return NEED_MORE
                line = self._line + data[i:j] if self._line else data[i:j]
                self._line = b""
                i = j + 1
                if not line.endswith(b"\r"):
                    return self._fail("a line of the chunked body does not end in CRLF")
                line = line[:-1]
                if state == _SIZE:
                    if len(line) > MAX_CHUNK_LINE:
                        return self._fail("chunk-size line too long")
                    size = chunk_size(line)
                    if size is None:
                        return self._fail("malformed chunk-size line")
                    if size:
                        self._remaining = size
                        state = self._state = _DATA
                    else:
                        state = self._state = _TRAILER
                elif not line:
                    self._state = _DONE
                    self._framing = NONE
                    return i
                else:
                    self._trailer_bytes += len(line) + 2
                    if self._trailer_bytes > MAX_HEAD_BYTES:
                        return self._fail("trailer fields over %d bytes" % MAX_HEAD_BYTES)
                    if not is_trailer_field(line):
                        return self._fail("malformed trailer field")
            else:
                return self._fail("bytes after the end of a chunked body")
        return NEED_MORE


def relay_head(head: ResponseHead, *, close: bool, dechunk: bool) -> bytes:
    """The head to send a client in place of an unclean one: HTTP/1.1, hop-by-hop fields dropped.

    ``close``: say the connection closes after this response.  ``dechunk``: the
    body will go without chunked framing (to an HTTP/1.0 client).
    """
    lines = [b"HTTP/1.1 %d %s\r\n" % (head.status, _reason(head.status))]
    chunked = head.framing == CHUNKED and not dechunk
    for name, value in head.fields:
        if name.lower() not in NOT_RELAYED:
            lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    if chunked:
        lines.append(b"Transfer-Encoding: chunked\r\n")
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _reason(status: int) -> bytes:
    return STATUS_REASONS.get(status, "Status %d" % status).encode()
