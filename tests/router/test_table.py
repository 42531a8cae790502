"""A router follows the control plane's endpoint table: records in process, their wire form over the hub."""

from __future__ import annotations

from autobahn.wamp.types import ComponentConfig
from twisted.internet.task import Clock

from llmgw.config.server import RouterSettings
from llmgw.config.server import StaticEndpoint
from llmgw.link import uris
from llmgw.router.tablesession import TableSession
from llmgw.router.service import Router
from llmgw.views import EndpointEntry, EndpointTable
from llmgw.wire import to_wire

TABLE = EndpointTable([EndpointEntry("echo/0", "echo", "http://10.0.0.1:4001", "node01")],
                      {"echo": "never shown: echo has an endpoint", "qwen": "node01: downloading qwen.gguf"})


def router(**config) -> Router:
    return Router(Clock(), RouterSettings(**config), "tcp:0:interface=127.0.0.1")


def test_the_table_becomes_the_dispatchers_endpoints_beside_the_static_ones():
    r = router(endpoints=(StaticEndpoint(model="llama", url="http://10.0.0.9:8080"),))
    r.apply_table(TABLE)
    assert [(e.id, e.model, e.node_id) for e in r.dispatcher.endpoints()] == [
        ("echo/0", "echo", "node01"), ("static:llama:http://10.0.0.9:8080", "llama", None)]


def test_a_table_from_the_hub_is_decoded_and_one_that_does_not_fit_keeps_the_last():
    r = router()
    session = TableSession(ComponentConfig(realm=uris.REALM), r)
    assert session.follow(to_wire(TABLE)) == TABLE
    assert [e.id for e in r.dispatcher.endpoints()] == ["echo/0"]
    assert session.follow({"endpoints": [{"id": "echo/1", "model": "echo", "url": 5}]}) is None
    assert [e.id for e in r.dispatcher.endpoints()] == ["echo/0"]
