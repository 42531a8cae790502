"""/admin on the API listener: each connection's first request line says whether it is the page's or the router's."""

from __future__ import annotations

from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.resource import Resource

from llmgw.admin.mount import MAX_LINE_BYTES, SplitFactory, for_the_page, page_site


class Recorder(Protocol):
    def connectionMade(self):
        self.factory.made.append(self)
        self.got = b""

    def dataReceived(self, data):
        self.got += data


class Hello(Resource):
    isLeaf = True

    def render_GET(self, request):
        return b"the page"


def split(clock=None):
    router = Factory.forProtocol(Recorder)
    router.made = []
    root = Hello()
    factory = SplitFactory(router, page_site(root), clock or Clock(), wait_s=10)
    return factory, router


def connect(factory, *chunks: bytes):
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    for chunk in chunks:
        protocol.dataReceived(chunk)
    return protocol, transport


def test_only_admin_and_below_are_the_pages():
    assert for_the_page(b"GET /admin HTTP/1.1") and for_the_page(b"GET /admin/node?id=x HTTP/1.1")
    assert for_the_page(b"POST /admin/action HTTP/1.1") and for_the_page(b"GET /admin?x=1 HTTP/1.1")
    assert not for_the_page(b"GET /administrator HTTP/1.1") and not for_the_page(b"POST /v1/chat/completions HTTP/1.1")
    assert not for_the_page(b"garbage")


def test_the_router_gets_an_api_request_whole_even_split_across_reads():
    factory, router = split()
    connect(factory, b"POST /v1/chat/comp", b"letions HTTP/1.1\r\nHost: x\r\n\r\n")
    (made,) = router.made
    assert made.got == b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"


def test_the_page_gets_an_admin_request_and_the_router_never_sees_it():
    factory, router = split()
    _, transport = connect(factory, b"GET /admin HTTP/1.1\r\nHost: x\r\n\r\n")
    assert router.made == []
    assert transport.value().startswith(b"HTTP/1.1 200") and transport.value().endswith(b"the page")


def test_a_silent_client_or_an_endless_line_goes_to_the_router_which_has_limits_for_them():
    clock = Clock()
    factory, router = split(clock)
    connect(factory)
    clock.advance(9.9)
    assert router.made == []
    clock.advance(0.1)
    assert len(router.made) == 1
    connect(factory, b"G" * MAX_LINE_BYTES)
    assert len(router.made) == 2 and router.made[1].got == b"G" * MAX_LINE_BYTES


def test_mounted_behind_a_connection_budget_every_connection_counts_from_its_first_byte():
    from twisted.application import internet, service

    from llmgw.admin.mount import mount
    from llmgw.process.common import ConnectionBudget

    router, factory = service.MultiService(), Factory.forProtocol(Recorder)
    factory.made = []
    listener = internet.StreamServerEndpointService(None, factory)
    listener.setServiceParent(router)
    budget = ConnectionBudget(1, "listen.api")
    budget.wrap(factory)
    listener.factory = budget
    mount(router, page_site(Hello()), Clock(), 10)
    assert listener.factory is budget and isinstance(budget.wrappedFactory, SplitFactory)
    first = budget.buildProtocol(None)
    first.makeConnection(StringTransport())  # nothing sent yet: neither the page's nor the router's
    assert budget.held == 1 and budget.buildProtocol(None) is None
