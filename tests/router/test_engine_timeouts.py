"""An engine that accepts and never answers, sends a head and stalls, or dribbles: answered, freed, counted."""

from __future__ import annotations

import json

import openai
import pytest_twisted
from twisted.internet import threads
from twisted.internet.task import Clock

from tests.support.net import connect, post, read_response, sse_events
from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import GatedEngine, StaticDispatcher, chat

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'


@pytest_twisted.async_yield_fixture
async def engine():
    gated = GatedEngine()
    yield gated
    await gated.stop()


def _openai_create(router, **kw):
    with openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk", max_retries=0) as c:
        try:
            result = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], **kw)
            return [chunk.choices[0].delta.content for chunk in result] if kw.get("stream") else result
        except openai.APIError as e:
            return e


@pytest_twisted.ensureDeferred
async def test_an_engine_that_never_answers_is_a_504_and_counts_against_it(engine, make_router):
    clock = Clock()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher, clock=clock, first_byte_timeout_s=300)
    call = threads.deferToThread(_openai_create, router)
    await engine.request()
    clock.advance(299)
    assert not call.called
    clock.advance(1)
    error = await call
    assert isinstance(error, openai.InternalServerError) and error.status_code == 504
    assert error.code == "upstream_timeout" and "300 s" in error.message
    assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed"]
    assert router.metrics.upstream_errors == [(MODEL, engine.endpoint.id, "first_byte_timeout")]
    assert router.metrics.done[-1][2] == 504


@pytest_twisted.ensureDeferred
async def test_a_head_dribbled_a_byte_at_a_time_is_timed_from_the_request(engine, make_router):
    clock = Clock()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher, clock=clock, first_byte_timeout_s=10, between_bytes_timeout_s=5)
    call = threads.deferToThread(_openai_create, router)
    connection = await engine.request()
    for byte in SSE_HEAD[:9]:
        connection.transport.write(bytes([byte]))
        clock.advance(1)
    clock.advance(1)
    error = await call
    assert isinstance(error, openai.InternalServerError) and error.status_code == 504


@pytest_twisted.ensureDeferred
async def test_a_stream_that_stalls_ends_with_an_error_event_and_the_connection_stays(engine, make_router):
    clock = Clock()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher, clock=clock, between_bytes_timeout_s=120)
    call = threads.deferToThread(_openai_create, router, stream=True)
    connection = await engine.request()
    connection.transport.write(SSE_HEAD + b"%x\r\n%b\r\n" % (len(EVENT), EVENT))
    await until(lambda: router.protocols and router.protocols[0].exchange.committed, "the head relayed", 5)
    clock.advance(120)
    error = await call
    assert isinstance(error, openai.APIError) and "stopped sending its answer for 120 s" in error.message
    assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed"]
    assert router.metrics.upstream_errors == [(MODEL, engine.endpoint.id, "stalled")]


def _stream_then_models(port: int) -> tuple[list[str], int]:
    with connect(port) as s:
        s.sendall(post("/v1/chat/completions", chat(stream=True)))
        f = s.makefile("rb")
        status, _, body = read_response(f)
        assert status == 200
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
        return sse_events(body), read_response(f)[0]


@pytest_twisted.ensureDeferred
async def test_the_final_error_event_ends_the_chunked_body_so_the_connection_is_reused(engine, make_router):
    clock = Clock()
    router = make_router(StaticDispatcher([engine.endpoint]), clock=clock, between_bytes_timeout_s=60)
    call = threads.deferToThread(_stream_then_models, router.address)
    connection = await engine.request()
    connection.transport.write(SSE_HEAD + b"%x\r\n%b\r\n" % (len(EVENT), EVENT))
    await until(lambda: router.protocols and router.protocols[0].exchange.committed, "the head relayed", 5)
    clock.advance(60)
    events, models_status = await call
    assert events[0] == EVENT.decode()[len("data: "):].rstrip("\n")
    assert json.loads(events[1])["error"]["code"] == "upstream_timeout"
    assert models_status == 200


@pytest_twisted.ensureDeferred
async def test_a_stream_dribbled_a_byte_at_a_time_stalls_and_is_cut_off(engine, make_router):
    clock = Clock()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher, clock=clock, between_bytes_timeout_s=30)

    def read_until_closed():
        with connect(router.address) as s:
            s.sendall(post("/v1/chat/completions", chat(stream=True)))
            got = []
            while piece := s.recv(65536):
                got.append(piece)
            return b"".join(got)

    call = threads.deferToThread(read_until_closed)
    connection = await engine.request()
    connection.transport.write(SSE_HEAD)
    await until(lambda: router.protocols and router.protocols[0].exchange.committed, "the head relayed", 5)
    exchange = router.protocols[0].exchange
    piece = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
    # A byte every second: never a whole chunk within 30 s.
    for i in range(30):
        received = exchange.tail_len
        connection.transport.write(piece[i : i + 1])
        await until(lambda: exchange.tail_len > received, "the router read the byte", 5)
        clock.advance(1)
    got = await call
    assert got.startswith(b"HTTP/1.1 200") and not got.endswith(b"0\r\n\r\n")
    assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed"]
