"""`twistd llmgw-server`: the hub, the control plane, the router and the admin listener in one reactor.

What the tree holds: the hub's TLS listener; the router (when ``listen.api``
is set), fed the endpoint table in process and reconfigured by reloads; the
control plane's session, attached to the hub once the reactor runs and
ticked once a second; the admin listener, serving one registry that
the router's and the fleet's figures share; and with ``ha:`` this server's
part among several (``llmgw.process.ha``: the election, the standby's role).
"""

from __future__ import annotations

import resource

from autobahn.wamp.types import ComponentConfig
from prometheus_client import CollectorRegistry
from twisted.application import internet, service
from twisted.internet import endpoints
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory

from llmgw.admin.mount import mount as mount_admin
from llmgw.admin.mount import page_site
from llmgw.admin.site import AdminPage
from llmgw.admin.source import ControlSource
from llmgw.admin.web import admin_listener
from llmgw.config.server import ServerConfig, load_server_config
from llmgw.control.catalog import Catalog
from llmgw.control.collector import DownloadFailures, FleetCollector, WeightsCollector
from llmgw.control.fleet import Fleet
from llmgw.control.identity import Identity
from llmgw.control.journal import Journal
from llmgw.control.journalfeed import attach as attach_journal
from llmgw.control.plane import ControlSession
from llmgw.control.scalemetrics import ScaleCollector
from llmgw.control.reload import Listener, revocation_listener
from llmgw.control.series import Rolling
from llmgw.control.seriesfeed import SeriesFeed
from llmgw.link import uris
from llmgw.link.hub import Hub
from llmgw.link.metrics import CertificateCollector, LinkCollector
from llmgw.link.tls import server_options
from llmgw.process.common import (
    ConnectionBudget,
    ProcessTree,
    compose,
    config_options,
    split_open_files,
)
from llmgw.process.fullgc import FullCollections
from llmgw.process.ha import Roles
from llmgw.process.sending import TurnFlush
from llmgw.router.metrics import RouterMetrics
from llmgw.router.service import Router, check_open_api

log = Logger()

Options = config_options("/etc/llmgw/server.yaml", "The server's configuration file.")


def makeService(options) -> service.MultiService:
    return compose("llmgw-server", options, load_server_config, build, on_sighup=lambda top: top.control.reload)


def build(reactor, config: ServerConfig) -> service.MultiService:
    top = ProcessTree("llmgw-server", config.path)
    hub = Hub(reactor, settings=config.link)
    budgets = connection_budgets(config)
    hub_tls = server_options(config.tls)
    factory = TLSMemoryBIOFactory(hub_tls, False, hub.websocket_factory(), clock=TurnFlush(reactor))
    link = internet.StreamServerEndpointService(link_endpoint(reactor, config.listen.link), factory)
    link.setServiceParent(top)
    link_budget = ConnectionBudget(budgets.link, "listen.link (link.max_connections)", config.link.max_handshakes)
    hub.admitted = link_budget.admit
    top.must_listen("listen.link", link, link_budget)
    registry = CollectorRegistry()
    listeners = {"link": link_budget}
    catalog = Catalog(config)
    router = None
    reload_listeners = [revocation_listener(hub_tls)]
    if config.listen.api:
        check_open_api(config.router, config.listen.api, config.path)
        router = Router(reactor, config.router, config.listen.api, metrics=RouterMetrics(registry), follows_table=True,
                        router_id="server")
        router.expect_models(config.models)
        router.setServiceParent(top)
        listeners["api"] = ConnectionBudget(budgets.api, "listen.api (what the open-files limit leaves after link.max_connections)")
        top.must_listen("listen.api", router, listeners["api"])
        reload_listeners.append(router_listener(router, config.listen.api))
    registry.register(LinkCollector(hub, listeners, hub_tls))
    registry.register(CertificateCollector({"server": config.tls.cert, "ca": config.tls.ca}))
    control = ControlPlane(reactor, hub, catalog, registry, router, reload_listeners)
    control.handshaking = lambda: len(link_budget.pending)
    control.journal = Journal(reactor, config.history, config.history.where(config.path))
    history = config.history
    control.series = Rolling(reactor, history.series_bucket_s, history.series_buckets, history.series_subjects)
    control.identity = Identity(
        lambda: catalog.config.pki.ca_dir,
        lambda: revocation_listener(hub_tls).prepare(catalog.config)(),
        lambda: catalog.config.tls.revocation_list(),
        lambda: catalog.config.tls.ca,
        forget=lambda node_id: control.session.fleet.forget_node(node_id),
    )
    if config.ha is not None:
        control.ha = Roles(reactor, config.ha, hub, router)
    control.setServiceParent(top)
    if control.ha is not None:
        control.ha.setServiceParent(top)
    internet.TimerService(1.0, control.tick).setServiceParent(top)
    page = AdminPage(ControlSource(control), config.admin, reactor)
    reload_listeners.append(admin_page_listener(page))
    if router is not None and config.admin.on_api:
        # The same page, sessions and all, under /admin on the API listener; a
        # proxy may face it, so admin.local is not trusted there.
        under_api = AdminPage(page.source, config.admin, reactor, base="/admin", guard=page.guard, trust_local=False)
        reload_listeners.append(admin_page_listener(under_api))
        mount_admin(router, page_site(under_api), reactor, config.router.clients.header_timeout_s)
    if config.listen.admin:
        admin = admin_listener(reactor, config.listen.admin, registry, page)
        admin.setServiceParent(top)
        top.must_listen("listen.admin", admin)
    top.registry = registry
    top.router = router
    top.hub = hub
    top.link_budget = link_budget
    top.hub_tls = hub_tls
    top.control = control
    log.info("llmgw server: link (mutual TLS) on {link}", link=config.listen.link)
    FullCollections(reactor, lambda: hub.sessions_left).setServiceParent(top)
    return top


def connection_budgets(config: ServerConfig):
    """Split the open-files limit (compose raised it): the link keeps link.max_connections, the API has the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budgets = split_open_files(soft, config.link.max_connections)
    log.info("open files: the link holds up to {link} connections, the API up to {api} (of {soft})",
             link=budgets.link, api=budgets.api, soft=soft)
    if budgets.link < config.link.max_connections:
        log.warn(
            "the open-files limit {soft} is too low for link.max_connections {want}: the link holds {link}; "
            "raise LimitNOFILE (contrib's units set 65536) or lower link.max_connections in {path}",
            soft=soft, want=config.link.max_connections, link=budgets.link, path=config.path,
        )
    return budgets


#: The link's accept queue when listen.link names no backlog= (Twisted's default is 50).
LINK_BACKLOG = 1024


def link_endpoint(reactor, description: str):
    """The link listener's TCP endpoint; TLS is wrapped around it from `tls:`.

    Its accept queue is ``LINK_BACKLOG`` unless the description says
    ``backlog=``: while the link paces arrivals (``link.max_handshakes``) a
    fleet reconnecting waits there, and a queue of 50 overflows, so the
    kernel drops the rest's SYNs and they come back only after TCP's
    retransmission backoff (1, 3, 7 s...), with the hub idle meanwhile.  Not
    deeper: at a hub's 60–100 handshakes a second, the last of 1,024 waits
    10–17 s, inside a client's 30 s for its handshake; a queue of 4,096 made
    the back of it give up, dial again, and leave the hub a handshake with
    nobody on the other end (3,391 at a 10,000-node restart).  Past the
    queue, a client's SYN goes unanswered, its connect times out in 10 s, and
    it backs off with the jitter every agent has.  The kernel caps it at
    net.core.somaxconn.
    """
    # listen.link is validated to start with "ssl:" and to carry no key files,
    # so what follows is a plain TCP endpoint description.
    tcp = "tcp:" + description.split(":", 1)[1]
    if not any(part.startswith("backlog=") for part in tcp.split(":")):
        tcp += f":backlog={LINK_BACKLOG}"
    return endpoints.serverFromString(reactor, tcp)


def router_listener(router: Router, listen_api: str) -> Listener:
    """The in-process router's share of a reload: its ``router:`` section and the catalog's model names.

    The API keeps listening where it started until a restart, so a new
    section is checked against that listener: removing the last key from an
    API that is not on loopback is refused, as it is at start.
    """

    def prepare(config: ServerConfig):
        check_open_api(config.router, listen_api, config.path)

        def apply():
            router.reconfigure(config.router)
            router.expect_models(config.models)

        return apply

    return Listener("the router", prepare, applies=("router",))


def admin_page_listener(page: AdminPage) -> Listener:
    """A page's share of a reload: ``admin:`` as the file now says it (networks, keys, bounds)."""
    return Listener("the admin page", lambda config: lambda: page.reconfigure(config.admin), applies=("admin",))


class ControlPlane(service.Service):
    """The control plane's session: attached to the hub once the reactor runs, then ticked."""

    def __init__(self, reactor, hub: Hub, catalog: Catalog, registry: CollectorRegistry, router: Router | None,
                 reload_listeners: list[Listener]):
        self._reactor = reactor
        self._hub = hub
        self.catalog = catalog
        self.registry = registry
        self.router = router
        self.reload_listeners = reload_listeners
        self.session: ControlSession | None = None
        self.identity: Identity | None = None
        # What happened (llmgw.control.journal): build sets it; ``session.journal`` is the same.
        self.journal: Journal | None = None
        # The last hour's figures (llmgw.control.series): build sets it; the feed fills it once the session is made.
        self.series: Rolling | None = None
        # The link's connections mid-handshake (its ConnectionBudget's pending), for the fleet's settling.
        self.handshaking = lambda: 0
        # With ha: this server's part among several (llmgw.process.ha); None: it leads alone.
        self.ha: Roles | None = None

    def startService(self):
        super().startService()
        fleet_config = self.catalog.config.fleet

        def fleet_factory(emit):
            return Fleet(
                self._reactor, emit,
                unreachable_after=fleet_config.unreachable_after_s,
                lost_after=fleet_config.lost_after_s,
            )

        self.session = ControlSession(ComponentConfig(realm=uris.REALM), fleet_factory, self.catalog, self._reactor)
        self.session.identity = self.identity
        if self.ha is not None:
            self.ha.attach(self.session)
        self._hub.attach_local(self.session)
        fleet = self.session.fleet
        fleet.handshaking = lambda: self.handshaking()
        self._hub.duplicate_listeners.append(lambda record: fleet.duplicate_refused(record.node_id, record.sentence))
        self.registry.register(FleetCollector(self.session.fleet, self._reactor, replicas=self.session.reconciler.views))
        self.registry.register(ScaleCollector(self.session.reconciler.elastic.scaler))
        failures = DownloadFailures(fleet)
        self.session.event_listeners.append(failures.observe)
        self.registry.register(failures)
        self.registry.register(WeightsCollector(fleet, lambda: {
            name: (model.source, model.files) for name, model in self.catalog.config.models.items()}))
        if self.router is not None:
            self.session.table_listeners.append(self.router.apply_table)
            # The server's own router reports its traffic in-process, as workers do over the hub.
            self.router.load_sink = lambda report: self.session.scaling.deliver(report, "server")
        self.session.reload_listeners.extend(self.reload_listeners)
        if self.journal is not None:
            attach_journal(self.session, self.journal)
            self.session.reconciler.elastic.set_note(self.journal.record)
        if self.series is not None:
            feed = SeriesFeed(self.series)
            self.session.extensions.append(feed)
            self.session.load_listeners.append(feed.load)
            self.session.event_listeners.append(feed.event)

    def tick(self):
        """Once a second: close the figures' bucket that ended, notice silent nodes, converge the fleet to the catalog."""
        if self.series is not None:
            self.series.advance(self._reactor.seconds())
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
