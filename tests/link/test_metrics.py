"""The hub's figures after a real refusal over mutual TLS: a second agent with a live node's certificate."""

from __future__ import annotations

import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import task

from llmgw.link.settings import LinkSettings
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.link.metrics import LinkCollector
from tests.link.conftest import close, files, serve
from tests.link.wire import ABORT, wire_peer


@pytest_twisted.ensureDeferred
async def test_a_refused_second_session_is_counted_for_its_node_and_as_a_link_refusal(pki):
    hub = Hub(task.Clock(), settings=LinkSettings())
    port = await serve(hub, pki, control=False)
    registry = CollectorRegistry()
    registry.register(LinkCollector(hub, {}))
    try:
        assert registry.get_sample_value("llmgw_link_refusals_total", {"limit": "duplicate_node"}) == 0
        first = await wire_peer(hub, files(pki, "node01"))
        await first.hello()
        first.send(64, 1, {}, uris.node_uri("node01", "ping"))
        assert (await first.next())[0] == 65
        second = await wire_peer(hub, files(pki, "node01"))
        second.send(1, uris.REALM, {"roles": {"callee": {}}})
        abort = await second.next()
        assert abort[0] == ABORT and abort[2] == uris.ERROR_ALREADY_CONNECTED, abort
        assert registry.get_sample_value("llmgw_link_duplicate_sessions_refused_total", {"node": "node01"}) == 1
        assert registry.get_sample_value("llmgw_link_refusals_total", {"limit": "duplicate_node"}) == 1
    finally:
        await close(hub, port)
