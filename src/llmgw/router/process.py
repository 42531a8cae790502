"""`twistd llmgw-router`: the router alone, for when one process's CPU is the limit.

Run several behind a load balancer. Each joins the hub with a router
certificate, asks the control plane for the endpoint table, and follows it
as it changes; or, with no hub, serves ``router.endpoints`` from its file.
"""

from __future__ import annotations

from autobahn.twisted.wamp import ApplicationSession
from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.logger import Logger
from twisted.python import usage

from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.views import EndpointTable
from llmgw.wire import WireError, from_wire

log = Logger()


class Options(usage.Options):
    optParameters = [["config", "c", "/etc/llmgw/router.yaml", "The router's configuration file."]]


class TableSession(ApplicationSession):
    """Follows the control plane's endpoint table over the hub."""

    def __init__(self, config, router):
        super().__init__(config)
        self.router = router

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        # Subscribe first, then ask: a change between the two is not missed.
        await self.subscribe(self.follow, uris.EVENT_ENDPOINTS)
        table = self.follow(await self.call(uris.ROUTER_ENDPOINTS))
        if table is not None:
            log.info("following the endpoint table: {n} endpoints", n=len(table.endpoints))

    def follow(self, payload) -> EndpointTable | None:
        """A table from the hub; one that does not fit is refused and the last one keeps serving."""
        try:
            table = from_wire(EndpointTable, payload)
        except WireError as e:
            log.error("endpoint table refused, the previous one stays: {e}", e=str(e))
            return None
        self.router.apply_table(table)
        return table

    def onLeave(self, details):
        # Keep serving the last table while the hub is away: engines do not
        # stop because the control plane restarts.
        log.warn("left the hub ({reason}); serving the last endpoint table", reason=details.reason)
        self.disconnect()


def build(reactor, config) -> service.MultiService:
    from prometheus_client import CollectorRegistry
    from twisted.web.server import Site

    from llmgw.control.admin import admin_resource
    from llmgw.link.client import client_service, parse_hub_url
    from llmgw.link.tls import TLSFiles
    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.service import Router, check_open_api

    top = service.MultiService()
    check_open_api(config.router, config.listen.api, config.path)
    registry = CollectorRegistry()
    router = Router(reactor, config.router, config.listen.api, metrics=RouterMetrics(registry))
    router.setServiceParent(top)
    if config.listen.admin:
        site = Site(admin_resource(registry))
        site.noisy = False
        internet.StreamServerEndpointService(
            endpoints.serverFromString(reactor, config.listen.admin), site
        ).setServiceParent(top)
    if config.hub is not None:
        tls = TLSFiles(config.tls.ca, config.tls.cert, config.tls.key)
        client_service(reactor, parse_hub_url(config.hub), tls, lambda cfg: TableSession(cfg, router)).setServiceParent(top)
    top.router = router
    return top


def makeService(options) -> service.MultiService:
    from twisted.internet import reactor

    from llmgw.config.router import load_router_config

    try:
        config = load_router_config(options["config"])
        svc = build(reactor, config)
    except LlmgwError as e:
        raise SystemExit(f"llmgw-router: {e}")
    log.info("llmgw router: OpenAI API on {api}{hub}", api=config.listen.api,
             hub=f", following {config.hub}" if config.hub else ", static endpoints")
    return svc
