"""The HTTP/1.1 request parser and the connection, fed bytes directly: never an exception.

Whatever arrives, in whatever pieces, the parser produces a request, asks for
more, or gives a status to answer before closing.  Valid requests survive
being split anywhere and pipelined back to back.
"""

from __future__ import annotations

import asyncio
import io
import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llmgw.sim.connection import HTTPConnection
from llmgw.sim.engine import SimEngine
from llmgw.http11 import DateHeader, BadRequest, ParsedRequest, RequestParser
from llmgw.sim.options import SimOptions

ERROR_STATUSES = {400, 413, 431, 501, 505}


def drain(parser: RequestParser) -> list[ParsedRequest | BadRequest]:
    """Every outcome the parser has now; stops at "need more" or at an error."""
    out: list[ParsedRequest | BadRequest] = []
    while True:
        item = parser.next_request()
        if item is None:
            return out
        assert isinstance(item, (ParsedRequest, BadRequest))
        out.append(item)
        if isinstance(item, BadRequest):
            assert item.status in ERROR_STATUSES
            # An error is final: the parser says it again rather than reading on.
            assert parser.next_request() is item
            return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points + [len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


# Requests built from parts, valid by construction ----------------------------

tokens = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~", min_size=1, max_size=12)
values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip)
paths = st.from_regex(r"/[a-zA-Z0-9/_.\-?=&%]{0,30}", fullmatch=True)
framing_names = {"content-length", "transfer-encoding", "connection", "expect"}


@st.composite
def valid_requests(draw) -> tuple[bytes, dict]:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "OPTIONS", "PATCH"]))
    path = draw(paths)
    fields = draw(st.lists(st.tuples(tokens, values), max_size=8).map(
        lambda fs: [(n, v) for n, v in fs if n.lower() not in framing_names]))
    body = draw(st.binary(max_size=200))
    chunked = draw(st.booleans())
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields)
    if chunked:
        sizes = draw(st.lists(st.integers(1, 50), max_size=10))
        pieces, i = [], 0
        for size in sizes:
            if i >= len(body):
                break
            pieces.append(body[i : i + size])
            i += size
        if i < len(body):
            pieces.append(body[i:])
        raw = (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
        raw += b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    else:
        raw = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    return raw, {"method": method, "target": path, "body": body, "fields": fields}


@given(st.lists(valid_requests(), min_size=1, max_size=4), st.lists(st.integers(0, 10_000), max_size=20))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_valid_requests_survive_any_split_and_pipelining(requests, cuts):
    stream = b"".join(raw for raw, _ in requests)
    parser = RequestParser()
    got: list[ParsedRequest | BadRequest] = []
    for piece in split(stream, cuts):
        parser.feed(piece)
        got += drain(parser)
    assert [type(g) for g in got] == [ParsedRequest] * len(requests)
    for request, (_, want) in zip(got, requests):
        assert request.method == want["method"]
        assert request.target == want["target"]
        assert request.body == want["body"]
        assert request.keep_alive
        for name, value in want["fields"]:
            assert value in request.headers[name.lower()]
    assert parser.buffered == 0


# Anything at all -------------------------------------------------------------

@given(st.binary(max_size=600), st.lists(st.integers(0, 10_000), max_size=10))
@settings(max_examples=500)
@example(b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", [])
@example(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n", [])
@example(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcdeXX", [])
@example(b"GET / HTTP/9.9\r\n\r\n", [])
@example(b"\r\n\r\n\r\nGET / HTTP/1.1\r\n\r\n", [3])
def test_arbitrary_bytes_give_a_request_more_please_or_an_error(data, cuts):
    parser = RequestParser(max_head_bytes=256, max_body_bytes=128)
    for piece in split(data, cuts):
        parser.feed(piece)
        outcomes = drain(parser)
        if outcomes and isinstance(outcomes[-1], BadRequest):
            return


@st.composite
def mutated_requests(draw) -> bytes:
    raw, _ = draw(valid_requests())
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(data) - 1)))
        action = draw(st.sampled_from(["flip", "insert", "delete"]))
        byte = draw(st.sampled_from([0, 9, 10, 13, 32, 58, 59, 127, 255, ord("0"), ord("f")]))
        if action == "flip" and data:
            data[i] = byte
        elif action == "insert":
            data.insert(i, byte)
        elif data:
            del data[i]
    return bytes(data)


@given(mutated_requests(), st.lists(st.integers(0, 10_000), max_size=6))
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_nearly_valid_requests_never_raise(data, cuts):
    parser = RequestParser(max_head_bytes=512, max_body_bytes=150)
    for piece in split(data, cuts):
        parser.feed(piece)
        outcomes = drain(parser)
        if outcomes and isinstance(outcomes[-1], BadRequest):
            return


def test_each_refusal_has_its_status():
    cases = {
        b"GET / HTTP/2.0\r\n\r\n": 505,
        b"GET / HTTP/1.1\r\nContent-Length: 20\r\n\r\n": 413,
        b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n": 431,
        b"GET / HTTP/1.1\r\nTransfer-Encoding: br, chunked\r\n\r\n": 501,
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n": 400,
    }
    for raw, status in cases.items():
        parser = RequestParser(max_body_bytes=10)
        parser.feed(raw)
        outcome = parser.next_request()
        assert isinstance(outcome, BadRequest) and outcome.status == status, (raw, outcome)


def test_http_1_0_keeps_alive_only_when_asked_and_repeated_fields_join():
    parser = RequestParser()
    parser.feed(b"GET / HTTP/1.0\r\nAccept: a\r\nAccept: b\r\n\r\nGET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
    first, second = parser.next_request(), parser.next_request()
    assert (first.keep_alive, second.keep_alive) == (False, True)
    assert first.headers["accept"] == "a, b"


def test_expect_100_continue_is_wanted_until_the_body_arrives():
    parser = RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert parser.next_request() is None
    assert parser.continue_wanted
    parser.feed(b"ok")
    assert parser.next_request().body == b"ok"
    assert not parser.continue_wanted


# The connection with the simulator behind it, on a fake transport -------------

class FakeTransport:
    def __init__(self):
        self.out = bytearray()
        self.closed = False
        self.eof = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "wrote after closing"
        assert not self.eof, "wrote after write_eof"
        self.out += data

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 50000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _chat(stream: bool) -> bytes:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a b"}], "stream": stream}).encode()
    return b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


fragments = st.sampled_from([
    _chat(False), _chat(True), b"GET /health HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/1.1\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\n\r\n", b"POST /v1/embeddings HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
    b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n", b"\r\n", b"HTTP/1.1", b"\x00", b"{", b"\r\n\r\n",
])


@given(st.lists(st.one_of(fragments, st.binary(max_size=40)), max_size=8), st.lists(st.integers(0, 10_000), max_size=8))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_connection_answers_whatever_it_is_fed_without_raising(parts, cuts):
    async def run() -> FakeTransport:
        sim = SimEngine(SimOptions(model="m", log_requests=True), port=0, out=io.StringIO())
        conn = HTTPConnection(sim, set(), DateHeader(), max_body_bytes=1000)
        transport = FakeTransport()
        conn.connection_made(transport)
        for piece in split(b"".join(parts), cuts):
            if transport.closed or transport.eof:
                break
            conn.data_received(piece)
        conn.connection_lost(None)
        return transport

    loop = asyncio.new_event_loop()
    try:
        transport = loop.run_until_complete(run())
    finally:
        loop.close()
    out = bytes(transport.out)
    assert out == b"" or out.startswith(b"HTTP/1.1 ")
    # Every response is one the simulator means to give.
    statuses = {int(line.split(b" ")[1]) for line in out.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")}
    assert statuses <= {100, 200, 400, 404, 405, 413, 431, 501, 505}
