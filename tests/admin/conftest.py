"""The admin page over a real socket on 127.0.0.1, reading a fleet as real agents would report it.

``FakeSource`` stands in for the control plane's session only: the views it
hands the page are built by the real ``Fleet`` from recorded inventories, and
it counts what it was asked to do.  A ``Client`` keeps its cookies and can
speak from another loopback address (127.0.0.2), which the tests configure
as not local.
"""

from __future__ import annotations

import hashlib
import re
import socket
from http.cookies import SimpleCookie

import attrs
import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.web.client import Agent, FileBodyProducer, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from llmgw.admin.site import AdminPage, SourceError
from llmgw.admin.web import admin_site
from llmgw.answers import CordonAnswer, DrainAnswer, LogsAnswer
from llmgw.config.server import AdminKey, AdminSettings
from llmgw.control.fleet import Fleet
from llmgw.records import ShardSpec, ShardStatus
from tests.support import histories, reportedfleet
from tests.support.reportedfleet import gpu_node, quiet_node
from tests.support import cluster as processes

OPERATOR_KEY = "llmgw-operator-key-for-tests"
HOSTILE = "<script>alert('pwned')</script>"


@attrs.define
class FakeSource:
    fleet: Fleet
    clock: object
    lines: list[str] = attrs.Factory(lambda: ["agent started", f"engine said {HOSTILE}"])
    acted: list[tuple[str, str]] = attrs.Factory(list)
    asked: list[tuple[str, str | None, int]] = attrs.Factory(list)
    journal: object = attrs.Factory(histories.journal)
    figured: object = attrs.Factory(histories.figures)
    #: What events()/figures() say instead of answering, as the control plane would refuse.
    events_error: str | None = None
    figures_error: str | None = None
    asked_events: list[dict] = attrs.Factory(list)
    asked_figures: list[tuple] = attrs.Factory(list)
    #: With ha:, this server's name and every server as llmgw.cp.status lists them; (None, []) without.
    here: str | None = None
    server_views: list = attrs.Factory(list)
    servers_error: str | None = None

    def nodes(self):
        return self.fleet.views()

    def replicas(self):
        from llmgw.views import ReplicaView, ShardView

        return [ReplicaView("qwen", "qwen/0", "ready", nodes=["gpu01"], endpoint="http://10.0.0.5:8000",
                            shards=[ShardView("qwen/0/0", node="gpu01", state="ready", rank=0)])]

    async def logs(self, node_id, source, n):
        self.asked.append((node_id, source, n))
        if node_id == "cpu07":
            raise SourceError("cpu07: agent too old or not answering (wamp.error.timeout)")
        return LogsAnswer(node_id, source or "agent", ["agent", "qwen/0/0"], self.lines[-n:])

    async def events(self, node=None, model=None):
        self.asked_events.append({"node": node, "model": model})
        if self.events_error:
            raise SourceError(self.events_error)
        return self.journal

    async def figures(self, scope=None, subject=None, limit=None):
        self.asked_figures.append((scope, subject))
        if self.figures_error:
            raise SourceError(self.figures_error)
        kept = [s for s in self.figured.series if (scope is None or s.scope == scope)
                and (subject is None or s.subject == subject)]
        return attrs.evolve(self.figured, series=kept[:limit])

    async def servers(self):
        if self.servers_error:
            raise SourceError(self.servers_error)
        return self.here, self.server_views

    async def act(self, verb, node_id):
        self.acted.append((verb, node_id))
        if verb == "drain":
            return DrainAnswer(node_id, True, ["qwen/0/0"])
        return CordonAnswer(node_id, verb != "uncordon")


# Fixtures from elsewhere: the fleet's clock, and real processes for the browser tests.
clock = reportedfleet.clock
cluster = processes.cluster


@pytest.fixture
def source(clock):
    fleet = Fleet(clock, lambda kind, ident, event: None, unreachable_after=15, lost_after=60)
    node = gpu_node()
    fleet.register("gpu01", 1, attrs.evolve(node, labels={"rack": HOSTILE}))
    fleet.register("cpu07", 2, quiet_node())
    spec = ShardSpec(shard_id="qwen/0/0", replica_id="qwen/0", model="qwen", engine="vllm")
    fleet.place("gpu01", spec)
    fleet.shard_status("gpu01", ShardStatus(spec=spec, state="ready", since=0.0))
    return FakeSource(fleet, clock)


def settings(**changes) -> AdminSettings:
    key = AdminKey("ops", hashlib.sha256(OPERATOR_KEY.encode()).hexdigest())
    return attrs.evolve(AdminSettings(local=("127.0.0.1/32",), keys=(key,)), **changes)


@pytest.fixture
def admin_settings():
    return settings()


@pytest_twisted.async_yield_fixture
async def admin(source, clock, admin_settings):
    """The page's URL; the page itself is ``admin.page``."""
    page = AdminPage(source, admin_settings, clock)
    port = reactor.listenTCP(0, admin_site(CollectorRegistry(), page), interface="127.0.0.1")
    url = f"http://127.0.0.1:{port.getHost().port}"
    yield Served(url, page)
    await port.stopListening()


@attrs.frozen
class Served:
    url: str
    page: AdminPage


@attrs.frozen
class Answer:
    code: int
    headers: Headers
    body: str

    def header(self, name: str) -> str | None:
        values = self.headers.getRawHeaders(name)
        return values[0] if values else None

    def cookies(self) -> SimpleCookie:
        jar = SimpleCookie()
        for line in self.headers.getRawHeaders("set-cookie") or []:
            jar.load(line)
        return jar

    def csrf(self) -> str:
        (token,) = re.findall(r'name="csrf" value="([0-9a-f]+)"', self.body)[:1] or [None]
        assert token, f"no CSRF token in:\n{self.body[:2000]}"
        return token


@implementer(IAgentEndpointFactory)
@attrs.define
class _From:
    address: str

    def endpointForURI(self, uri):
        return TCP4ClientEndpoint(reactor, uri.host.decode(), uri.port, bindAddress=(self.address, 0))


def raw(port: int, head: str, body: bytes = b"", source: str = "127.0.0.1") -> Answer:
    """One request written byte for byte from *source* (a hostile Host, two, none, a URL for a target).

    *head* is the request line and headers, one a line, without the blank
    line that ends them; the answer is read until the server closes.
    Blocking: from a test on the reactor, ``await threads.deferToThread(raw, ...)``.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(head.strip().replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
        data = b"".join(iter(lambda: s.recv(65536), b""))
    top, _, text = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = Headers()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.addRawHeader(name.strip(), value.strip())
    return Answer(int(lines[0].split(" ", 2)[1]), headers, text.decode("utf-8", "replace"))


class Client:
    """An HTTP client with a cookie jar, connecting from *address*."""

    def __init__(self, base: str, address: str = "127.0.0.1"):
        self.base = base
        self.agent = Agent.usingEndpointFactory(reactor, _From(address))
        self.jar: dict[str, str] = {}

    async def get(self, path: str) -> Answer:
        return await self.request(b"GET", path)

    async def post(self, path: str, form: dict[str, str] | bytes, origin: str | None = None) -> Answer:
        from urllib.parse import urlencode

        body = form if isinstance(form, bytes) else urlencode(form).encode()
        headers = {"content-type": ["application/x-www-form-urlencoded"]}
        if origin:
            headers["origin"] = [origin]
        return await self.request(b"POST", path, body, headers)

    async def request(self, method: bytes, path: str, body: bytes | None = None, headers=None) -> Answer:
        headers = Headers(headers or {})
        if self.jar:
            headers.setRawHeaders("cookie", ["; ".join(f"{k}={v}" for k, v in self.jar.items())])
        producer = FileBodyProducer(__import__("io").BytesIO(body)) if body is not None else None
        response = await self.agent.request(method, (self.base + path).encode(), headers, producer)
        text = (await readBody(response)).decode("utf-8", "replace")
        answer = Answer(response.code, response.headers, text)
        for name, morsel in answer.cookies().items():
            if morsel["max-age"] == "0":
                self.jar.pop(name, None)
            else:
                self.jar[name] = morsel.value
        return answer
