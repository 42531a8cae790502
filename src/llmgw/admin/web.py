"""The admin listener's resources: ``/metrics`` for Prometheus, ``/healthz`` for a load balancer, and the page.

The page (``llmgw.admin.site.AdminPage``) plugs in as ``page``: it answers
``/`` and everything below it that is not ``metrics`` or ``healthz``.  A
process without a control plane (``llmgw-router``) has no page to serve, and
its root says where the page is.

Every twisted.web site llmgw runs (this listener, and the page under
``/admin`` on the API listener: ``llmgw.admin.mount``) is made by
``quiet_site``: its answers name no software or version (twisted.web sends
``Server: TwistedWeb/<version>`` unless told not to), and an error is
answered in llmgw's words as plain text, never with a traceback or
twisted.web's own pages ("Processing Failed", "No Such Resource", "Your
browser approached me").

A page that says which hosts it answers to (``misdirected``, as
``AdminPage`` does from ``admin.hosts``) guards ``/metrics`` with them: it
answers anyone who reaches it, so a web page that re-points its DNS name
at this listener must not read it through a browser.  ``/healthz`` answers
whatever host is asked: it says nothing but "ok", and load balancers'
checks often send no Host.

::

    registry = CollectorRegistry()
    RouterMetrics(registry)
    registry.register(FleetCollector(fleet, reactor))
    admin_listener(reactor, config.listen.admin, registry, page).setServiceParent(top)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site, UnsupportedMethod

from llmgw.text import printable

log = Logger()

NO_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>llmgw router</title></head>
<body>
<h1>llmgw router</h1>
<p>This is a router's admin listener: the admin page (nodes, replicas, progress and logs) is on
llmgw-server's <code>listen.admin</code>, and under <code>/admin</code> on its API listener.</p>
<p>Prometheus figures are at <a href="/metrics">/metrics</a>; liveness at <a href="/healthz">/healthz</a>.</p>
</body></html>
"""
#: What a request to the admin listener may send as a body; the page's forms are far smaller.
MAX_BODY_BYTES = 64 * 1024
#: What a client hears when the listener failed answering it: the server's fault; its log has the traceback.
SERVER_FAULT = ("the server failed while answering this request (its fault, not the client's); "
                "the server's log has the details: tell its operator")
NOT_FOUND = "nothing is here; the admin listener answers /, /metrics and /healthz"
# RFC 9110's methods: one of these a path does not take is 405; any other, 501.
_HTTP_METHODS = frozenset((b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"))


class MetricsResource(Resource):
    """The registry in Prometheus' text format, or OpenMetrics when the scraper asks for it."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry):
        super().__init__()
        self._registry = registry

    def render_GET(self, request: Request) -> bytes:
        if request.postpath not in ([], [b""]):
            return TextAnswer(404, NOT_FOUND).render(request)
        accept = request.getHeader(b"accept")
        encoder, content_type = choose_encoder(accept.decode("latin-1") if accept else "")
        body = encoder(self._registry)
        request.setHeader(b"content-type", content_type.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        return body


class HealthResource(Resource):
    """200 ``ok`` while the process answers at all; readiness is what /metrics is for."""

    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return b"ok\n"


class NoPage(Resource):
    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        if request.postpath not in ([], [b""]):
            return TextAnswer(404, NOT_FOUND).render(request)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"x-content-type-options", b"nosniff")
        return NO_PAGE


class BoundedRequest(Request):
    """A request whose body stops being read at ``MAX_BODY_BYTES`` (the connection is closed with 413), and
    whose answer names no software and words its errors as llmgw's, not twisted.web's."""

    def setHeader(self, name, value):
        if name.lower() in (b"server", "server"):
            return  # twisted.web's "TwistedWeb/<version>": llmgw's listeners name no software
        super().setHeader(name, value)

    def render(self, resrc):
        super().render(_Worded(resrc))

    def processingFailed(self, reason):
        log.failure("failed answering {method} {path}", reason,
                    method=printable(self.method.decode("latin-1")[:16]), path=printable(self.path.decode("latin-1")[:200]))
        if self.startedWriting or self.finished:
            # Half an answer is out: it cannot become a 500 now.
            if self.channel is not None and self.channel.transport is not None:
                self.channel.transport.loseConnection()
            return reason
        body = TextAnswer(500, SERVER_FAULT).render(self)
        self.setHeader(b"content-length", b"%d" % len(body))
        self.write(body)
        self.finish()
        return reason

    def gotLength(self, length):
        self._body_seen = 0
        if length is not None and length > MAX_BODY_BYTES:
            self._too_large()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes):
        self._body_seen = getattr(self, "_body_seen", 0) + len(data)
        if self._body_seen > MAX_BODY_BYTES:
            self._too_large()
            return
        if self.content is not None:
            super().handleContentChunk(data)

    def _too_large(self) -> None:
        transport = self.channel.transport if self.channel is not None else None
        if transport is not None and not getattr(self, "_refused", False):
            self._refused = True
            transport.write(b"HTTP/1.1 413 Request Entity Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
            transport.loseConnection()


class _Worded(Resource):
    """*inner* as twisted.web renders it, with what twisted.web would answer in its own words answered in llmgw's."""

    isLeaf = True

    def __init__(self, inner):
        super().__init__()
        self._inner = inner

    def render(self, request: Request):
        try:
            body = self._inner.render(request)
        except UnsupportedMethod as e:
            if request.method == b"HEAD" and b"GET" in e.allowedMethods:
                raise  # twisted.web answers HEAD as GET without the body
            allowed = b", ".join(e.allowedMethods)
            request.setHeader(b"allow", allowed)
            return TextAnswer(405 if request.method in _HTTP_METHODS else 501,
                              f"this path answers {allowed.decode('latin-1')} only").render(request)
        if body is NOT_DONE_YET or isinstance(body, bytes):
            return body
        log.error("{resource} answered {path} with {kind}, not bytes: a fault in llmgw",
                  resource=type(self._inner).__name__, path=printable(request.path.decode("latin-1")[:200]),
                  kind=type(body).__name__)
        return TextAnswer(500, SERVER_FAULT).render(request)


class TextAnswer(Resource):
    """A plain-text refusal: *code* and *words*."""

    isLeaf = True

    def __init__(self, code: int, words: str):
        super().__init__()
        self.code, self.words = code, words

    def render(self, request: Request) -> bytes:
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        request.setHeader(b"cache-control", b"no-store")
        return self.words.encode("utf-8", "replace") + b"\n"


class _Root(Resource):
    def __init__(self, page: Resource):
        super().__init__()
        self._page = page
        self._misdirected = getattr(page, "misdirected", None)

    def getChildWithDefault(self, path: bytes, request: Request) -> Resource:
        if path == b"metrics" and self._misdirected is not None:
            refusal = self._misdirected(request)
            if refusal is not None:
                return TextAnswer(refusal.code, refusal.words)
        return super().getChildWithDefault(path, request)

    def getChild(self, path: bytes, request: Request) -> Resource:
        # Anything that is not metrics or healthz belongs to the page, root included.
        request.prepath.pop()
        request.postpath.insert(0, path)
        return self._page

    def render_GET(self, request: Request) -> bytes:
        return self._page.render(request)


def admin_resource(registry: CollectorRegistry, page: Resource | None = None) -> Resource:
    """The admin listener's tree: ``/metrics``, ``/healthz``, and ``page`` (or a note where it is) at ``/``."""
    root = _Root(page if page is not None else NoPage())
    root.putChild(b"metrics", MetricsResource(registry))
    root.putChild(b"healthz", HealthResource())
    return root


def quiet_site(root: Resource) -> Site:
    """A twisted.web site for *root* that names no software and never answers with a traceback."""
    site = Site(root, requestFactory=BoundedRequest)
    site.displayTracebacks = False  # twisted.web's default today; said here so that no version changes it
    site.noisy = False
    return site


def admin_site(registry: CollectorRegistry, page: Resource | None = None) -> Site:
    return quiet_site(admin_resource(registry, page))


def admin_listener(reactor, description: str, registry: CollectorRegistry, page: Resource | None = None) -> service.Service:
    """The admin tree served on *description* (a Twisted endpoint string), as a service to start."""
    site = admin_site(registry, page)
    return internet.StreamServerEndpointService(endpoints.serverFromString(reactor, description), site)
