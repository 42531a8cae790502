"""The parser of engines' responses: boundaries found exactly however the bytes arrive, and no input makes it raise."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.router.response import (
    CHUNKED,
    ERROR,
    LENGTH,
    NEED_MORE,
    NONE,
    UNTIL_CLOSE,
    ParseError,
    ResponseHead,
    ResponseParser,
    relay_head,
)


def read_all(parser: ResponseParser, pieces: list[bytes], dechunk: bool = False):
    """Feed ``pieces`` one by one: (head, bytes that belong to the response, body content, leftover, error)."""
    head = None
    taken = []
    content: list[bytes] | None = [] if dechunk else None
    for k, piece in enumerate(pieces):
        if head is None:
            head = parser.head(piece)
            if head is None:
                continue
            if isinstance(head, ParseError):
                return head, b"".join(taken), None, b"", head.message
            data, start = parser.raw, parser.body_start
            taken.append(data[:start])
        else:
            data, start = piece, 0
        end = parser.body(data, start, content)
        assert end in (NEED_MORE, ERROR) or start <= end <= len(data), (end, start, len(data))
        if end == ERROR:
            return head, b"".join(taken), content, b"", parser.error
        if end == NEED_MORE:
            taken.append(data[start:])
            continue
        taken.append(data[start:end])
        return head, b"".join(taken), content, data[end:] + b"".join(pieces[k + 1 :]), None
    return head, b"".join(taken), content, b"", "incomplete"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a] or [data]


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


def test_content_length_response_in_one_read_is_relayed_without_copies():
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    p = ResponseParser()
    head = p.head(raw)
    assert isinstance(head, ResponseHead)
    assert (head.status, head.framing, head.length, head.keep_alive, head.clean) == (200, LENGTH, 2, True, True)
    assert p.raw is raw and p.body_start == len(raw) - 2
    assert p.body(raw, p.body_start) == len(raw)


def test_chunked_stream_with_extensions_and_trailers():
    body = b"5;name=value\r\nhello\r\n1\r\n!\r\n0\r\nX-Trailer: yes\r\n\r\n"
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    for pieces in ([raw], [bytes([b]) for b in raw]):
        head, taken, content, rest, error = read_all(ResponseParser(), pieces, dechunk=True)
        assert error is None and head.framing == CHUNKED and head.clean
        assert taken == raw and b"".join(content) == b"hello!" and rest == b""


def test_interim_responses_are_skipped():
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nServer: x\r\n\r\n"
    p = ResponseParser()
    head = p.head(raw)
    assert head.status == 204 and head.framing == NONE
    assert p.body(p.raw, p.body_start) == p.body_start


@pytest.mark.parametrize(
    "raw, framing, keep_alive, clean",
    [
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", LENGTH, False, False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", LENGTH, True, False),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", LENGTH, False, False),
        (b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n", LENGTH, True, False),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", UNTIL_CLOSE, False, False),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", NONE, True, True),
    ],
)
def test_framing_and_connection(raw, framing, keep_alive, clean):
    head = ResponseParser().head(raw)
    assert (head.framing, head.keep_alive, head.clean) == (framing, keep_alive, clean)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Field: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000 + b"\r\n\r\n",
    ],
)
def test_unreadable_heads_are_errors(raw):
    assert isinstance(ResponseParser().head(raw), ParseError)


@pytest.mark.parametrize(
    "body",
    [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabXY0\r\n\r\n", b"2\nab\r\n0\r\n\r\n", b"0\r\nbad trailer\r\n\r\n", b"1" * 5000],
)
def test_broken_chunked_framing_is_an_error(body):
    head, _, _, _, error = read_all(ResponseParser(), [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body])
    assert error not in (None, "incomplete")


def test_relay_head_drops_hop_by_hop_fields():
    head = ResponseParser().head(
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Trace: 7\r\nContent-Length: 2\r\n\r\n")
    assert relay_head(head, close=True, dechunk=False) == (
        b"HTTP/1.1 200 OK\r\nX-Trace: 7\r\nContent-Length: 2\r\nConnection: close\r\n\r\n")
    head = ResponseParser().head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert relay_head(head, close=True, dechunk=True) == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"


def test_a_connection_carries_responses_one_after_another():
    p = ResponseParser()
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA"
    second = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nB\r\n0\r\n\r\n"
    for raw in (first, second):
        p.reset()
        head = p.head(raw)
        assert p.body(p.raw, p.body_start) == len(raw)


# Properties -----------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=8), st.booleans())
def test_arbitrary_bytes_never_raise(pieces, dechunk):
    head, taken, content, rest, error = read_all(ResponseParser(), pieces, dechunk)
    assert head is None or isinstance(head, (ResponseHead, ParseError))


_FIELD_NAMES = st.sampled_from(["Content-Type", "Server", "X-Request-Id", "Content-Length", "Transfer-Encoding", "Connection"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_FIELD_NAMES, st.sampled_from(["chunked", "7", "close", "a b", "", "gzip"])), max_size=5),
    st.binary(max_size=300),
    st.lists(st.integers(min_value=0, max_value=1000), max_size=6),
)
def test_arbitrary_heads_and_bodies_never_raise(fields, tail, cuts):
    raw = b"HTTP/1.1 200 OK\r\n" + b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in fields) + b"\r\n" + tail
    head, taken, content, rest, error = read_all(ResponseParser(), split(raw, cuts), dechunk=True)
    assert isinstance(head, (ResponseHead, ParseError))
    if error is None:
        assert taken + rest == raw


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=300), max_size=10),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
    st.binary(max_size=40),
)
def test_valid_responses_end_exactly_where_they_end(parts, use_chunked, cuts, after):
    content = b"".join(parts)
    if use_chunked:
        raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(parts)
    else:
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(content), content)
    head, taken, got, rest, error = read_all(ResponseParser(), split(raw + after, cuts), dechunk=True)
    assert error is None
    assert taken == raw and rest == after
    assert b"".join(got) == content


def test_interim_responses_are_skipped_a_few_and_no_more():
    from llmgw.router.response import MAX_INTERIM
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    final = b"HTTP/1.1 204 No Content\r\n\r\n"
    assert ResponseParser().head(interim * MAX_INTERIM + final).status == 204
    # A flood, in one read or one a read: each one skipped copied the rest of what was read.
    assert isinstance(ResponseParser().head(interim * 2000 + final), ParseError)
    p = ResponseParser()
    assert [p.head(interim) for _ in range(MAX_INTERIM)] == [None] * MAX_INTERIM
    assert isinstance(p.head(interim), ParseError)
