"""stall.limit_unsent: the kernel holds little of an unread client's stream, so its stall clocks start soon.

Without it Linux lets a connection's send buffer grow to ``net.ipv4.tcp_wmem``'s
largest (4 MiB by default) for a client that reads nothing: measured with a
real llmgw-router, an unread stream at 1000 tokens/s took some 12 s to pause,
and ``router.client_stall_s`` (1 s) counted only from then.
"""

from __future__ import annotations

import socket
import sys
import time

import pytest

from llmgw.router.stall import limit_unsent

LIMIT = 16 * 1024


class Transport:
    """What limit_unsent looks at: a TCP transport's ``socket``, or a wrapper's ``transport`` (TLS)."""

    def __init__(self, sock=None, inner=None):
        if sock is not None:
            self.socket = sock
        if inner is not None:
            self.transport = inner


def connected_pair(rcvbuf: int = 4096) -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    return listener, client, server


def accepted_while_unread(server: socket.socket, seconds: float = 1.0) -> int:
    """Bytes the kernel takes from the sender, in 200-byte events, while its peer reads nothing."""
    server.setblocking(False)
    total, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            while True:
                total += server.send(b"x" * 200)
        except BlockingIOError:
            time.sleep(0.01)
    return total


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="no TCP_NOTSENT_LOWAT on this system")
def test_an_unread_connection_holds_about_the_limit_unsent_in_the_kernel():
    listener, client, server = connected_pair()
    other = connected_pair()
    try:
        assert limit_unsent(Transport(server), LIMIT) is True
        assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == LIMIT
        limited, unlimited = accepted_while_unread(server), accepted_while_unread(other[2])
        # The limit, the client's 4 KiB receive buffer and one segment: far under the kernel's own buffer.
        assert limited < 4 * LIMIT < unlimited, (limited, unlimited)
    finally:
        for s in (listener, client, server, *other):
            s.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="no TCP_NOTSENT_LOWAT on this system")
def test_a_wrapped_transport_has_its_socket_limited():
    listener, client, server = connected_pair()
    try:
        assert limit_unsent(Transport(inner=Transport(inner=Transport(server))), LIMIT) is True
        assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == LIMIT
    finally:
        for s in (listener, client, server):
            s.close()


@pytest.mark.skipif(sys.platform == "win32", reason="no UNIX sockets")
def test_a_transport_without_a_tcp_socket_is_left_as_it_is():
    a, b = socket.socketpair()
    try:
        assert limit_unsent(Transport(a), LIMIT) is False
        assert limit_unsent(Transport(), LIMIT) is False
        assert limit_unsent(None, LIMIT) is False
    finally:
        a.close()
        b.close()
