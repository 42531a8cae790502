"""An answer kept as JSON text (``JsonText``) reaches every caller as the value it holds: over TLS, and in process."""

from __future__ import annotations

import pytest_twisted
from autobahn.wamp.types import ComponentConfig
from twisted.internet import reactor

from llmgw.link import uris
from llmgw.roles import ROLE_NODE
from llmgw.wire import JsonText
from tests.link.conftest import Joined, join

NODES = [{"id": "n1", "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3 ✓"}], "reason": None}, {"id": "n2"}]
TEXT = b'[{"id":"n1","gpus":[{"index":0,"name":"NVIDIA H100 80GB HBM3 \xe2\x9c\x93"}],"reason":null},{"id":"n2"}]'


@pytest_twisted.ensureDeferred
async def test_a_json_text_answer_is_the_list_it_holds_for_a_remote_and_an_in_process_caller(hub, pki):
    await hub.control.register(lambda: JsonText(TEXT), uris.CP_AGENT + "text")
    await hub.control.register(lambda: [JsonText(TEXT), "and", JsonText(b"[]")], uris.CP_AGENT + "texts")
    node = await join(hub, pki, "node01")
    try:
        assert await node.call(uris.CP_AGENT + "text") == NODES
        assert await node.call(uris.CP_AGENT + "texts") == [NODES, "and", []]
    finally:
        node.leave()
    local = Joined(ComponentConfig(realm=uris.REALM))  # a second session in process
    hub.attach_local(local, authid="node02", role=ROLE_NODE)
    await local.ready.addTimeout(5, reactor)
    got = await local.call(uris.CP_AGENT + "text")
    assert got == NODES and type(got) is list
