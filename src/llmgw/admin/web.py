"""The admin listener's resources: ``/metrics`` for Prometheus, ``/healthz`` for a load balancer.

The admin web page is a later piece of work; until then the root says so
and links ``/metrics``.  It plugs in as ``page``: whatever resource is given
there answers ``/`` and everything below it that is not ``metrics`` or
``healthz``.

::

    registry = CollectorRegistry()
    RouterMetrics(registry)
    registry.register(FleetCollector(fleet, reactor))
    admin_listener(reactor, config.listen.admin, registry).setServiceParent(top)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.web.pages import notFound
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

PLACEHOLDER = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>llmgw admin</title></head>
<body>
<h1>llmgw admin</h1>
<p>The admin page (nodes, replicas, progress and logs) arrives in a later release.</p>
<p>Prometheus figures are at <a href="/metrics">/metrics</a>; liveness at <a href="/healthz">/healthz</a>.</p>
</body></html>
"""


class MetricsResource(Resource):
    """The registry in Prometheus' text format, or OpenMetrics when the scraper asks for it."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry):
        super().__init__()
        self._registry = registry

    def render_GET(self, request: Request) -> bytes:
        if request.postpath not in ([], [b""]):
            return notFound().render(request)
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


class PlaceholderPage(Resource):
    isLeaf = True

    def render_GET(self, request: Request) -> bytes:
        if request.postpath not in ([], [b""]):
            return notFound().render(request)
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return PLACEHOLDER


class _Root(Resource):
    def __init__(self, page: Resource):
        super().__init__()
        self._page = page

    def getChild(self, path: bytes, request: Request) -> Resource:
        # Anything that is not metrics or healthz belongs to the page, root included.
        request.prepath.pop()
        request.postpath.insert(0, path)
        return self._page

    def render_GET(self, request: Request) -> bytes:
        return self._page.render(request)


def admin_resource(registry: CollectorRegistry, page: Resource | None = None) -> Resource:
    """The admin listener's tree: ``/metrics``, ``/healthz``, and ``page`` (a placeholder for now) at ``/``."""
    root = _Root(page if page is not None else PlaceholderPage())
    root.putChild(b"metrics", MetricsResource(registry))
    root.putChild(b"healthz", HealthResource())
    return root


def admin_listener(reactor, description: str, registry: CollectorRegistry) -> service.Service:
    """The admin tree served on *description* (a Twisted endpoint string), as a service to start."""
    site = Site(admin_resource(registry))
    site.noisy = False
    return internet.StreamServerEndpointService(endpoints.serverFromString(reactor, description), site)
