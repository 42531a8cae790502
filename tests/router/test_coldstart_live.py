"""A held request through real sockets: the router holds it, reports the cold start, and answers once an engine is in the table."""

from __future__ import annotations

import http.client
import json

import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import reactor, threads

from llmgw.config.routing import RouterSettings
from llmgw.router.metrics import RouterMetrics
from llmgw.router.service import Router
from llmgw.views import ColdStart, EndpointEntry, EndpointTable
from tests.support.net import free_port
from tests.support.sim import MODEL
from tests.support.wait import until

WORDS = "starting on demand: node03: fetching tiny.gguf 41% (12/29 GB)"


def post(port: int, stream: bool) -> tuple[int, bytes]:
    body = json.dumps({"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": "wake up"}]})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_a_held_request_is_answered_once_the_table_gains_an_endpoint(sim):
    port = free_port()
    router = Router(reactor, RouterSettings(), f"tcp:{port}:interface=127.0.0.1",
                    metrics=RouterMetrics(CollectorRegistry()), follows_table=True, router_id="server")
    reports = []
    router.load_sink = reports.append
    router.startService()
    try:
        asleep = EndpointTable([], {MODEL: WORDS}, {MODEL: ColdStart(timeout_s=60, max_held=4)})
        router.apply_table(asleep)
        plain = threads.deferToThread(post, port, False)
        streamed = threads.deferToThread(post, port, True)
        await until(lambda: router.dispatcher.cold.count(MODEL) == 2, "both requests held")
        await until(lambda: any(r.urgent for r in reports), "the urgent report")
        urgent = next(r for r in reports if r.urgent)
        assert urgent.router == "server"
        assert [m.held for m in urgent.models if m.model == MODEL] in ([1], [2])
        assert not plain.called and not streamed.called
        router.apply_table(EndpointTable([EndpointEntry("tiny/0", MODEL, sim.base_url, "node03")], {},
                                         asleep.elastic))
        status, body = await plain
        assert status == 200, body
        assert json.loads(body)["choices"][0]["message"]["content"]
        status, body = await streamed
        assert status == 200, body
        assert body.rstrip().endswith(b"data: [DONE]")
        assert router.dispatcher.cold.count(MODEL) == 0
    finally:
        await router.stopService()
