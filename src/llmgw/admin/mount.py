"""The admin page under ``/admin`` on the API listener, beside the router it does not disturb.

The router's server is a raw protocol (``llmgw.router.server``), not
twisted.web, so the page cannot be a child resource there.  Instead each
connection's first request line decides: ``/admin`` and below go to a
twisted.web site holding the page, anything else to the router, which then
sees the connection exactly as if it had accepted it itself (its limits,
timers and counts start when it is handed the connection).  A connection
stays with the one it was given: a browser's keep-alive connection to the
page is the page's.

A client that sends no whole request line in ``router.clients.header_timeout_s``
(or more than ``MAX_LINE_BYTES`` without one) is handed to the router, which
answers it as it answers any such client.
"""

from __future__ import annotations

from twisted.application import internet
from twisted.internet.protocol import Factory, Protocol
from twisted.protocols import policies
from twisted.web.resource import Resource
from twisted.web.server import Site

from llmgw.admin.web import TextAnswer, quiet_site

#: A request line longer than this is not one for the page.
MAX_LINE_BYTES = 8 * 1024
PREFIX = b"/admin"


class _PageRoot(Resource):
    def getChild(self, path: bytes, request) -> Resource:
        return TextAnswer(404, "nothing is here; the admin page is under /admin")


def page_site(page: Resource) -> Site:
    """A site with *page* at ``/admin`` and nothing else (``quiet_site``: no software named, no traceback)."""
    root = _PageRoot()
    root.putChild(PREFIX[1:], page)
    return quiet_site(root)


def for_the_page(line: bytes) -> bool:
    parts = line.split(b" ")
    if len(parts) < 2:
        return False
    target = parts[1]
    return target == PREFIX or target.startswith((PREFIX + b"/", PREFIX + b"?"))


def mount(router, site: Site, clock, wait_s: float) -> None:
    """Put *site* in front of *router*'s API listener (before it starts), for ``/admin`` requests only."""
    (listener,) = [s for s in router if isinstance(s, internet.StreamServerEndpointService)]
    outer = listener.factory
    if isinstance(outer, policies.WrappingFactory):
        # The listener's connection budget stays outermost: a connection
        # counts against it from its first byte, whoever it turns out to be for.
        outer.wrappedFactory = SplitFactory(outer.wrappedFactory, site, clock, wait_s)
    else:
        listener.factory = SplitFactory(outer, site, clock, wait_s)


class SplitFactory(Factory):
    noisy = False

    def __init__(self, router: Factory, site: Site, clock, wait_s: float):
        self.router = router
        self.site = site
        self.clock = clock
        self.wait_s = wait_s

    def doStart(self):
        self.router.doStart()
        self.site.doStart()

    def doStop(self):
        self.router.doStop()
        self.site.doStop()

    def buildProtocol(self, addr):
        return _FirstLine(self, addr)


class _FirstLine(Protocol):
    """Holds a connection's first bytes until its request line says whose it is."""

    def __init__(self, factory: SplitFactory, addr):
        self.split = factory
        self.addr = addr
        self.inner: Protocol | None = None
        self.buffer = b""
        self.timer = None

    def connectionMade(self):
        self.timer = self.split.clock.callLater(self.split.wait_s, self._hand, self.split.router)

    def dataReceived(self, data: bytes):
        if self.inner is not None:
            self.inner.dataReceived(data)
            return
        self.buffer += data
        end = self.buffer.find(b"\n")
        if end < 0 and len(self.buffer) < MAX_LINE_BYTES:
            return
        line = self.buffer[:end] if end >= 0 else b""
        self._hand(self.split.site if for_the_page(line) else self.split.router)

    def _hand(self, factory: Factory) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None
        inner = factory.buildProtocol(self.addr)
        if inner is None:
            self.transport.loseConnection()
            return
        self.inner = inner
        inner.makeConnection(self.transport)
        buffered, self.buffer = self.buffer, b""
        if buffered:
            inner.dataReceived(buffered)

    def connectionLost(self, reason=None):
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        if self.inner is not None:
            self.inner.connectionLost(reason)
