"""What the hub gives one connection, and how many it holds: server.yaml's ``link:``.

The hub owns these limits; ``llmgw.config`` reads them from server.yaml by
the bounds declared here, so the transport imports nothing of the reader.
"""

from __future__ import annotations

import attrs

from llmgw.setting import setting


@attrs.frozen
class LinkSettings:
    """server.yaml's ``link:``: what the hub gives one connection, and how many it holds."""

    # From TCP connect to HELLO: TLS, the WebSocket opening handshake, then HELLO.
    hello_timeout_s: float = setting(10.0, above=0)
    # A second session for a connected node: how long its first one has to answer a ping.
    liveness_timeout_s: float = setting(3.0, above=0)
    # Link connections held at once (nodes, operators, routers); the API gets
    # what the open-files limit leaves after these.
    max_connections: int = setting(1024, least=1)
    # Connections in their handshakes (TLS, WebSocket, HELLO) at once; while
    # this many are, the listener accepts no more and the rest wait their turn.
    max_handshakes: int = setting(64, least=1)
    max_subscriptions_per_session: int = setting(256, least=1)
    # How deep a message's lists and mappings may nest; llmgw's own are under 10.
    max_message_depth: int = setting(32, least=4)
