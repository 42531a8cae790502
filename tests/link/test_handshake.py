"""A client waits out a busy hub's handshake: the hub's HELLO timeout decides, not autobahn's 5 s.

A fleet reconnecting all at once after a server restart queues in the TLS
handshakes; a client that hung up at 5 s only rejoined the end of the
queue (bench/fleet.py saw 5,000 agents stall at about 1,250, the hub
logging thousands of handshakes cut off with "decode error").
"""

from __future__ import annotations

from llmgw.link.settings import LinkSettings
from llmgw.huburl import parse_hub_url
from llmgw.link.client import _factory
from llmgw.link.hub import Hub


def test_a_client_gives_the_handshake_longer_than_the_hub_gives_hello():
    client = _factory(parse_hub_url("wss://127.0.0.1:7443/"), lambda config: None)
    hub = Hub(clock=None).websocket_factory()
    assert hub.openHandshakeTimeout == LinkSettings().hello_timeout_s
    assert client.openHandshakeTimeout > hub.openHandshakeTimeout
    assert client.openHandshakeTimeout >= 3 * 5  # autobahn's own default was 5 s
