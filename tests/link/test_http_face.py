"""What the link port answers a client that does not speak WebSocket, or speaks it wrongly, over real mutual TLS.

Before, a plain GET got autobahn's status page and ``Server: AutobahnPython/<version>``
on every answer: the software and its version, for whoever asked.  Now no
answer names either, and a refused handshake gets the status's own phrase
and a sentence saying what the port is.
"""

from __future__ import annotations

import base64
import os

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor

from llmgw.link.client import _endpoint
from tests.link.conftest import files

HOST = b"Host: 127.0.0.1\r\n"


def upgrade(version: bytes = b"13", protocols: bytes = b"wamp.2.json") -> bytes:
    key = base64.b64encode(os.urandom(16))
    return (b"GET / HTTP/1.1\r\n" + HOST + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: " + version + b"\r\n"
            b"Sec-WebSocket-Protocol: " + protocols + b"\r\n\r\n")


REQUESTS = {
    "a plain GET": (b"GET / HTTP/1.1\r\n" + HOST + b"\r\n", 426),
    "a GET with ?redirect=": (b"GET /?redirect=http%3A%2F%2Fexample.org HTTP/1.1\r\n" + HOST + b"\r\n", 426),
    "a POST": (b"POST / HTTP/1.1\r\n" + HOST + b"Content-Length: 0\r\n\r\n", 405),
    "a WebSocket version nobody speaks": (upgrade(version=b"99"), 400),
    "an extension offer autobahn cannot parse": (upgrade().replace(
        b"\r\n\r\n", b"\r\nSec-WebSocket-Extensions: permessage-deflate; client_max_window_bits=99\r\n\r\n"), 400),
    "no WAMP subprotocol": (upgrade(protocols=b"chat"), 400),
    "a good upgrade": (upgrade(), 101),
}


class Collect(protocol.Protocol):
    def __init__(self):
        self.data = b""
        self.done = defer.Deferred()

    def dataReceived(self, data):
        self.data += data
        if self.data.startswith(b"HTTP/1.1 101") and b"\r\n\r\n" in self.data:
            self.transport.loseConnection()  # upgraded: its headers are all this test reads

    def connectionLost(self, reason):
        self.done.callback(self.data)


@pytest.mark.parametrize("what", list(REQUESTS))
@pytest_twisted.ensureDeferred
async def test_no_answer_of_the_link_port_names_its_software(hub, pki, what):
    request, status = REQUESTS[what]
    collect = Collect()
    await _endpoint(reactor, hub.address, files(pki, "node01"), 5).connect(
        protocol.Factory.forProtocol(lambda: collect))
    collect.transport.write(request)
    answer = await collect.done.addTimeout(5, reactor)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer
    headers = [line.split(b":")[0].lower() for line in head.split(b"\r\n")[1:]]
    assert b"server" not in headers, answer
    lowered = answer.lower()
    for internal in (b"autobahn", b"python", b"twisted", b"traceback", b"exception"):
        assert internal not in lowered, answer
    if status != 101:
        assert body.startswith(b"This is llmgw's link port: WAMP (wamp.2.json) over WebSocket"), answer
