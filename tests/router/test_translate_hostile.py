"""POST /v1/responses against a hostile client and a hostile engine: every buffer bounded, every figure checked.

A stand-in engine answers the translated chat completion with what a broken
or malicious engine could send; the client must get a well-formed answer (a
Response, events ending in response.failed, or a 502), never a dead connection.
"""

from __future__ import annotations

import json
import time

import pytest_twisted
from twisted.internet import threads

from tests.support.net import post
from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import GatedEngine, StaticDispatcher, exchange
from .test_proxy_heads import StandInEngine, json_answer
from .test_translate import SSE_HEAD, events_of


def sse_answer(events: list[bytes]) -> bytes:
    """A chunked 200 SSE answer of ``events`` (each the bytes of one chunk)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events if e) + b"0\r\n\r\n"


def chunk_event(**delta) -> bytes:
    return b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


async def ask(make_router, answer: bytes, body: dict | bytes, **router_kw):
    engine = StandInEngine(answer)
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher, **router_kw)
    if isinstance(body, dict):
        body = {"model": MODEL, "input": "hi", **body}
    try:
        return await threads.deferToThread(exchange, router.address, post("/v1/responses", body)), engine, dispatcher
    finally:
        await engine.port.stopListening()


def completion(**over) -> dict:
    chat = {"id": "c1", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    chat.update(over)
    return chat


@pytest_twisted.ensureDeferred
async def test_a_whole_answer_nested_past_any_parser_is_a_502(make_router):
    deep = b"[" * 100_000 + b"]" * 100_000
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(deep), deep)
    (status, _, body), engine, dispatcher = await ask(make_router, answer, {})
    message = json.loads(body)["error"]["message"]
    assert status == 502 and "nested deeper than" in message
    assert [lease.outcome for lease in dispatcher.leases] == ["error"] and len(engine.heads) == 1


@pytest_twisted.ensureDeferred
async def test_a_request_nested_deeper_than_any_schema_is_a_400_before_any_engine(make_router):
    # 932 parses at the edge and then fails to encode deeper down the stack, leaving the client without an answer.
    for depth in (100, 932):
        nested = '{"a":' * depth + "1" + "}" * depth
        raw = ('{"model":"%s","input":"hi","stream":true,"tools":[{"type":"function","name":"f","parameters":%s}]}'
               % (MODEL, nested)).encode()
        (status, _, body), engine, _ = await ask(make_router, sse_answer([chunk_event(content='x'), b'data: [DONE]\n\n']), raw)
        assert (depth, status) == (depth, 400)
        error = json.loads(body)["error"]
        assert "nested" in error["message"] and error["param"] == "tools"
        assert engine.heads == []


@pytest_twisted.ensureDeferred
async def test_an_event_of_empty_data_lines_is_bounded_like_any_other(make_router):
    from llmgw.router.translate import MAX_EVENT_BYTES
    flood = b"data:\n" * (MAX_EVENT_BYTES // 6 + 10)
    pieces = [chunk_event(content="hi")] + [flood[i:i + 65536] for i in range(0, len(flood), 65536)] + [b"\n"]
    (status, _, body), _, _ = await ask(make_router, sse_answer(pieces), {"stream": True})
    events = events_of(body)
    assert status == 200 and events[-1][0] == "response.failed"
    assert "over %d bytes" % MAX_EVENT_BYTES in events[-1][1]["response"]["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_an_event_in_one_byte_chunks_is_read_in_linear_time(make_router):
    event = chunk_event(content="x" * 300_000)
    started = time.monotonic()
    (status, _, body), _, _ = await ask(make_router, sse_answer([event[i:i + 1] for i in range(len(event))]
                                                               + [b"data: [DONE]\n\n"]), {"stream": True})
    events = events_of(body)
    assert status == 200 and events[-1][0] == "response.completed"
    assert "".join(data["delta"] for kind, data in events if kind == "response.output_text.delta") == "x" * 300_000
    # Joined once a piece, the line cost minutes.
    assert time.monotonic() - started < 8


@pytest_twisted.ensureDeferred
async def test_a_whole_answer_of_thousands_of_tool_calls_is_a_502_saying_so(make_router):
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(5000)]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    answer = json_answer(200, completion(choices=[{"index": 0, "message": message, "finish_reason": "tool_calls"}]))
    (status, _, body), _, dispatcher = await ask(make_router, answer, {})
    assert status == 502 and "5000 tool calls, more than" in json.loads(body)["error"]["message"]
    assert [lease.outcome for lease in dispatcher.leases] == ["error"]


@pytest_twisted.ensureDeferred
async def test_what_an_engine_streams_after_done_is_not_relayed(make_router):
    after = [chunk_event(content="late"), b"data: {not json\n\n", b"data: " + b"x" * 100_000 + b"\n\n"]
    (status, _, body), _, dispatcher = await ask(
        make_router, sse_answer([chunk_event(content="hi"), b"data: [DONE]\n\n"] + after), {"stream": True})
    events = events_of(body)
    assert status == 200 and events[-1][0] == "response.completed"
    assert [data["delta"] for kind, data in events if kind == "response.output_text.delta"] == ["hi"]
    # The client's answer ended at [DONE]; the engine's body is read to its end before the lease goes back.
    await until(lambda: dispatcher.inflight == 0, "the lease to be released")
    assert [lease.outcome for lease in dispatcher.leases] == ["ok"]


@pytest_twisted.ensureDeferred
async def test_a_stream_of_thousands_of_tool_calls_or_huge_arguments_ends_in_response_failed(make_router):
    many = [chunk_event(tool_calls=[{"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "{}"}}])
            for i in range(3000)]
    huge = [chunk_event(tool_calls=[{"index": 0, "id": "c", "function": {"name": "f", "arguments": "a" * 900_000}}])
            for _ in range(6)]
    odd = [chunk_event(content="x"), b'data: {"choices":[{"index":1000000000,"delta":{"content":"y"}}],'
           b'"usage":{"prompt_tokens":-3,"completion_tokens":99999999999999}}\n\n']
    for pieces, failed in ((many, True), (huge, True), (odd, False)):
        (status, _, body), _, _ = await ask(make_router, sse_answer(pieces + [b"data: [DONE]\n\n"]), {"stream": True})
        events = events_of(body)
        assert status == 200 and events[-1][0] == ("response.failed" if failed else "response.completed")
        if failed:
            assert "longer than llmgw's Responses translation holds" in events[-1][1]["response"]["error"]["message"]
        else:
            assert events[-1][1]["response"]["usage"] is None


@pytest_twisted.ensureDeferred
async def test_an_engine_that_goes_on_after_done_is_dropped_and_the_answer_counted_done(make_router):
    engine = GatedEngine()
    dispatcher = StaticDispatcher([engine.endpoint])
    router = make_router(dispatcher)
    try:
        call = threads.deferToThread(exchange, router.address, post("/v1/responses", {"model": MODEL, "input": "hi",
                                                                                     "stream": True}))
        connection = await engine.request()
        done = chunk_event(content="hi") + b"data: [DONE]\n\n"
        connection.transport.write(SSE_HEAD + b"%x\r\n%b\r\n" % (len(done), done))
        status, _, body = await call
        assert status == 200 and events_of(body)[-1][0] == "response.completed"
        garbage = b": still here\n" * 10_000
        for _ in range(10):
            connection.transport.write(b"%x\r\n%b\r\n" % (len(garbage), garbage))
        await until(lambda: dispatcher.inflight == 0, "the lease to be released")
    finally:
        await engine.stop()
    assert [lease.outcome for lease in dispatcher.leases] == ["ok"]
