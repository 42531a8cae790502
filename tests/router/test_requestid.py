"""Every answer carries the request's id: the client's X-Request-Id when it is sane, else one the router made."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import threads

from llmgw.router import errors
from llmgw.router.requestid import request_id
from tests.support.net import post
from tests.support.sim import MODEL

from .routerharness import StaticDispatcher, chat, endpoint_of, exchange

HEX32 = frozenset("0123456789abcdef")


def made(rid: str) -> bool:
    return len(rid) == 32 and set(rid) <= HEX32


@pytest.mark.parametrize("given, kept", [
    ("req-7f3a_b.c~d", True),
    ("a" * 128, True),
    ("a" * 129, False),
    ("", False),
    ("two words", False),
    ('quote"d', False),
    ("new\r\nline", False),
    ("ünïcode", False),
    (None, False),
])
def test_the_clients_id_is_kept_only_when_it_is_a_token_of_at_most_128_characters(given, kept):
    rid = request_id(given)
    assert rid == given if kept else made(rid)


def test_two_made_ids_differ():
    assert request_id(None) != request_id(None)


async def ask(router, raw: bytes, responses: int = 1):
    return await threads.deferToThread(exchange, router.address, raw, responses)


@pytest_twisted.ensureDeferred
async def test_the_routers_own_answers_carry_the_clients_id_in_the_header_and_the_error_body(make_router):
    dispatcher = StaticDispatcher([])
    dispatcher.refuse[MODEL] = errors.QueueFull("busy", retry_after_s=2)
    router = make_router(dispatcher)
    raw = (post("/v1/chat/completions", chat(), {"X-Request-Id": "client-42"})
           + b"GET /v1/models HTTP/1.1\r\nHost: r\r\nX-Request-Id: list-1\r\n\r\n"
           + b"GET /nowhere HTTP/1.1\r\nHost: r\r\nX-Request-Id: bad id with spaces\r\n\r\n")
    (s1, h1, b1), (s2, h2, _), (s3, h3, b3) = await ask(router, raw, 3)
    assert (s1, h1["x-request-id"], json.loads(b1)["error"]["request_id"]) == (429, "client-42", "client-42")
    assert h1["retry-after"] == "2"
    assert (s2, h2["x-request-id"]) == (200, "list-1")
    assert s3 == 404 and made(h3["x-request-id"]) and json.loads(b3)["error"]["request_id"] == h3["x-request-id"]


@pytest_twisted.ensureDeferred
async def test_a_request_that_cannot_be_read_still_gets_an_id(make_router):
    router = make_router(StaticDispatcher([]))
    status, headers, body = await ask(router, b"GARBAGE\r\n\r\n")
    assert status == 400 and made(headers["x-request-id"])
    assert json.loads(body)["error"]["request_id"] == headers["x-request-id"]


@pytest_twisted.ensureDeferred
async def test_the_dispatcher_and_the_relayed_answer_see_the_same_id(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    status, headers, _ = await ask(router, post("/v1/chat/completions", chat(), {"X-Request-Id": "trace-1"}))
    assert status == 200 and headers["x-request-id"] == "trace-1"
    status, headers, _ = await ask(router, post("/v1/chat/completions", chat()))
    assert status == 200 and made(headers["x-request-id"])
    assert [r.request_id for r in dispatcher.requests] == ["trace-1", headers["x-request-id"]]
