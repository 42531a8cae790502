"""Streams: a slow reader slows the engine instead of growing memory; a client that leaves aborts the engine's work."""

from __future__ import annotations

import signal

import pytest_twisted
from twisted.internet import protocol, reactor, threads

from llmgw.router.upstream import RELAY_BUFFER_BYTES
from tests.support.net import connect, post, read_response, sse_events
from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import StaticDispatcher, StaticEndpoint, buffered, chat, endpoint_of, exchange, slow_reader


@pytest_twisted.ensureDeferred
async def test_a_slow_reader_pauses_the_engine_and_buffering_stays_bounded(start_sim, make_router):
    # About 10 MB of stream, far more than the socket buffers on the way hold.
    sim = start_sim("--quiet", "--output-tokens", "50000")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    client = slow_reader(router.address)
    try:
        client.sendall(post("/v1/chat/completions", chat(stream=True, stream_options={"include_usage": True})))
        await until(lambda: router.protocols and router.protocols[0].exchange and router.protocols[0].exchange.upstream,
                    "the request to reach the engine")
        proto = router.protocols[0]
        upstream = proto.exchange.upstream
        await until(lambda: upstream.paused, "the client's transport to pause reading from the engine")
        held = buffered(proto.transport)
        # One transport buffer's worth plus one socket read, at most.
        assert held <= proto.transport.bufferSize + upstream.transport.bufferSize <= 2 * RELAY_BUFFER_BYTES
        # Nothing moves while the client does not read.
        await until(lambda: upstream.paused and buffered(proto.transport) == held, "the relay to stay paused")
        assert dispatcher.leases[0].outcome is None

        def read_all():
            client.settimeout(30)
            return read_response(client.makefile("rb"))

        status, headers, body = await threads.deferToThread(read_all)
    finally:
        client.close()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    events = sse_events(body)
    assert events[-1] == "[DONE]" and len(events) == 1 + 50000 + 1 + 1 + 1
    assert upstream.pauses >= 1
    await until(lambda: dispatcher.leases[0].outcome == "ok", "the lease to be released")
    assert dispatcher.leases[0].tokens == (2, 50000)
    # The connection went back to the pool, reading again.
    assert router.factory.pool.idle("127.0.0.1", sim.port) == 1 and not upstream.paused


@pytest_twisted.ensureDeferred
async def test_an_engine_dying_while_a_slow_reader_is_paused_still_ends_the_client_connection(start_sim, make_router):
    sim = start_sim("--quiet", "--output-tokens", "50000")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    client = slow_reader(router.address)
    try:
        client.sendall(post("/v1/chat/completions", chat(stream=True)))
        await until(lambda: router.protocols and router.protocols[0].exchange and router.protocols[0].exchange.upstream
                    and router.protocols[0].exchange.upstream.paused, "the relay to pause")
        sim.proc.send_signal(signal.SIGKILL)
        sim.proc.wait(timeout=10)

        def read_to_the_end():
            client.settimeout(10)
            got = []
            while chunk := client.recv(65536):
                got.append(chunk)
            return b"".join(got)

        body = await threads.deferToThread(read_to_the_end)
    finally:
        client.close()
    assert body.startswith(b"HTTP/1.1 200") and not body.endswith(b"\r\n0\r\n\r\n")
    assert dispatcher.leases[0].outcome == "upstream_failed"


@pytest_twisted.ensureDeferred
async def test_many_slow_readers_each_hold_a_bounded_amount(start_sim, make_router):
    sim = start_sim("--quiet", "--output-tokens", "20000")
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    clients = [slow_reader(router.address) for _ in range(20)]
    try:
        for c in clients:
            c.sendall(post("/v1/chat/completions", chat(stream=True)))
        await until(lambda: len(router.protocols) == 20 and all(
            p.exchange and p.exchange.upstream and p.exchange.upstream.paused for p in router.protocols),
            "every stream to be paused")
        assert sum(buffered(p.transport) for p in router.protocols) <= 20 * 2 * RELAY_BUFFER_BYTES
    finally:
        for c in clients:
            c.close()
    await until(lambda: all(p.lost for p in router.protocols), "the router to see every client go")
    assert router.metrics.gone == [MODEL] * 20


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_mid_stream_aborts_the_engine_request(start_sim, make_router):
    sim = start_sim("--tokens-per-s", "20", "--output-tokens", "1000")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def start_reading_then_leave():
        with connect(router.address) as s:
            s.sendall(post("/v1/chat/completions", chat(stream=True)))
            f = s.makefile("rb")
            assert f.readline().startswith(b"HTTP/1.1 200")
            while f.readline() != b"\r\n":
                pass
            return f.readline()  # the first chunk's size: the stream is flowing

    await threads.deferToThread(start_reading_then_leave)
    await until(lambda: sim.metrics()["llmgw_sim_aborted_total"] == 1, "the sim to count the abort", timeout=15)
    assert dispatcher.events == [("admit", f"sim:{sim.port}"), ("release", f"sim:{sim.port}", "client_gone")]
    assert router.metrics.gone == [MODEL] and router.metrics.done == []
    # The aborted connection is not reused.
    assert router.factory.pool.idle("127.0.0.1", sim.port) == 0
    sim.wait_for_line(lambda line: "aborted after" in line)


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_while_queued_gives_up_its_place(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    dispatcher.holding = True
    router = make_router(dispatcher)
    client = connect(router.address)
    client.sendall(post("/v1/chat/completions", chat()))
    await until(lambda: dispatcher.held, "the request to wait for admission")
    client.close()
    await until(lambda: dispatcher.cancelled == 1, "admission to be cancelled")
    dispatcher.let_in()
    assert dispatcher.leases == [] and router.metrics.gone == [MODEL]


@pytest_twisted.ensureDeferred
async def test_pipelined_requests_are_answered_in_order(start_sim, make_router):
    sim = start_sim("--quiet", "--ttft-ms", "30")
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    raw = b"".join([post("/v1/chat/completions", chat("one", stream=True)), post("/v1/completions", {"model": MODEL, "prompt": "two"}),
                    b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n", post("/v1/chat/completions", chat("three"))])
    first, second, third, fourth = await threads.deferToThread(exchange, router.address, raw, 4)
    assert '"content":"one"' in sse_events(first[2])[1]
    assert b'"text":"two' in second[2]
    assert b'"object": "list"' in third[2]
    assert b'"content":"three' in fourth[2]


@pytest_twisted.ensureDeferred
async def test_http10_clients_get_streams_without_chunking_then_a_close(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    raw = post("/v1/chat/completions", chat("a b", stream=True), version="1.0")
    status, headers, body = await threads.deferToThread(exchange, router.address, raw, then_closed=True)
    assert status == 200 and "transfer-encoding" not in headers and headers["connection"] == "close"
    assert sse_events(body)[-1] == "[DONE]"
    status, headers, body = await threads.deferToThread(exchange, router.address, post("/v1/completions", {
        "model": MODEL, "prompt": "x"}, version="1.0"), then_closed=True)
    assert status == 200 and int(headers["content-length"]) == len(body)


@pytest_twisted.ensureDeferred
async def test_chunked_request_bodies_and_expect_continue(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    body = b'{"model": "%s", "prompt": "chunked body"}' % MODEL.encode()
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
    status, _, reply = await threads.deferToThread(exchange, router.address, raw)
    assert status == 200 and b"chunked body" in reply

    def expect_continue():
        with connect(router.address) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
            f = s.makefile("rb")
            interim = read_response(f)
            s.sendall(body)
            return interim, read_response(f)

    interim, final = await threads.deferToThread(expect_continue)
    assert interim[0] == 100 and final[0] == 200


class _EndsLate(protocol.Protocol):
    """An engine whose stream ends with [DONE] at once and with its final empty chunk a moment later."""

    def dataReceived(self, data: bytes) -> None:
        events = [b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n',
                  b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n', b"data: [DONE]\n\n"]
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events))
        reactor.callLater(0.2, self.transport.write, b"0\r\n\r\n")


@pytest_twisted.ensureDeferred
async def test_a_client_leaving_right_after_done_is_not_an_abort(make_router):
    engine = protocol.Factory.forProtocol(_EndsLate)
    port = reactor.listenTCP(0, engine, interface="127.0.0.1")
    try:
        endpoint = StaticEndpoint("late", "127.0.0.1", port.getHost().port)
        dispatcher = StaticDispatcher([endpoint])
        router = make_router(dispatcher)

        def read_to_done_and_leave():
            with connect(router.address) as s:
                s.sendall(post("/v1/chat/completions", chat(stream=True)))
                got = b""
                while b"data: [DONE]" not in got:
                    got += s.recv(65536)
                return got

        await threads.deferToThread(read_to_done_and_leave)
        await until(lambda: dispatcher.leases[0].outcome, "the lease to be released", timeout=5)
        assert (dispatcher.leases[0].outcome, dispatcher.leases[0].tokens) == ("ok", (2, 1))
        assert router.metrics.gone == [] and router.metrics.done[0][2] == 200
        assert router.factory.pool.idle("127.0.0.1", endpoint.port) == 1
    finally:
        await port.stopListening()
