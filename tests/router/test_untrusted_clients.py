"""What a client sends is not believed: JSON without NaN, HEAD without a body, lines that end in CRLF."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import threads

from tests.support.net import connect, post
from tests.support.sim import MODEL

from .routerharness import StaticDispatcher, chat, endpoint_of, exchange


def error_of(body: bytes) -> dict:
    payload = json.loads(body)
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code", "request_id"}
    return payload["error"]


async def ask(router, raw: bytes, responses: int = 1, then_closed: bool = False):
    return await threads.deferToThread(exchange, router.address, raw, responses, then_closed=then_closed)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest_twisted.ensureDeferred
async def test_nan_and_infinity_in_a_body_are_400_not_relayed(sim, make_router, constant):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    text = json.dumps(chat()).encode()[:-1] + b', "temperature": %s}' % constant.encode()
    (status, _, body), (after, _, _) = await ask(router, post("/v1/chat/completions", text) * 2, 2)
    assert status == after == 400
    error = error_of(body)
    assert error["type"] == "invalid_request_error" and constant in error["message"]
    assert dispatcher.requests == []


def _heads_then_next(port: int, raw: bytes, heads: int) -> tuple[list[tuple[int, dict[str, str]]], bytes]:
    """Send ``raw``; read ``heads`` response heads with no body after them, then the status line that follows."""
    with connect(port) as s:
        s.sendall(raw)
        f = s.makefile("rb")
        out = []
        for _ in range(heads):
            status = int(f.readline().split()[1])
            headers = {}
            while (line := f.readline()) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            out.append((status, headers))
        return out, f.readline()


@pytest_twisted.ensureDeferred
async def test_head_is_answered_without_a_body_on_every_route(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    paths = ["/v1/models", f"/v1/models/{MODEL}", "/v1/models/nope", "/v1/chat/completions", "/nothing"]
    raw = b"".join(b"HEAD %s HTTP/1.1\r\nHost: r\r\n\r\n" % p.encode() for p in paths)
    raw += b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"
    heads, following = await threads.deferToThread(_heads_then_next, router.address, raw, len(paths))
    gets = await ask(router, b"".join(b"GET %s HTTP/1.1\r\nHost: r\r\n\r\n" % p.encode() for p in paths), len(paths))
    # The status and Content-Length a GET would have (the 404 names the method, one letter longer),
    # and the next response right after the head.
    want = [(s, len(b) + (b"Invalid URL (GET" in b)) for s, _, b in gets]
    assert [(s, int(h["content-length"])) for s, h in heads] == want
    assert [s for s, _ in heads] == [200, 200, 404, 404, 404]
    assert following.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("raw", [
    b"GET /v1/models HTTP/1.1\nHost: r\n\n",
    b"GET /v1/models HTTP/1.1\r\nHost: r\n\r\n",
    b"GET /v1/models HTTP/1.1\n",
])
@pytest_twisted.ensureDeferred
async def test_a_bare_lf_is_answered_400_and_closed(sim, make_router, raw):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    status, headers, body = await ask(router, raw, then_closed=True)
    assert status == 400 and headers["connection"] == "close"
    assert "CRLF" in error_of(body)["message"]
