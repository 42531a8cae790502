"""What the relay adds to the heads it passes on: X-Request-Id both ways, CORS fields, a form's Content-Type.

The byte relay passes an engine's head on as it came but for these fields,
put after its status line; one it must rewrite (an HTTP/1.0 client) gets them
too, and so does the translation of /v1/responses (``test_translate``).
"""

from __future__ import annotations

import json
import re

import pytest_twisted
from twisted.internet import protocol, reactor, threads

from llmgw.router.cors import Cors
from llmgw.router.door import Door
from tests.support.net import connect, post
from tests.support.sim import MODEL

from .routerharness import StaticDispatcher, StaticEndpoint, endpoint_of, exchange


class StandInEngine:
    """An engine on 127.0.0.1 that answers every request with ``answer`` and keeps each request's head."""

    def __init__(self, answer: bytes):
        self.answer = answer
        self.heads: list[str] = []
        self.bodies: list[bytes] = []
        engine = self

        class _Connection(protocol.Protocol):
            buf = b""

            def dataReceived(self, data: bytes) -> None:
                self.buf += data
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].decode("latin-1")
                length = int(re.search(r"(?i)\r\ncontent-length: *(\d+)", head).group(1))
                if len(self.buf) < end + 4 + length:
                    return
                engine.bodies.append(self.buf[end + 4:end + 4 + length])
                self.buf = self.buf[end + 4 + length:]
                engine.heads.append(head)
                self.transport.write(engine.answer)

        factory = protocol.Factory.forProtocol(_Connection)
        factory.noisy = False
        self.port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.endpoint = StaticEndpoint("stand-in", "127.0.0.1", self.port.getHost().port)

    def field(self, n: int, name: str) -> str | None:
        m = re.search(r"(?im)^%s: *(.*)$" % re.escape(name), self.heads[n])
        return m.group(1).strip() if m else None


def json_answer(status: int, body: dict, reason: str = "OK") -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status, reason.encode(), len(data), data)


def _raw(port: int, path: str, body: dict, headers: dict[str, str], version: str = "1.1"):
    return exchange(port, post(path, body, headers, version=version))


@pytest_twisted.ensureDeferred
async def test_the_request_id_goes_to_the_engine_and_back_on_every_relayed_head(make_router):
    answer = {"id": "c1", "object": "chat.completion", "model": MODEL, "created": 1,
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    engine = StandInEngine(json_answer(200, answer))
    router = make_router(StaticDispatcher([engine.endpoint]))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    given = {"X-Request-Id": "trace-7"}
    try:
        # The byte relay as it came (HTTP/1.1), with a head rewritten (HTTP/1.0), and the translation.
        passed = await threads.deferToThread(_raw, router.address, "/v1/chat/completions", chat, given)
        rewritten = await threads.deferToThread(_raw, router.address, "/v1/chat/completions", chat, given, "1.0")
        translated = await threads.deferToThread(_raw, router.address, "/v1/responses", {"model": MODEL, "input": "hi"}, given)
        made = await threads.deferToThread(_raw, router.address, "/v1/responses", {"model": MODEL, "input": "hi"}, {})
    finally:
        await engine.port.stopListening()
    for n, (status, headers, body) in enumerate((passed, rewritten, translated)):
        assert status == 200 and headers["x-request-id"] == "trace-7", n
        assert engine.field(n, "X-Request-Id") == "trace-7"
    assert json.loads(translated[2])["output"][0]["content"][0]["text"] == "hi"
    assert re.fullmatch(r"[0-9a-f]{32}", made[1]["x-request-id"]) and engine.field(3, "X-Request-Id") == made[1]["x-request-id"]


@pytest_twisted.ensureDeferred
async def test_relayed_heads_carry_the_cors_fields_for_an_allowed_origin(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    router.factory.door = Door(cors=Cors(frozenset({"https://app.example"})))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    origin = {"Origin": "https://app.example"}
    passed = await threads.deferToThread(_raw, router.address, "/v1/chat/completions", chat, origin)
    translated = await threads.deferToThread(_raw, router.address, "/v1/responses", {"model": MODEL, "input": "hi"}, origin)
    other = await threads.deferToThread(_raw, router.address, "/v1/chat/completions", chat, {"Origin": "https://evil.example"})
    for status, headers, _ in (passed, translated):
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        assert headers["vary"] == "Origin" and "X-Request-Id" in headers["access-control-expose-headers"]
    assert "access-control-allow-origin" not in other[1]


@pytest_twisted.ensureDeferred
async def test_a_form_goes_to_the_engine_with_its_own_content_type(make_router):
    engine = StandInEngine(json_answer(200, {"text": "hello"}))
    router = make_router(StaticDispatcher([engine.endpoint]))
    boundary = "llmgw-test-boundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{MODEL}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            f"Content-Type: audio/wav\r\n\r\nRIFF....\r\n--{boundary}--\r\n").encode()
    content_type = f"multipart/form-data; boundary={boundary}"
    try:
        status, headers, body = await threads.deferToThread(
            exchange, router.address, post("/v1/audio/transcriptions", form, {"Content-Type": content_type}))
    finally:
        await engine.port.stopListening()
    assert status == 200 and json.loads(body) == {"text": "hello"}
    assert engine.field(0, "Content-Type") == content_type and engine.bodies[0] == form
    assert engine.field(0, "X-Request-Id") == headers["x-request-id"]


@pytest_twisted.ensureDeferred
async def test_an_engines_own_cors_fields_are_dropped_so_the_routers_are_the_only_ones(make_router):
    # As llama.cpp's server answers: an Access-Control-Allow-Origin always, empty when no Origin came.
    answer = (b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: \r\nAccess-Control-Allow-Credentials: true\r\n"
              b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    engine = StandInEngine(answer)
    router = make_router(StaticDispatcher([engine.endpoint]))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    origin = {"Origin": "https://app.example"}
    try:
        closed = await threads.deferToThread(_raw, router.address, "/v1/chat/completions", chat, origin)
        router.factory.door = Door(cors=Cors(frozenset({"https://app.example"})))
        allowed = await threads.deferToThread(_raw, router.address, "/v1/chat/completions", chat, origin)
        raw = await threads.deferToThread(_raw_head, router.address, post("/v1/chat/completions", chat, origin))
    finally:
        await engine.port.stopListening()
    assert closed[0] == 200 and "access-control-allow-origin" not in closed[1]
    assert allowed[0] == 200 and allowed[1]["access-control-allow-origin"] == "https://app.example"
    assert raw.lower().count(b"access-control-allow-origin:") == 1 and b"credentials" not in raw.lower()


@pytest_twisted.ensureDeferred
async def test_an_engines_own_request_id_is_replaced_by_the_routers(make_router):
    answer = b"HTTP/1.1 200 OK\r\nX-Request-Id: engine-made\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    engine = StandInEngine(answer)
    router = make_router(StaticDispatcher([engine.endpoint]))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    try:
        head = await threads.deferToThread(_raw_head, router.address, post("/v1/chat/completions", chat, {"X-Request-Id": "mine"}))
    finally:
        await engine.port.stopListening()
    assert head.lower().count(b"x-request-id:") == 1 and b"X-Request-Id: mine\r\n" in head + b"\r\n"


def _raw_head(port: int, raw: bytes) -> bytes:
    with connect(port) as s:
        s.sendall(raw)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        return got.split(b"\r\n\r\n")[0]
