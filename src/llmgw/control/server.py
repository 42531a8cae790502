"""`twistd llmgw-server`: the hub and the control plane in one reactor."""

from __future__ import annotations

from autobahn.wamp.types import ComponentConfig
from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python import usage

from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.link.tls import TLSFiles, server_options

log = Logger()


class Options(usage.Options):
    optParameters = [["config", "c", "/etc/llmgw/server.yaml", "The server's configuration file."]]


class _AttachControlPlane(service.Service):
    """Attaches the control plane to the hub once the reactor runs."""

    def __init__(self, reactor, hub: Hub, catalog, registry, router=None, router_api=None):
        self._reactor = reactor
        self._hub = hub
        self.catalog = catalog
        self.registry = registry
        self.router = router
        self.router_api = router_api
        self.session = None

    def startService(self):
        super().startService()
        from llmgw.control.fleet import Fleet
        from llmgw.control.plane import ControlSession

        fleet_config = self.catalog.config.fleet

        def fleet_factory(emit):
            return Fleet(
                self._reactor, emit,
                unreachable_after=fleet_config.unreachable_after_s,
                lost_after=fleet_config.lost_after_s,
            )

        from llmgw.control.collector import FleetCollector

        self.session = ControlSession(ComponentConfig(realm=uris.REALM), fleet_factory, self.catalog, self._reactor)
        self._hub.attach_local(self.session)
        self.registry.register(FleetCollector(self.session.fleet, self._reactor, replicas=self.session.reconciler.views))
        if self.router is not None:
            self.session.table_listeners.append(self.router.apply_table)
            self.session.reload_listeners.append(router_listener(self.router, self.router_api))

    def tick(self):
        """Once a second: notice silent nodes, then converge the fleet to the catalog."""
        if self.session is None or not self.session.is_attached():
            return
        self.session.fleet.check()
        self.session.reconciler.tick()
        self.session.publish_endpoints()

    def reload(self):
        """SIGHUP: as `ctl reload`; what changed, or who refused and why, is in the log."""
        if self.session is None or not self.session.is_attached():
            log.warn("SIGHUP before the control plane joined the hub: nothing reloaded; send it again")
            return None
        return self.session.apply_reload()


def router_listener(router, listen_api: str):
    """The in-process router's share of a reload: its ``router:`` section.

    The API keeps listening where it started until a restart, so a new
    section is checked against that listener: removing the last key from an
    API that is not on loopback is refused, as it is at start.
    """
    from llmgw.control.reload import Listener
    from llmgw.router.service import check_open_api

    def prepare(config):
        check_open_api(config.router, listen_api, config.path)
        return lambda: router.reconfigure(config.router)

    return Listener("the router", prepare)


def link_endpoint(reactor, description: str):
    """The link listener's TCP endpoint; TLS is wrapped around it from `tls:`."""
    # listen.link is validated to start with "ssl:" and to carry no key files,
    # so what follows is a plain TCP endpoint description.
    return endpoints.serverFromString(reactor, "tcp:" + description.split(":", 1)[1])


def build(reactor, config) -> service.MultiService:
    top = service.MultiService()
    hub = Hub(reactor)
    tls = TLSFiles(config.tls.ca, config.tls.cert, config.tls.key)
    factory = TLSMemoryBIOFactory(server_options(tls), False, hub.websocket_factory())
    internet.StreamServerEndpointService(link_endpoint(reactor, config.listen.link), factory).setServiceParent(top)
    from prometheus_client import CollectorRegistry

    from llmgw.control.catalog import Catalog

    from llmgw.router.metrics import RouterMetrics
    from llmgw.router.service import Router, check_open_api

    registry = CollectorRegistry()
    catalog = Catalog(config)
    router = None
    if config.listen.api:
        check_open_api(config.router, config.listen.api, config.path)
        router = Router(reactor, config.router, config.listen.api, metrics=RouterMetrics(registry))
        router.setServiceParent(top)
    attach = _AttachControlPlane(reactor, hub, catalog, registry, router, config.listen.api)
    attach.setServiceParent(top)
    internet.TimerService(1.0, attach.tick).setServiceParent(top)
    if config.listen.admin:
        from llmgw.admin.web import admin_listener

        admin_listener(reactor, config.listen.admin, registry).setServiceParent(top)
    top.registry = registry
    top.router = router
    top.hub = hub
    top.control = attach
    return top


def makeService(options) -> service.MultiService:
    from twisted.internet import reactor

    from llmgw.config.server import load_server_config

    try:
        config = load_server_config(options["config"])
        svc = build(reactor, config)
    except LlmgwError as e:
        raise SystemExit(f"llmgw-server: {e}")
    import signal

    signal.signal(signal.SIGHUP, lambda *_: reactor.callFromThread(svc.control.reload))
    log.info("llmgw server: link (mutual TLS) on {link}", link=config.listen.link)
    return svc
