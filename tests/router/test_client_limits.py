"""Clients are on a clock and a budget: idle, slow heads and bodies, too many connections, readers that stop."""

from __future__ import annotations

import json
import socket

import pytest_twisted
from twisted.internet import threads
from twisted.internet.task import Clock

from twisted.internet.testing import StringTransport

from llmgw.config.routing import ClientLimits
from llmgw.router.server import PIPELINE_LIMIT, RouterFactory
from tests.support.net import connect, post, read_response
from tests.support.wait import until

from .routerharness import GatedEngine, StaticDispatcher, buffered, chat, endpoint_of, slow_reader

MODELS = b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"


def _read_to_eof(s: socket.socket) -> bytes:
    got = []
    while piece := s.recv(65536):
        got.append(piece)
    return b"".join(got)


def _error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


@pytest_twisted.ensureDeferred
async def test_an_idle_kept_alive_connection_is_closed_after_idle_timeout(sim, make_router):
    clock = Clock()
    router = make_router(StaticDispatcher([endpoint_of(sim)]), clock=clock, clients=ClientLimits(idle_timeout_s=60))
    s = connect(router.address)
    f = s.makefile("rb")
    try:
        s.sendall(MODELS)
        assert (await threads.deferToThread(read_response, f))[0] == 200
        clock.advance(50)
        # A request starts the idle time afresh.
        s.sendall(MODELS)
        assert (await threads.deferToThread(read_response, f))[0] == 200
        clock.advance(59)
        assert not router.protocols[0].transport.disconnecting
        clock.advance(1)
        assert await threads.deferToThread(_read_to_eof, s) == b""
        assert router.metrics.client_timeouts == ["idle"]
    finally:
        s.close()


async def _answered_408(router, clock, steps) -> dict:
    """Send each (bytes, until-what-the-router-read, seconds to advance) step; the 408's error after the last."""
    s = connect(router.address)
    try:
        for raw, read, seconds in steps:
            s.sendall(raw)
            await until(lambda: router.protocols and read(router.protocols[0].parser), "the router read it", 5)
            clock.advance(seconds)
        status, error = _error(await threads.deferToThread(_read_to_eof, s))
        assert status == 408 and error["code"] == "request_timeout"
        return error
    finally:
        s.close()


@pytest_twisted.ensureDeferred
async def test_a_slowloris_head_is_answered_408_at_header_timeout_from_its_first_byte(sim, make_router):
    clock = Clock()
    router = make_router(StaticDispatcher([endpoint_of(sim)]), clock=clock, clients=ClientLimits(header_timeout_s=10))
    error = await _answered_408(router, clock, [
        (b"GET /v1/models HTTP/1.1\r\n", lambda parser: parser.buffered, 6),
        # More of the head does not buy more time.
        (b"Host: r\r\n", lambda parser: parser.buffered > 25, 4),
    ])
    assert "10 s" in error["message"] and router.metrics.client_timeouts == ["head"]


@pytest_twisted.ensureDeferred
async def test_the_408s_log_line_names_the_request_id_its_answer_carries(sim, make_router):
    from twisted.logger import formatEvent, globalLogPublisher

    clock = Clock()
    router = make_router(StaticDispatcher([endpoint_of(sim)]), clock=clock, clients=ClientLimits(header_timeout_s=10))
    lines: list[str] = []

    def observe(event):
        if event.get("log_namespace") == "llmgw.router.server":
            lines.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        error = await _answered_408(router, clock, [(b"GET /v1/models HTTP/1.1\r\n", lambda parser: parser.buffered, 10)])
    finally:
        globalLogPublisher.removeObserver(observe)
    [line] = [line for line in lines if "answered 408" in line]
    assert "(request %s)" % error["request_id"] in line


@pytest_twisted.ensureDeferred
async def test_a_body_that_does_not_arrive_is_answered_408_at_body_timeout(sim, make_router):
    clock = Clock()
    router = make_router(StaticDispatcher([endpoint_of(sim)]), clock=clock, clients=ClientLimits(body_timeout_s=60))
    error = await _answered_408(router, clock, [
        (post("/v1/chat/completions", chat())[:-5], lambda parser: parser.phase == "body", 60),
    ])
    assert "body" in error["message"] and router.metrics.client_timeouts == ["body"]


@pytest_twisted.ensureDeferred
async def test_connections_over_max_connections_are_answered_503_and_closed(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]), max_connections=2)
    first, second = connect(router.address), connect(router.address)
    try:
        await until(lambda: router.factory.connections == 2, "two connections open", 5)
        with connect(router.address) as third:
            raw = await threads.deferToThread(_read_to_eof, third)
        status, error = _error(raw)
        assert status == 503 and error["code"] == "too_many_connections"
        assert b"\r\nX-Request-Id: %s\r\n" % error["request_id"].encode() in raw
        assert router.metrics.refused == 1
        first.close()
        await until(lambda: router.factory.connections == 1, "one connection closed", 5)
        with connect(router.address) as fourth:
            fourth.sendall(MODELS)
            assert (await threads.deferToThread(read_response, fourth.makefile("rb")))[0] == 200
    finally:
        first.close()
        second.close()


_BIG_EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 4000 + b'"}}]}\n\n'


async def _stream_to_a_slow_reader(engine, router, events: int, end: bytes = b""):
    """A slow reader's streaming request, and the engine's answer of ``events`` 4 KB events sent at once."""
    s = slow_reader(router.address)
    s.settimeout(10)
    s.sendall(post("/v1/chat/completions", chat(stream=True)))
    connection = await engine.request()
    connection.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                               + b"%x\r\n%b\r\n" % (len(_BIG_EVENT), _BIG_EVENT) * events + end)
    return s


@pytest_twisted.ensureDeferred
async def test_a_client_that_stops_reading_a_stream_is_cut_off_and_its_slot_freed(make_router):
    engine = GatedEngine()
    try:
        clock = Clock()
        dispatcher = StaticDispatcher([engine.endpoint])
        router = make_router(dispatcher, clock=clock, clients=ClientLimits(write_stall_timeout_s=30))
        s = await _stream_to_a_slow_reader(engine, router, 2000)
        await until(lambda: router.protocols[0].exchange.upstream.paused, "the relay paused by the client", 10)
        clock.advance(29)
        assert dispatcher.leases[0].outcome is None
        clock.advance(1)
        await until(lambda: dispatcher.leases[0].outcome, "the lease released", 5)
        assert dispatcher.leases[0].outcome == "client_gone"
        assert router.metrics.client_timeouts == ["write_stall"]
        s.close()
    finally:
        await engine.stop()


@pytest_twisted.ensureDeferred
async def test_pipelined_requests_are_not_answered_or_read_without_limit_while_answers_go_unread(sim, make_router):
    clock = Clock()
    router = make_router(StaticDispatcher([endpoint_of(sim)]), clock=clock,
                         clients=ClientLimits(write_stall_timeout_s=30))
    s = slow_reader(router.address)

    def flood():
        try:
            s.sendall(MODELS * 200_000)  # 7 MB of requests, about 40 MB of answers
        except OSError:
            return "cut off"
        return "all sent"

    sending = threads.deferToThread(flood)
    try:
        await until(lambda: router.protocols and router.protocols[0]._reading_paused, "reading paused", 10)
        protocol = router.protocols[0]
        transport = protocol.transport
        assert buffered(transport) < 256 * 1024
        assert protocol.parser.buffered < PIPELINE_LIMIT + 256 * 1024
        clock.advance(30)
        assert await sending == "cut off"
        assert router.metrics.client_timeouts == ["write_stall"]
    finally:
        s.close()


@pytest_twisted.ensureDeferred
async def test_a_slow_reader_that_reads_it_all_keeps_its_connection_past_the_write_stall_limit(make_router):
    engine = GatedEngine()
    try:
        clock = Clock()
        dispatcher = StaticDispatcher([engine.endpoint])
        router = make_router(dispatcher, clock=clock, clients=ClientLimits(write_stall_timeout_s=30))
        s = await _stream_to_a_slow_reader(engine, router, 500, b"0\r\n\r\n")
        f = s.makefile("rb")
        status, _, body = await threads.deferToThread(read_response, f)
        assert status == 200 and len(body) > 500 * 4000
        await until(lambda: dispatcher.leases[0].outcome, "the lease released", 5)
        clock.advance(30)
        s.sendall(MODELS)
        assert (await threads.deferToThread(read_response, f))[0] == 200
        assert router.metrics.client_timeouts == []
        s.close()
    finally:
        await engine.stop()


def test_a_relay_that_ends_paused_hands_the_pause_and_its_end_to_the_connection():
    # A relay whose last write filled the client's buffer: the transport still
    # counts its producer paused and resumes whichever is registered when it drains.
    clock = Clock()
    factory = RouterFactory(StaticDispatcher([]), clock, max_body_bytes=1000,
                            clients=ClientLimits(write_stall_timeout_s=30))
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    transport.setTcpNoDelay = lambda enabled: None
    protocol.makeConnection(transport)
    relay = object()
    protocol.lend_transport(relay)
    protocol.writes_paused()  # the transport pausing the relay
    protocol.take_back_transport(relayed=True)
    assert transport.producer is protocol
    protocol.dataReceived(MODELS)
    assert transport.value() == b"", "answered while the client's buffer is full"
    protocol.resumeProducing()  # the buffer drained
    assert transport.value().startswith(b"HTTP/1.1 200 ")
    clock.advance(30)
    assert not transport.disconnecting
