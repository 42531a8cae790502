"""The router as a service: its listener, its endpoint table, and where the table comes from.

The same pieces serve the router inside ``llmgw-server`` (fed the table by
the control plane in process) and ``twistd llmgw-router`` (fed it over the
hub, or from ``router.endpoints`` with no control plane at all).
"""

from __future__ import annotations

import os
import resource
import socket
from typing import Callable, Iterable

from twisted.application import internet, service
from twisted.internet import defer, endpoints, threads
from twisted.logger import Logger

from llmgw.config.endpoints import parse_server_endpoint
from llmgw.config.routing import RouterSettings
from llmgw.errors import ConfigError
from llmgw.hostnames import HostNames
from llmgw.router.dispatch import Dispatcher
from llmgw.router.door import Door
from llmgw.router.enginemetrics import EnginePoller, fetch_metrics, parse_engine_metrics
from llmgw.router.loadreport import LoadReporter
from llmgw.router.scoring import ENGINE_LOAD_POLICY
from llmgw.traffic import RouterLoad
from llmgw.views import EndpointEntry, EndpointTable

log = Logger()

LOOPBACK = ("127.0.0.1", "::1", "localhost")

#: Why a model is 503, not 404, before the router has the control plane's first table.
NO_TABLE_YET = "no endpoint table from the control plane yet"
#: Why a model a reload just added is 503 until the control plane's next table names it.
NEW_IN_CATALOG = "it is new in the catalog; the control plane has not placed it yet"


def check_open_api(config: RouterSettings, listen_api: str, where: str) -> None:
    """An API without keys is served only on loopback, or when allow_anonymous says so.

    Either way it answers only requests for its own names (``router.hosts``,
    or an IP address: ``llmgw.router.door``), which the log line says.
    """
    if config.keys:
        return
    interface = parse_server_endpoint(listen_api).interface
    loopback = interface is not None and (interface in LOOPBACK or interface.startswith("127."))
    names = ", ".join(HostNames.from_setting(config.hosts).names) or "none"
    if loopback:
        log.warn("the OpenAI API on {api} has no keys: anyone on this machine may use it, by an IP address or "
                 "one of router.hosts ({names})", api=listen_api, names=names)
    elif config.allow_anonymous:
        log.warn("the OpenAI API on {api} has no keys and router.allow_anonymous is true: anyone who can "
                 "reach it may use it, by an IP address or one of router.hosts ({names})", api=listen_api,
                 names=names)
    else:
        raise ConfigError(
            f"{where}: router.keys is empty and listen.api ({listen_api}) is not on a loopback interface: "
            "add router.keys, listen on 127.0.0.1, or set router.allow_anonymous: true"
        )


def max_connections(config: RouterSettings) -> int:
    """``router.clients.max_connections``, or a quarter of the open-files limit now when it is null.

    A quarter, because an API connection can hold a second descriptor to its
    engine and the hub's agent links, engines' idle connections and the
    files being written need the rest.
    """
    if config.clients.max_connections is not None:
        return config.clients.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft // 4)


class Router(service.MultiService):
    """Dispatcher, engine-load poller and API listener, with the table kept current.

    A router that *follows_table* has none until the control plane's first
    arrives, and until then answers 503 ``NO_TABLE_YET``, not 404: clients
    retry a 503.  One that knows the catalog's model names
    (``expect_models``, the server's own) says that for those names only, and
    404 for a model the catalog does not name.

    Its traffic goes to ``load_sink`` every second (``loadreport.py``) as
    *router_id*'s: "server" for the server's own, host and pid for a worker.
    """

    def __init__(self, reactor, config: RouterSettings, listen_api: str, metrics=None, *, follows_table: bool = False,
                 config_file: str = "server.yaml", then: str = "reload", router_id: str | None = None):
        super().__init__()
        # Where router.hosts is, and what makes a change to it count: for the words of a 421.
        self._hosts_in = (config_file, then)
        self._reactor = reactor
        self.config = config
        self.metrics = metrics
        self.dispatcher = Dispatcher(reactor, config, metrics=metrics)
        self.router_id = router_id or f"{socket.gethostname()}:{os.getpid()}"
        self.reporter = LoadReporter(reactor, self.dispatcher, getattr(metrics, "counted", None), self.router_id)
        self.dispatcher.cold.first_held = self.reporter.urgent
        self._table: EndpointTable | None = None if follows_table else EndpointTable()
        self._catalog: frozenset[str] | None = None
        self._agent = None
        self._poller = EnginePoller(reactor, self._fetch_metrics, timeout_s=config.engines.metrics_timeout_s,
                                    parse=self._parse_metrics)
        from llmgw.router.server import RouterFactory

        factory = RouterFactory(self.dispatcher, reactor, max_body_bytes=config.max_body_bytes, metrics=metrics,
                                first_byte_timeout_s=config.engines.first_byte_timeout_s,
                                between_bytes_timeout_s=config.engines.between_bytes_timeout_s,
                                clients=config.clients, max_connections=max_connections(config))
        factory.door = Door.for_config(config, reactor, *self._hosts_in)
        factory.continuation = config.continuation
        self._factory = factory
        # (endpoint, model) pairs the last scrape reported, so one gone from the table loses its series.
        self._reported: set[tuple[str, str]] = set()
        if metrics is not None:
            metrics.refresh_with(self._report_endpoints)
        internet.StreamServerEndpointService(
            endpoints.serverFromString(reactor, listen_api), factory
        ).setServiceParent(self)
        self._apply()

    @property
    def load_sink(self) -> Callable[[RouterLoad], None] | None:
        """Who takes this router's load reports (``llmgw.traffic.RouterLoad``); None: none are made."""
        return self.reporter.sink

    @load_sink.setter
    def load_sink(self, sink: Callable[[RouterLoad], None] | None) -> None:
        self.reporter.sink = sink

    def startService(self):
        super().startService()
        self._poll_if_needed()
        self.reporter.start()

    def _poll_if_needed(self) -> None:
        """Engines' /metrics are read only while the scoring policy uses them."""
        self._poller.timeout_s = self.config.engines.metrics_timeout_s
        wanted = self.running and self.config.scoring == ENGINE_LOAD_POLICY
        if wanted and not self._poller.running:
            self._poller.start(lambda: self.dispatcher.endpoints())
        elif not wanted and self._poller.running:
            self._poller.stop()

    def stopService(self):
        self.reporter.stop()
        self._poller.stop()
        self._factory.close()  # the idle engine connections
        return super().stopService()

    def reconfigure(self, config: RouterSettings) -> None:
        """A reloaded router: section (keys, hosts, admission, static endpoints)."""
        self.config = config
        self.dispatcher.reconfigure(config)
        factory = self._factory
        factory.max_body_bytes = config.max_body_bytes
        factory.first_byte_timeout_s = config.engines.first_byte_timeout_s
        factory.between_bytes_timeout_s = config.engines.between_bytes_timeout_s
        factory.clients = config.clients
        factory.max_connections = max_connections(config)
        factory.door = Door.for_config(config, self._reactor, *self._hosts_in)
        factory.continuation = config.continuation
        self._poll_if_needed()
        self._apply()

    def apply_table(self, table: EndpointTable) -> None:
        """The control plane's table: ready replicas, and why other models have none."""
        self._table = table
        self._apply()

    def expect_models(self, names: Iterable[str]) -> None:
        """The catalog's model names (server.yaml's, at start and on reload): 503 until served, never 404."""
        self._catalog = frozenset(names)
        self._apply()

    def _apply(self) -> None:
        table = self._table if self._table is not None else EndpointTable()
        entries = list(table.endpoints)
        entries += [EndpointEntry(f"static:{e.model}:{e.url}", e.model, e.url) for e in self.config.endpoints]
        served = {s.model for s in entries}
        unavailable = {m: why for m, why in table.unavailable.items() if m not in served}
        if self._catalog is not None:
            # The table lags a reload by a tick: the catalog read now decides what is a model here.
            unavailable = {m: why for m, why in unavailable.items() if m in self._catalog}
            waiting = NO_TABLE_YET if self._table is None else NEW_IN_CATALOG
            unavailable.update({m: waiting for m in sorted(self._catalog - served - unavailable.keys())})
        elastic = {m: c for m, c in table.elastic.items() if self._catalog is None or m in self._catalog}
        self._factory.no_continuation = frozenset(table.no_continuation)
        if self.metrics is not None:
            self.metrics.set_models(served | unavailable.keys() | elastic.keys() | (self._catalog or frozenset()))
        before = {e.id for e in self.dispatcher.endpoints()}
        try:
            self.dispatcher.set_endpoints(entries, unavailable, elastic)
            if before - {e.id for e in entries}:
                # A replica left the table (drained, scaled down): say at once what is still on it, so
                # the control plane stops it as soon as nothing is, not a report interval later.
                self.reporter.urgent("")
        except ValueError as e:
            log.error("endpoint table refused, the previous one stays: {e}", e=str(e))
        self.dispatcher.set_pending(NO_TABLE_YET if self._table is None and self._catalog is None else None)

    def _report_endpoints(self) -> None:
        """As a scrape begins: each endpoint's health, load and pooled connections, read from the table itself.

        Read when asked rather than pushed on every request: the figures are
        exact at the scrape and cost the request path nothing.
        """
        metrics, pool = self.metrics, self._factory.pool
        reported = set()
        for e in self.dispatcher.endpoints():
            reported.add((e.id, e.model))
            metrics.endpoint_state(e.id, e.model, e.healthy, e.inflight, e.engine_running, e.engine_waiting, e.kv_usage)
            idle = pool.idle(e.host, e.port)
            metrics.pool_connections(e.id, idle, max(0, pool.open(e.host, e.port) - idle))
        for ident, model in sorted(self._reported - reported):
            metrics.endpoint_removed(ident, model)
        self._reported = reported

    def _parse_metrics(self, page: bytes) -> defer.Deferred:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), parse_engine_metrics, page)

    def _fetch_metrics(self, url: str) -> defer.Deferred:
        """GET an engine's /metrics (the poller gives the whole URL), at most metrics_max_bytes of it."""
        if self._agent is None:
            from twisted.web.client import Agent

            from llmgw.webclient import connection_pool

            pool = connection_pool(self._reactor, persistent=True)
            pool.retryAutomatically = False
            self._agent = Agent(self._reactor, connectTimeout=2, pool=pool)
        return fetch_metrics(self._agent, url, self.config.engines.metrics_max_bytes)
