"""Engine connections: reused, aged out, and retried elsewhere only while the client has seen nothing."""

from __future__ import annotations

import json
import signal

import openai
import psutil
import pytest_twisted
from twisted.internet import protocol, reactor, threads

from llmgw.config.routing import Continuation
from tests.support.net import connect, post
from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import StaticDispatcher, StaticEndpoint, chat, dead_endpoint, endpoint_of, exchange


def established_to(sim) -> int:
    """Connections the sim process holds open (what it accepted and has not closed)."""
    return sum(1 for c in psutil.Process(sim.proc.pid).net_connections("tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == sim.port)


def openai_calls(router, n: int, **kw):
    with openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk", max_retries=0) as c:
        return [c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"n{i}"}], **kw)
                for i in range(n)]


@pytest_twisted.ensureDeferred
async def test_one_engine_connection_carries_request_after_request(start_sim, make_router):
    sim = start_sim("--quiet")
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    # Three client connections one after another, twenty requests each.
    for _ in range(3):
        await threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat()) * 20, 20)
    assert router.factory.pool.opened == 1
    assert router.factory.pool.idle("127.0.0.1", sim.port) == 1
    assert established_to(sim) == 1


@pytest_twisted.ensureDeferred
async def test_concurrent_requests_open_a_connection_each_then_reuse_them(start_sim, make_router):
    sim = start_sim("--quiet", "--ttft-ms", "100")
    router = make_router(StaticDispatcher([endpoint_of(sim)]), max_idle_per_endpoint=4)
    calls = [threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat())) for _ in range(6)]
    for d in calls:
        assert (await d)[0] == 200
    pool = router.factory.pool
    assert pool.opened == 6
    # At most four stay: the others were closed when they came back.
    assert pool.idle("127.0.0.1", sim.port) == 4
    await until(lambda: established_to(sim) == 4, "the sim to see two connections closed")
    await threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat()) * 3, 3)
    assert pool.opened == 6


@pytest_twisted.ensureDeferred
async def test_idle_engine_connections_are_closed_after_the_idle_timeout(start_sim, make_router):
    sim = start_sim("--quiet")
    router = make_router(StaticDispatcher([endpoint_of(sim)]), idle_timeout_s=0.2)
    await threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat()))
    assert established_to(sim) == 1
    await until(lambda: router.factory.pool.idle("127.0.0.1", sim.port) == 0, "the pool to let the connection go")
    await until(lambda: established_to(sim) == 0, "the sim to see the connection closed")


@pytest_twisted.ensureDeferred
async def test_a_dead_endpoint_is_retried_on_the_live_one(sim, make_router):
    dead = dead_endpoint()
    dispatcher = StaticDispatcher([dead, endpoint_of(sim, "live")])
    router = make_router(dispatcher)
    replies = await threads.deferToThread(openai_calls, router, 6)
    assert all(r.choices[0].message.content for r in replies)
    # Every other request was placed on the dead one first and moved.
    assert dispatcher.events[:4] == [
        ("admit", "dead"), ("release", "dead", "upstream_failed"), ("retry", "dead", "live"), ("admit", "live")]
    assert [e for e in dispatcher.events if e[0] == "release"].count(("release", "dead", "upstream_failed")) == 3
    assert [e for e in dispatcher.events if e[0] == "release"].count(("release", "live", "ok")) == 6
    assert router.metrics.retries == [MODEL] * 3
    assert router.metrics.upstream_errors == [(MODEL, "dead", "refused")] * 3


@pytest_twisted.ensureDeferred
async def test_when_no_engine_answers_the_client_gets_502(make_router):
    dispatcher = StaticDispatcher([dead_endpoint("d1"), dead_endpoint("d2")])
    router = make_router(dispatcher)
    status, _, body = await threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat()))
    error = json.loads(body)["error"]
    assert status == 502 and error["code"] == "upstream_failed"
    assert "d2" in error["message"] and "refused" in error["message"]
    assert [e[0] for e in dispatcher.events] == ["admit", "release", "retry", "admit", "release", "retry"]


@pytest_twisted.ensureDeferred
async def test_an_engine_answering_503_is_retried_elsewhere_or_relayed(start_sim, make_router):
    loading = start_sim("--startup-delay-ms", "600000")
    ready = start_sim()
    dispatcher = StaticDispatcher([endpoint_of(loading, "loading"), endpoint_of(ready, "ready")])
    router = make_router(dispatcher)
    status, _, body = await threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat()))
    assert status == 200
    assert dispatcher.events[:3] == [("admit", "loading"), ("release", "loading", "upstream_failed"), ("retry", "loading", "ready")]
    assert router.metrics.upstream_errors == [(MODEL, "loading", "unavailable")]
    # With nowhere else to go, the engine's own 503 is the answer, Retry-After and all.
    alone = make_router(StaticDispatcher([endpoint_of(loading, "loading")]))
    status, headers, body = await threads.deferToThread(exchange, alone.address, post("/v1/chat/completions", chat()))
    assert status == 503 and headers["retry-after"] == "1"
    assert json.loads(body)["error"]["code"] == "model_loading"


@pytest_twisted.ensureDeferred
async def test_with_continuation_off_an_engine_dying_mid_stream_cuts_the_client_off_without_retry(start_sim, make_router):
    dying = start_sim("--tokens-per-s", "20", "--output-tokens", "1000")
    other = start_sim()
    dispatcher = StaticDispatcher([endpoint_of(dying, "dying"), endpoint_of(other, "other")])
    router = make_router(dispatcher)
    # On, the stream goes on on the other engine: tests/router/test_continuing.py.
    router.factory.continuation = Continuation(max_attempts=0)

    started = []

    def stream():
        with connect(router.address) as s:
            s.sendall(post("/v1/chat/completions", chat(stream=True)))
            f = s.makefile("rb")
            assert f.readline().startswith(b"HTTP/1.1 200")
            while f.readline() != b"\r\n":
                pass
            started.append(f.readline())  # the first chunk's size line
            return f.read()  # until the router closes

    reading = threads.deferToThread(stream)
    await until(lambda: started, "the first chunk of the stream to reach the client")
    dying.proc.send_signal(signal.SIGKILL)
    rest = await reading
    assert not rest.endswith(b"0\r\n\r\n"), "the stream must not look complete"
    assert dispatcher.events == [("admit", "dying"), ("release", "dying", "upstream_failed")]
    assert router.metrics.upstream_errors == [(MODEL, "dying", "reset")]


class _ClosesReusedConnections(protocol.Protocol):
    """An engine that answers the first request on a connection and closes it, unanswered, on the second."""

    def dataReceived(self, data: bytes) -> None:
        self.factory.requests += 1
        if getattr(self, "answered", False):
            self.transport.loseConnection()
            return
        self.answered = True
        body = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}'
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))


@pytest_twisted.ensureDeferred
async def test_a_pooled_connection_closed_by_the_engine_is_replaced_not_counted_as_a_failure(make_router):
    engine = protocol.Factory.forProtocol(_ClosesReusedConnections)
    engine.requests = 0
    port = reactor.listenTCP(0, engine, interface="127.0.0.1")
    try:
        dispatcher = StaticDispatcher([StaticEndpoint("flaky", "127.0.0.1", port.getHost().port)])
        router = make_router(dispatcher)
        raw = post("/v1/chat/completions", chat())
        for _ in range(3):
            status, _, body = await threads.deferToThread(exchange, router.address, raw)
            assert status == 200
        assert [lease.outcome for lease in dispatcher.leases] == ["ok"] * 3
        assert [lease.tokens for lease in dispatcher.leases] == [(1, 2)] * 3
        assert router.factory.pool.opened == 3 and engine.requests == 5
    finally:
        await port.stopListening()


class _Scripted(protocol.Protocol):
    """An engine that answers every request with the factory's ``reply`` bytes, then closes if ``close``."""

    def dataReceived(self, data: bytes) -> None:
        self.factory.requests += 1
        self.transport.write(self.factory.reply)
        if self.factory.close:
            self.transport.loseConnection()


def scripted_engine(reply: bytes, close: bool = False):
    engine = protocol.Factory.forProtocol(_Scripted)
    engine.requests, engine.reply, engine.close = 0, reply, close
    port = reactor.listenTCP(0, engine, interface="127.0.0.1")
    return engine, port, StaticEndpoint(f"scripted:{port.getHost().port}", "127.0.0.1", port.getHost().port)


@pytest_twisted.ensureDeferred
async def test_an_engine_answering_garbage_is_retried_then_502(sim, make_router):
    engine, port, garbage = scripted_engine(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    try:
        dispatcher = StaticDispatcher([garbage, endpoint_of(sim, "live")])
        router = make_router(dispatcher)
        status, _, _ = await threads.deferToThread(exchange, router.address, post("/v1/chat/completions", chat()))
        assert status == 200
        assert router.metrics.upstream_errors == [(MODEL, garbage.id, "malformed")]
        alone = make_router(StaticDispatcher([garbage]))
        status, _, body = await threads.deferToThread(exchange, alone.address, post("/v1/chat/completions", chat()))
        assert status == 502 and "not HTTP/1.1" in json.loads(body)["error"]["message"]
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_relayed_503_cut_short_closes_the_client_connection(make_router):
    engine, port, endpoint = scripted_engine(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\n{\"error\": ", close=True)
    try:
        dispatcher = StaticDispatcher([endpoint])
        router = make_router(dispatcher)

        def read_until_closed():
            with connect(router.address) as s:
                s.sendall(post("/v1/chat/completions", chat()))
                got = []
                while chunk := s.recv(65536):
                    got.append(chunk)
                return b"".join(got)

        got = await threads.deferToThread(read_until_closed)
        assert got.startswith(b"HTTP/1.1 503") and got.endswith(b'{"error": ')
        assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed"]
        assert router.metrics.upstream_errors == [(MODEL, endpoint.id, "unavailable"), (MODEL, endpoint.id, "reset")]
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_engines_software_and_version_do_not_reach_the_client(make_router):
    # vLLM answers through uvicorn, which names itself; llmgw's own listeners name
    # no software (docs/security.rst), and neither does what it relays.
    body = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}'
    for head in (b"HTTP/1.1 200 OK\r\nServer: uvicorn\r\nX-Powered-By: Express 4.1\r\nContent-Length: %d\r\n",
                 b"HTTP/1.1 200 OK\r\nserver: llama.cpp b6000\r\nTransfer-Encoding: chunked\r\n"):
        chunked = b"chunked" in head
        reply = head + b"x-trace: r1\r\n\r\n"
        reply = (reply % len(body) + body) if not chunked else reply + b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
        engine, port, scripted = scripted_engine(reply)
        try:
            router = make_router(StaticDispatcher([scripted]))
            status, headers, got = await threads.deferToThread(exchange, router.address,
                                                               post("/v1/chat/completions", chat()))
            assert status == 200 and json.loads(got) == json.loads(body)
            assert "server" not in headers and "x-powered-by" not in headers
            assert headers["x-trace"] == "r1"  # what the engine says of the answer still goes
        finally:
            await port.stopListening()
