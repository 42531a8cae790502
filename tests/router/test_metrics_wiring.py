"""What the request path tells its metrics: in flight, bytes, body sizes and refusals, through real sockets."""

from __future__ import annotations

import http.client
import json

import openai
import pytest
import pytest_twisted
from twisted.internet import threads

from llmgw.router import errors
from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import StaticDispatcher, endpoint_of


def post(router, body: bytes, path: str = "/v1/chat/completions") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", router.address, timeout=10)
    try:
        connection.request("POST", path, body, {"content-type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_relayed_request_is_in_flight_until_answered_and_its_bytes_are_counted(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    dispatcher.holding = True
    router = make_router(dispatcher)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "the quick brown fox"}]}).encode()
    answered = threads.deferToThread(post, router, body)
    await until(lambda: dispatcher.held, "the request held at admission")
    # Queued is in flight: the client is waiting for it.
    assert router.metrics.in_flight == {MODEL: 1}
    dispatcher.let_in()
    assert await answered == 200
    await until(lambda: router.metrics.relayed, "the bytes counted")
    assert router.metrics.in_flight == {MODEL: 0}
    assert router.metrics.bodies == [("/v1/chat/completions", len(body))]
    sent = dict((direction, n) for _, direction, n in router.metrics.relayed)
    assert sent["request"] == len(body)
    # The engine's JSON body, without its head.
    assert 100 < sent["response"] < 2000


@pytest_twisted.ensureDeferred
async def test_a_client_that_leaves_a_stream_leaves_the_in_flight_count(start_sim, make_router):
    sim = start_sim("--ttft-ms", "0", "--tokens-per-s", "20", "--output-tokens", "200")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def read_two_and_leave():
        with openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk", max_retries=0) as c:
            stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True)
            for i, _ in enumerate(stream):
                if i == 2:
                    break
            stream.close()

    await threads.deferToThread(read_two_and_leave)
    await until(lambda: router.metrics.gone, "the client counted gone")
    assert router.metrics.in_flight == {MODEL: 0}
    assert any(direction == "response" and n > 0 for _, direction, n in router.metrics.relayed)


@pytest.mark.parametrize(("refusal", "reason"), [
    (errors.QueueFull("full"), "queue_full"),
    (errors.QueueTimeout("waited"), "queue_timeout"),
    (errors.NoReadyEndpoint("none"), "no_endpoint"),
    (errors.RateLimited("slow down"), "rate_limited"),
    (errors.Unauthorized("who"), "unauthorized"),
    (errors.Forbidden("not yours"), "forbidden"),
])
@pytest_twisted.ensureDeferred
async def test_an_admission_refusal_is_counted_by_its_reason(sim, make_router, refusal, reason):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    dispatcher.refuse[MODEL] = refusal
    router = make_router(dispatcher)
    body = json.dumps({"model": MODEL, "messages": []}).encode()
    assert await threads.deferToThread(post, router, body) == refusal.status
    assert router.metrics.rejected == [(MODEL, reason)]
    assert router.metrics.in_flight == {MODEL: 0}


@pytest_twisted.ensureDeferred
async def test_bodies_the_router_cannot_use_are_counted_as_refused_before_any_engine(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]), max_body_bytes=1000)
    statuses = [await threads.deferToThread(post, router, body) for body in (
        b"{not json", b"[1]", json.dumps({"messages": []}).encode(), json.dumps({"model": "nobody"}).encode(),
        b'{"model": "' + b"x" * 2000 + b'"}')]
    assert statuses == [400, 400, 400, 404, 413]
    assert router.metrics.rejected == [("", "bad_request"), ("", "bad_request"), ("", "bad_request"),
                                       ("nobody", "unknown_model"), ("", "body_too_large")]
    assert router.dispatcher.leases == []
