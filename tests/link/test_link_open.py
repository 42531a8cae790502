"""What a link's opening does that autobahn meant to do, and not what it need not.

Both ends send each message at once: ``TCP_NODELAY`` under TLS and the
hub's connection budget.  autobahn means to set it and never does
(``llmgw.link.session.NoDelay``); with Nagle's algorithm on, the last part
of an answer waited for the peer's delayed acknowledgement, up to 40 ms,
whenever an earlier part was still unacknowledged.  And neither end
pretty-prints its options for a debug line nobody writes.  Real sockets and
mutual TLS on 127.0.0.1.
"""

from __future__ import annotations

import socket

import pytest_twisted

from tests.link.conftest import join
from tests.link.test_pacing import _paced_hub


def nodelay(protocol) -> int:
    """TCP_NODELAY on the socket under *protocol*'s transport (TLS, and the budget's wrapper on the hub's side)."""
    return protocol.transport.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@pytest_twisted.ensureDeferred
async def test_the_hub_and_its_client_both_turn_off_nagles_algorithm(pki):
    hub, budget, port = await _paced_hub(pki, max_pending=4)
    try:
        node = await join(hub, pki, "node01")
        (remote,) = [s for s in hub.sessions.values() if getattr(s, "_authid", None) == "node01"]
        assert nodelay(remote._transport) == 1  # the hub's end
        assert nodelay(node._transport) == 1  # the agent's, ctl's, the dashboard's
        node.leave()
    finally:
        for session in list(hub.sessions.values()):
            session.drop()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_link_opening_pretty_prints_nothing_for_a_debug_line_nobody_writes(hub, pki, monkeypatch):
    import pprint

    from autobahn.websocket import protocol

    from llmgw.link.session import WhenLogged

    printed = []
    monkeypatch.setattr(pprint.PrettyPrinter, "pformat", lambda self, value: printed.append(value) or "")
    node = await join(hub, pki, "node01")
    node.leave()
    assert printed == []  # neither the hub's end nor the client's
    monkeypatch.undo()
    assert protocol.pformat is WhenLogged
    assert f"{WhenLogged([('tcpNoDelay', True)])}" == "[('tcpNoDelay', True)]"
    timings = protocol.Timings()  # the module's other pformat: still a string
    timings.track("onOpen")
    assert str(timings).startswith("{'onOpen': ")
