"""Every answer the router makes itself is an OpenAI error with the right status; engines' errors go through as they are."""

from __future__ import annotations

import json

import openai
import pytest
import pytest_twisted
from twisted.internet import threads

from llmgw.router import errors
from tests.support.net import post
from tests.support.sim import MODEL

from .routerharness import StaticDispatcher, chat, endpoint_of, exchange


def error_of(body: bytes) -> dict:
    payload = json.loads(body)
    assert set(payload) == {"error"}
    # The router's own errors carry the request's id too; an engine's, relayed, need not.
    assert set(payload["error"]) - {"request_id"} == {"message", "type", "param", "code"}
    assert payload["error"]["message"]
    return payload["error"]


async def ask(router, raw: bytes, responses: int = 1, then_closed: bool = False):
    return await threads.deferToThread(exchange, router.address, raw, responses, then_closed=then_closed)


@pytest_twisted.ensureDeferred
async def test_malformed_bodies_are_400_and_the_connection_stays_usable(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    bad_json, not_object, no_model, bad_stream, good = await ask(router, b"".join([
        post("/v1/chat/completions", b'{"model": '),
        post("/v1/chat/completions", b'["a list"]'),
        post("/v1/completions", {"prompt": "hi"}),
        post("/v1/chat/completions", chat(stream="yes")),
        post("/v1/chat/completions", chat()),
    ]), responses=5)
    for (status, _, body), param, words in [
        (bad_json, None, "not valid JSON"),
        (not_object, None, "JSON object"),
        (no_model, "model", "names no model"),
        (bad_stream, "stream", "stream"),
    ]:
        assert status == 400
        error = error_of(body)
        assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]
    assert good[0] == 200
    assert router.metrics.done[0][:3] == ("", "/v1/chat/completions", 400)


@pytest_twisted.ensureDeferred
async def test_a_body_over_the_limit_is_413_before_it_is_read(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]), max_body_bytes=1000)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 5000000\r\n\r\n"
    status, headers, body = await ask(router, head + b"x" * 100_000, then_closed=True)
    assert status == 413 and headers["connection"] == "close"
    error = error_of(body)
    assert error["type"] == "invalid_request_error" and "1000 bytes" in error["message"]
    # Just over the limit, sent whole.
    status, _, body = await ask(router, post("/v1/chat/completions", chat("x" * 1000)), then_closed=True)
    assert status == 413


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /v1/chat/completions HTTP/2.0\r\n\r\n", 505),
        (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"POST /v1/chat/completions HTTP/1.1\r\nBad Header\r\n\r\n", 400),
    ],
)
@pytest_twisted.ensureDeferred
async def test_unreadable_requests_are_answered_in_openai_format_then_closed(sim, make_router, raw, status):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    got, headers, body = await ask(router, raw, then_closed=True)
    assert got == status
    assert error_of(body)["type"] == "invalid_request_error"


@pytest_twisted.ensureDeferred
async def test_unknown_paths_are_404(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))
    (status, _, body), (status2, _, body2) = await ask(
        router, b"GET /v1/nothing HTTP/1.1\r\nHost: r\r\n\r\n" + b"GET /v1/chat/completions HTTP/1.1\r\nHost: r\r\n\r\n", 2)
    assert status == status2 == 404
    assert "Invalid URL (GET /v1/nothing)" in error_of(body)["message"]


@pytest.mark.parametrize(
    "error, status, code, retry_after",
    [
        (errors.Unauthorized(), 401, "invalid_api_key", None),
        (errors.Forbidden("key alice may not use sim-test"), 403, "model_not_allowed", None),
        (errors.UnknownModel("no model 'x' here"), 404, "model_not_found", None),
        (errors.RateLimited(retry_after_s=12.5), 429, "rate_limit_exceeded", "13"),
        (errors.QueueFull(retry_after_s=0.2), 429, "queue_full", "1"),
        (errors.QueueTimeout(retry_after_s=3), 429, "queue_timeout", "3"),
        (errors.NoReadyEndpoint("no replica of sim-test is ready: node05 has 8 GB of memory, needs 24"), 503,
         "no_ready_endpoint", "1"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_admission_errors_have_their_status_code_and_headers(sim, make_router, error, status, code, retry_after):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    dispatcher.refuse[MODEL] = error
    router = make_router(dispatcher)
    (got, headers, body), (after, _, _) = await ask(router, post("/v1/chat/completions", chat()) * 2, 2)
    assert got == after == status
    assert headers.get("retry-after") == retry_after
    payload = error_of(body)
    assert (payload["code"], payload["type"], payload["message"]) == (code, error.type, error.message)
    assert router.metrics.done[0][:3] == (MODEL, "/v1/chat/completions", status)


@pytest_twisted.ensureDeferred
async def test_openai_client_raises_what_each_status_means(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)], models=(MODEL, "locked", "busy"))
    dispatcher.refuse["locked"] = errors.Forbidden("key sk-test may not use locked")
    dispatcher.refuse["busy"] = errors.QueueFull(retry_after_s=2)
    router = make_router(dispatcher)

    def calls():
        raised = {}
        with openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk-test", max_retries=0) as c:
            for model in ("locked", "busy", "nope"):
                try:
                    c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
                except openai.APIStatusError as e:
                    raised[model] = (type(e), e.code, e.response.headers.get("retry-after"))
        return raised

    raised = await threads.deferToThread(calls)
    assert raised == {
        "locked": (openai.PermissionDeniedError, "model_not_allowed", None),
        "busy": (openai.RateLimitError, "queue_full", "2"),
        "nope": (openai.NotFoundError, "model_not_found", None),
    }


@pytest_twisted.ensureDeferred
async def test_an_unexpected_dispatcher_failure_is_a_500_not_a_hang(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    dispatcher.refuse[MODEL] = RuntimeError("bug")
    router = make_router(dispatcher)
    status, _, body = await ask(router, post("/v1/chat/completions", chat()))
    assert status == 500 and error_of(body)["type"] == "server_error"


@pytest_twisted.ensureDeferred
async def test_engine_errors_are_relayed_as_they_are(start_sim, make_router):
    failing = start_sim("--fail-rate", "1")
    dispatcher = StaticDispatcher([endpoint_of(failing)], models=(MODEL, "elsewhere"))
    router = make_router(dispatcher)
    (status, _, body), (status2, _, body2) = await ask(
        router, post("/v1/chat/completions", chat()) + post("/v1/chat/completions", {**chat(), "model": "elsewhere"}), 2)
    direct = failing.request("POST", "/v1/chat/completions", json.dumps({**chat(), "model": "elsewhere"}).encode())
    assert status == 500 and error_of(body)["type"] == "server_error"
    # The engine's 404 for a model it does not serve, byte for byte.
    assert (status2, body2) == (404, direct[2])
    assert [lease.outcome for lease in dispatcher.leases] == ["error", "ok"]
    assert [e for e in dispatcher.events if e[0] == "retry"] == []
