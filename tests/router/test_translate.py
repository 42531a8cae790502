"""POST /v1/responses through the router: a chat completion on the engine, a Response (or its events) for the client.

Real sim engines and the official openai client where the behaviour crosses
processes; a stand-in engine (``test_proxy_heads.StandInEngine``) where the sim
will not answer what the test needs.
"""

from __future__ import annotations

import json
import signal

import openai
import pytest_twisted
from twisted.internet import threads
from twisted.internet.task import Clock

from tests.support.net import connect, post, read_response
from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import GatedEngine, StaticDispatcher, buffered, endpoint_of, exchange, slow_reader
from .test_proxy_heads import StandInEngine, json_answer

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def client(router, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk-test", max_retries=0, **kw)


def events_of(body: bytes) -> list[tuple[str, dict]]:
    """(type, data) of each Responses event in an SSE body, checking each names its type twice alike."""
    out = []
    for block in body.decode().split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(fields["data"])
        assert fields["event"] == data["type"]
        out.append((data["type"], data))
    return out


@pytest_twisted.ensureDeferred
async def test_a_response_is_a_chat_completion_on_the_engine_and_its_tokens_are_counted(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            return c.responses.create(model=MODEL, input="the quick brown fox", instructions="be brief")

    reply = await threads.deferToThread(call)
    assert reply.id.startswith("resp_") and reply.status == "completed" and reply.model == MODEL
    # The sim says the last message's words again, and counts the instructions' too.
    assert reply.output_text.split()[:5] == ["the", "quick", "brown", "fox", "the"]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (6, 16)
    [lease] = dispatcher.leases
    assert (lease.tokens, lease.outcome) == ((6, 16), "ok")
    [(model, path, status, _, ttft, prompt, completion)] = router.metrics.done
    assert (model, path, status, ttft, prompt, completion) == (MODEL, "/v1/responses", 200, None, 6, 16)


@pytest_twisted.ensureDeferred
async def test_a_streamed_response_arrives_event_by_event_with_its_usage(start_sim, make_router):
    sim = start_sim("--ttft-ms", "50", "--tokens-per-s", "500")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            return list(c.responses.create(model=MODEL, input="one two three", stream=True))

    events = await threads.deferToThread(call)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.split() == ("one two three " * 6).split()[:16]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.usage.output_tokens == 16 and events[-1].response.output_text == text
    await until(lambda: dispatcher.inflight == 0, "the lease to be released")
    [lease] = dispatcher.leases
    assert (lease.tokens, lease.outcome) == ((3, 16), "ok")
    [(_, path, status, seconds, ttft, prompt, completion)] = router.metrics.done
    assert (path, status, prompt, completion) == ("/v1/responses", 200, 3, 16)
    assert 0.05 <= ttft < seconds


@pytest_twisted.ensureDeferred
async def test_an_engine_killed_mid_stream_ends_the_stream_with_response_failed(start_sim, make_router):
    sim = start_sim("--quiet", "--tokens-per-s", "20", "--output-tokens", "1000")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def call():
        kinds = []
        with client(router) as c:
            for event in c.responses.create(model=MODEL, input="on and on", stream=True):
                kinds.append(event.type)
                if event.type == "response.output_text.delta" and kinds.count(event.type) == 1:
                    sim.signal(signal.SIGKILL)
                if event.type == "response.failed":
                    failed = event.response
        return kinds, failed

    kinds, failed = await threads.deferToThread(call)
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds
    assert failed.status == "failed" and "closed the connection in the middle of its answer" in failed.error.message
    assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed"]
    assert router.metrics.upstream_errors == [(MODEL, endpoint_of(sim).id, "reset")]
    # The client's connection was closed after the event.
    await until(lambda: router.factory.connections == 0, "the client's connection to close")


@pytest_twisted.ensureDeferred
async def test_a_stream_the_engine_stalls_ends_with_response_failed_and_the_connection_is_kept(make_router):
    engine = GatedEngine()
    clock = Clock()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher, clock=clock, between_bytes_timeout_s=60)

    def stream_then_models():
        with connect(router.address) as s:
            s.sendall(post("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}))
            f = s.makefile("rb")
            answer = read_response(f)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
            return answer, read_response(f)[0]

    try:
        call = threads.deferToThread(stream_then_models)
        connection = await engine.request()
        connection.transport.write(SSE_HEAD + b"%x\r\n%b\r\n" % (len(CHUNK), CHUNK))
        await until(lambda: router.protocols and router.protocols[0].exchange.relayed > 0, "the first events relayed", 5)
        clock.advance(60)
        (status, headers, body), models_status = await call
    finally:
        await engine.stop()
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    events = events_of(body)
    assert [kind for kind, _ in events][-1] == "response.failed"
    assert "stopped sending its answer for 60 s" in events[-1][1]["response"]["error"]["message"]
    assert "".join(data["delta"] for kind, data in events if kind == "response.output_text.delta") == "hi"
    assert models_status == 200
    assert router.metrics.upstream_errors == [(MODEL, engine.endpoint.id, "stalled")]


@pytest_twisted.ensureDeferred
async def test_an_event_that_is_not_json_ends_the_stream_with_response_failed_and_the_engine_is_dropped(make_router):
    engine = GatedEngine()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher)

    def read_until_closed():
        with connect(router.address) as s:
            s.sendall(post("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}))
            f = s.makefile("rb")
            answer = read_response(f)
            return answer, f.read()

    try:
        call = threads.deferToThread(read_until_closed)
        connection = await engine.request()
        bad = b"data: {not json\n\n"
        connection.transport.write(SSE_HEAD + b"%x\r\n%b\r\n%x\r\n%b\r\n" % (len(CHUNK), CHUNK, len(bad), bad))
        (status, _, body), after = await call
    finally:
        await engine.stop()
    events = events_of(body)
    assert status == 200 and after == b""
    assert [kind for kind, _ in events][-1] == "response.failed"
    assert "is not JSON" in events[-1][1]["response"]["error"]["message"]
    assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed"]
    assert router.metrics.upstream_errors == [(MODEL, engine.endpoint.id, "malformed")]


@pytest_twisted.ensureDeferred
async def test_a_whole_answer_cut_off_before_the_client_had_a_byte_is_sent_to_another_engine(sim, make_router):
    engine = GatedEngine()
    dispatcher = StaticDispatcher([engine.endpoint, endpoint_of(sim)])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            return c.responses.create(model=MODEL, input="second time lucky")

    try:
        reply = threads.deferToThread(call)
        connection = await engine.request()
        connection.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 900\r\n\r\n{\"id\":")
        connection.transport.loseConnection()
        reply = await reply
    finally:
        await engine.stop()
    assert reply.output_text.split()[:3] == ["second", "time", "lucky"]
    assert [lease.outcome for lease in dispatcher.leases] == ["upstream_failed", "ok"]
    assert router.metrics.upstream_errors == [(MODEL, engine.endpoint.id, "reset")]


@pytest_twisted.ensureDeferred
async def test_an_engine_error_is_relayed_with_its_status_and_object(make_router):
    error = {"error": {"message": "temperature is out of range", "type": "invalid_request_error",
                       "param": "temperature", "code": "bad_temperature"}}
    engine = StandInEngine(json_answer(400, error, "Bad Request"))
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            try:
                c.responses.create(model=MODEL, input="hi", temperature=0.5)
            except openai.BadRequestError as e:
                return e

    try:
        e = await threads.deferToThread(call)
    finally:
        await engine.port.stopListening()
    assert e.status_code == 400 and e.code == "bad_temperature" and e.param == "temperature"
    assert e.message.endswith("- temperature is out of range")
    assert engine.heads[0].startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert [lease.outcome for lease in dispatcher.leases] == ["ok"]


@pytest_twisted.ensureDeferred
async def test_a_model_the_engine_lacks_is_its_404_relayed(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)], models=("elsewhere",)))

    def call():
        with client(router) as c:
            for stream in (False, True):
                try:
                    c.responses.create(model="elsewhere", input="hi", stream=stream)
                except openai.NotFoundError as e:
                    yield e

    errors = await threads.deferToThread(lambda: list(call()))
    assert [(e.status_code, e.code) for e in errors] == [(404, "model_not_found")] * 2


@pytest_twisted.ensureDeferred
async def test_what_the_translation_refuses_is_a_400_naming_the_field_before_any_engine(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            try:
                c.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
            except openai.BadRequestError as e:
                return e

    e = await threads.deferToThread(call)
    assert e.param == "previous_response_id" and "previous_response_id" in e.message
    assert dispatcher.requests == [] and router.metrics.done[-1][2] == 400


@pytest_twisted.ensureDeferred
async def test_an_answer_over_max_body_bytes_is_a_502_naming_the_limit(start_sim, make_router):
    sim = start_sim("--quiet", "--output-tokens", "1000")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher, max_body_bytes=2000)

    def call():
        with client(router) as c:
            try:
                c.responses.create(model=MODEL, input="many words", max_output_tokens=1000)
            except openai.APIStatusError as e:
                return e

    e = await threads.deferToThread(call)
    assert e.status_code == 502 and "router.max_body_bytes (2000 bytes)" in e.message
    assert [lease.outcome for lease in dispatcher.leases] == ["error"]
    # The same engine answers a short one whole.
    reply = await threads.deferToThread(lambda: client(router).responses.create(model=MODEL, input="few", max_output_tokens=3))
    assert reply.output_text.split() == ["few", "few", "few"]


@pytest_twisted.ensureDeferred
async def test_an_http10_client_gets_the_events_until_the_connection_closes(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    raw = post("/v1/responses", {"model": MODEL, "input": "a b", "stream": True}, version="1.0")
    status, headers, body = await threads.deferToThread(exchange, router.address, raw, then_closed=True)
    assert status == 200 and "transfer-encoding" not in headers and headers["connection"] == "close"
    assert headers["content-type"] == "text/event-stream"
    assert events_of(body)[-1][0] == "response.completed"


@pytest_twisted.ensureDeferred
async def test_a_slow_reader_pauses_the_engine_as_the_byte_relay_does(start_sim, make_router):
    sim = start_sim("--quiet", "--output-tokens", "20000")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    reader = slow_reader(router.address)
    try:
        reader.sendall(post("/v1/responses", {"model": MODEL, "input": "x", "stream": True}))
        await until(lambda: router.protocols and router.protocols[0].exchange and router.protocols[0].exchange.upstream,
                    "the request to reach the engine")
        proto = router.protocols[0]
        upstream = proto.exchange.upstream
        await until(lambda: upstream.paused, "the client's transport to pause reading from the engine")
        assert dispatcher.leases[0].outcome is None

        def read_all():
            reader.settimeout(30)
            return read_response(reader.makefile("rb"))

        status, _, body = await threads.deferToThread(read_all)
    finally:
        reader.close()
    assert status == 200 and events_of(body)[-1][1]["response"]["usage"]["output_tokens"] == 20000
    await until(lambda: dispatcher.leases[0].outcome == "ok", "the lease to be released")
    assert dispatcher.leases[0].tokens == (1, 20000) and buffered(proto.transport) == 0
