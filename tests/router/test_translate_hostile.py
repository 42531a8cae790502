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

from .routerharness import StaticDispatcher, exchange
from .test_proxy_heads import StandInEngine, json_answer
from .test_translate import events_of


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
