"""Every route the router proxies, through a real router to the real sim (or a stand-in engine that keeps what it got).

Rerank, score, tokenize and detokenize reach the sim by the model their body
names; an audio upload (multipart/form-data) reaches an engine byte for byte
with its Content-Type; a gzip body is decompressed within router.max_body_bytes.
"""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
import pytest_twisted
from twisted.internet import protocol, reactor, threads

from llmgw.http11 import RequestParser, response_bytes
from tests.support.net import post
from tests.support.sim import MODEL

from .routerharness import StaticDispatcher, StaticEndpoint, chat, endpoint_of, exchange

BOUNDARY = "llmgw-test-boundary"
# Bytes that look like a boundary, a CRLF and every byte value: an upload must not be read as text.
AUDIO = b"RIFF\r\n--llmgw-test-bound\r\n" + bytes(range(256)) * 64


class RecordingEngine:
    """A stand-in engine on 127.0.0.1: keeps each request it is sent, answers 200 {"text": "heard"}."""

    def __init__(self):
        self.requests = []
        engine = self

        class _Connection(protocol.Protocol):
            def connectionMade(self):
                self.parser = RequestParser(max_body_bytes=64 << 20)

            def dataReceived(self, data: bytes) -> None:
                self.parser.feed(data)
                request = self.parser.next_request()
                if request is not None:
                    engine.requests.append(request)
                    self.transport.write(response_bytes(200, b'{"text": "heard"}', b""))

        factory = protocol.Factory.forProtocol(_Connection)
        factory.noisy = False
        self.port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.endpoint = StaticEndpoint("recording", "127.0.0.1", self.port.getHost().port)


@pytest_twisted.async_yield_fixture
async def engine():
    recording = RecordingEngine()
    yield recording
    await recording.port.stopListening()


def form(fields: dict[str, str], audio: bytes = AUDIO) -> bytes:
    parts = [b'--%s\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
             % BOUNDARY.encode() + audio + b"\r\n"]
    for name, value in fields.items():
        parts.append(b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
                     % (BOUNDARY.encode(), name.encode(), value.encode()))
    return b"".join(parts) + b"--%s--\r\n" % BOUNDARY.encode()


def multipart(path: str, body: bytes, **headers: str) -> bytes:
    return post(path, body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}", **headers})


async def ask(router, raw: bytes):
    status, headers, body = await threads.deferToThread(exchange, router.address, raw)
    return status, headers, json.loads(body) if body else None


@pytest.mark.parametrize("path, payload, check", [
    ("/v1/rerank", {"query": "fox", "documents": ["dog", "red fox"]}, lambda a: a["results"][0]["index"] == 1),
    ("/rerank", {"query": "fox", "documents": ["fox"]}, lambda a: a["results"][0]["relevance_score"] == 1.0),
    ("/v2/rerank", {"query": "fox", "documents": ["fox"], "top_n": 1}, lambda a: len(a["results"]) == 1),
    ("/v1/score", {"text_1": "a b", "text_2": ["a"]}, lambda a: a["data"][0]["score"] == 0.5),
    ("/score", {"text_1": "a", "text_2": "a"}, lambda a: a["data"][0]["score"] == 1.0),
    ("/tokenize", {"prompt": "one two three"}, lambda a: a["count"] == 3),
    ("/v1/tokenize", {"messages": [{"role": "user", "content": "one two"}]}, lambda a: a["count"] == 2),
    ("/detokenize", {"tokens": [1]}, lambda a: a == {"prompt": "<1>"}),
])
@pytest_twisted.ensureDeferred
async def test_each_route_reaches_the_engine_serving_the_model_it_names(sim, make_router, path, payload, check):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    status, _, answer = await ask(router, post(path, {"model": MODEL, **payload}))
    assert status == 200 and check(answer), answer
    [info] = dispatcher.requests
    assert (info.path, info.model) == (path, MODEL)
    assert router.metrics.done[-1][:3] == (MODEL, path, 200)


@pytest_twisted.ensureDeferred
async def test_tokenize_then_detokenize_through_the_router_gives_the_words_back(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    _, _, tokens = await ask(router, post("/tokenize", {"model": MODEL, "prompt": "round and round"}))
    _, _, text = await ask(router, post("/v1/detokenize", {"model": MODEL, "tokens": tokens["tokens"]}))
    assert text == {"prompt": "round and round"}


@pytest_twisted.ensureDeferred
async def test_a_route_the_engine_lacks_is_answered_with_the_engines_own_404(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    status, _, answer = await ask(router, multipart("/v1/audio/transcriptions", form({"model": MODEL})))
    direct = sim.request("POST", "/v1/audio/transcriptions")
    assert status == 404 and answer == json.loads(direct[2])


@pytest_twisted.ensureDeferred
async def test_no_response_is_stored_to_get_and_an_unknown_url_lists_the_routes(make_router):
    router = make_router(StaticDispatcher([]))
    status, _, answer = await ask(router, b"GET /v1/responses/resp_123 HTTP/1.1\r\nHost: r\r\n\r\n")
    assert status == 404 and answer["error"]["code"] == "response_not_stored"
    assert "llmgw stores no responses" in answer["error"]["message"]
    status, _, answer = await ask(router, post("/v1/moderations", {"model": MODEL}))
    assert status == 404 and answer["error"]["code"] == "unknown_url"
    for route in ("/v1/responses", "/v1/rerank", "/v1/score", "/v1/tokenize", "/v1/detokenize",
                  "/v1/audio/transcriptions"):
        assert route in answer["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_an_audio_upload_reaches_the_engine_byte_for_byte_with_its_content_type(engine, make_router):
    dispatcher = StaticDispatcher([engine.endpoint], models=("whisper-x",))
    router = make_router(dispatcher, max_body_bytes=1 << 20)
    body = form({"model": "whisper-x", "language": "en", "stream": "false"})
    status, _, answer = await ask(router, multipart("/v1/audio/transcriptions", body))
    assert (status, answer) == (200, {"text": "heard"})
    [sent] = engine.requests
    assert sent.path == "/v1/audio/transcriptions" and sent.body == body
    assert sent.headers["content-type"] == f"multipart/form-data; boundary={BOUNDARY}"
    [info] = dispatcher.requests
    assert (info.path, info.model, info.stream) == ("/v1/audio/transcriptions", "whisper-x", False)


@pytest.mark.parametrize("body, content_type, said", [
    (form({"language": "en"}), f"multipart/form-data; boundary={BOUNDARY}", "the form names no model"),
    (form({"model": "whisper-x"})[:-30], f"multipart/form-data; boundary={BOUNDARY}", "the closing boundary"),
    (form({"model": "whisper-x"}), "multipart/form-data", "names no boundary"),
    (form({"model": "a"}) .replace(b'--llmgw-test-boundary--', b'') + form({"model": "b"}),
     f"multipart/form-data; boundary={BOUNDARY}", "two 'model' fields"),
    (json.dumps({"model": "whisper-x"}).encode(), "application/json", "takes a multipart/form-data body"),
    (form({"model": "whisper-x", "stream": "maybe"}), f"multipart/form-data; boundary={BOUNDARY}",
     '"stream" must be true or false'),
])
@pytest_twisted.ensureDeferred
async def test_a_form_that_cannot_be_read_is_400_saying_what_is_wrong(engine, make_router, body, content_type, said):
    router = make_router(StaticDispatcher([engine.endpoint], models=("whisper-x",)))
    status, _, answer = await ask(router, post("/v1/audio/translations", body, {"Content-Type": content_type}))
    assert status == 400 and said in answer["error"]["message"], answer
    assert engine.requests == []


@pytest.mark.parametrize("coding, encode", [
    ("gzip", gzip.compress), ("deflate", zlib.compress), ("x-gzip", gzip.compress), ("gzip, identity", gzip.compress),
    # Members one after another, as RFC 1952 allows (pigz writes them).
    ("gzip", lambda b: b"".join(gzip.compress(b[i:i + 9]) for i in range(0, len(b), 9))),
    ("GZIP , Deflate", lambda b: zlib.compress(gzip.compress(b))),
])
@pytest_twisted.ensureDeferred
async def test_a_compressed_body_is_decompressed_before_it_is_read_and_sent(engine, make_router, coding, encode):
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher)
    body = json.dumps(chat("compressed words")).encode()
    status, _, _ = await ask(router, post("/v1/chat/completions", encode(body), {"Content-Encoding": coding}))
    assert status == 200
    [sent] = engine.requests
    assert sent.body == body and "content-encoding" not in sent.headers
    assert dispatcher.requests[0].prefix == "compressed words"


@pytest_twisted.ensureDeferred
async def test_a_gzip_body_reaches_the_sim_and_is_answered(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    raw = post("/v1/chat/completions", gzip.compress(json.dumps(chat("one two")).encode()), {"Content-Encoding": "gzip"})
    status, _, answer = await ask(router, raw)
    assert status == 200 and answer["choices"][0]["message"]["content"].startswith("one two")


# The bodies are made when the test runs, not at collection: a test's id must
# be the same in every collection (gzip's header holds the time), and the bomb
# is 150 MiB to compress.
@pytest.mark.parametrize("coding, body, status, said", [
    # A zip bomb: 150 KiB that would be 150 MiB.
    ("gzip", lambda: gzip.compress(b" " * (150 << 20), mtime=0), 413,
     "over 1048576 bytes once decompressed (router.max_body_bytes)"),
    ("br", lambda: b"\x0b\x02\x80{}\x03", 415, "Content-Encoding 'br' is not one the router decodes"),
    ("gzip", lambda: b"not gzip at all", 400, "does not decode as its Content-Encoding says"),
    ("gzip", lambda: gzip.compress(b'{"model": "x"}', mtime=0)[:-4], 400, "ends before its compressed data does"),
    # Each member copied the rest of the body: 16 MB of empty ones was minutes of the reactor.
    ("gzip", lambda: gzip.compress(b"", mtime=0) * 20_000, 400, "more than 16 members"),
    ("gzip", lambda: gzip.compress(b'{"model": "x"}', mtime=0) + b"trailing", 400, "does not decode"),
    ("deflate", lambda: zlib.compress(b'{"model": "x"}') + b"trailing", 400, "bytes follow its end"),
    ("gzip, gzip, gzip", lambda: gzip.compress(gzip.compress(gzip.compress(b"{}", mtime=0), mtime=0), mtime=0),
     400, "at most 2"),
    # Stacked, each within the limit: the limit holds at every layer.
    ("gzip, gzip", lambda: gzip.compress(gzip.compress(b" " * (2 << 20), mtime=0), mtime=0), 413, "once decompressed"),
], ids=["bomb", "br", "not-gzip", "cut-short", "many-members", "gzip-trailing", "deflate-trailing", "three-codings",
        "stacked-bomb"])
@pytest_twisted.ensureDeferred
async def test_a_body_that_does_not_decompress_within_the_limit_is_refused(engine, make_router, coding, body, status,
                                                                          said):
    router = make_router(StaticDispatcher([engine.endpoint]), max_body_bytes=1 << 20)
    got, headers, answer = await ask(router, post("/v1/chat/completions", body(), {"Content-Encoding": coding}))
    assert got == status and said in answer["error"]["message"], answer
    assert engine.requests == []
    assert headers["x-request-id"] == answer["error"]["request_id"]
