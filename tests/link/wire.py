"""A WAMP peer that speaks raw JSON frames over real mutual TLS, for testing what the hub answers.

autobahn's own session would refuse to send most of what these tests send
(a second HELLO, a malformed URI, a CANCEL mode it does not know), so this
one sends lists and hands back the lists it receives, in order.
"""

from __future__ import annotations

import json

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, reactor

from llmgw.link import uris
from llmgw.link.client import _endpoint

HELLO, WELCOME, ABORT, GOODBYE, ERROR = 1, 2, 3, 6, 8
PUBLISH, PUBLISHED, SUBSCRIBE, SUBSCRIBED, EVENT = 16, 17, 32, 33, 36
CALL, CANCEL, RESULT, REGISTER, REGISTERED, INVOCATION, INTERRUPT, YIELD = 48, 49, 50, 64, 65, 68, 69, 70

# What autobahn announces as a callee that can be interrupted, and what a
# plain Basic Profile client (autobahn-js without the feature) announces.
CANCELLING_CALLEE = {"callee": {"features": {"call_canceling": True}}, "caller": {}}
PLAIN_ROLES = {"callee": {}, "caller": {}, "publisher": {}, "subscriber": {}}


class WirePeer(WebSocketClientProtocol):
    def connectionMade(self):
        self.inbox: list = []
        self.waiting: list = []
        self.closed = defer.Deferred()
        super().connectionMade()

    def onOpen(self):
        self.factory.opened.callback(self)

    def onMessage(self, payload, isBinary):
        self.inbox.append(json.loads(payload))
        self._wake()

    def onClose(self, wasClean, code, reason):
        if not self.closed.called:
            self.closed.callback((code, reason))
        self._wake()
        if not self.factory.opened.called:
            self.factory.opened.errback(ConnectionError(reason))

    def _wake(self):
        waiting, self.waiting = self.waiting, []
        for d in waiting:
            d.callback(None)

    def send(self, *msg) -> None:
        self.sendMessage(json.dumps(list(msg)).encode(), False)

    def send_raw(self, payload: bytes) -> None:
        self.sendMessage(payload, False)

    async def next(self, timeout: float = 5.0) -> list:
        """The next message the hub sent; fails if the connection closes first."""
        while not self.inbox:
            if self.closed.called:
                raise ConnectionError(f"the hub closed the connection: {self.closed.result}")
            d = defer.Deferred()
            self.waiting.append(d)
            await d.addTimeout(timeout, reactor)
        return self.inbox.pop(0)

    async def hello(self, roles=None, realm: str = uris.REALM) -> int:
        self.send(HELLO, realm, {"roles": roles or PLAIN_ROLES})
        welcome = await self.next()
        assert welcome[0] == WELCOME, welcome
        self.session_id = welcome[1]
        return welcome[1]

    async def until_closed(self, timeout: float = 5.0):
        return await self.closed.addTimeout(timeout, reactor)


async def wire_peer(hub, tls) -> WirePeer:
    """A connected, not yet joined peer with *tls*'s certificate."""
    factory = WebSocketClientFactory(hub.address.url, protocols=["wamp.2.json"])
    factory.protocol = WirePeer
    factory.opened = defer.Deferred()
    await _endpoint(reactor, hub.address, tls, 5).connect(factory)
    return await factory.opened.addTimeout(5, reactor)
