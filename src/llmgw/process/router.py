"""`twistd llmgw-router`: the router alone, for when one process's CPU is the limit.

Run several behind a load balancer.  What the tree holds: the router and
its API listener; the admin listener; and, when router.yaml names a hub, a
session that joins it with a router certificate, asks the control plane
for the endpoint table and follows it as it changes.  With no hub it
serves ``router.endpoints`` from its file.

Both listeners answer by this process's names only, where a browser could
be tricked into asking (``llmgw.hostnames``): the API when it has no keys
(``router.hosts``), and the admin listener's ``/metrics``, which names the
API keys, always (``admin.hosts``).  router.yaml is read at start only, so
the 421 says to restart.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from twisted.application import service
from twisted.logger import Logger

from llmgw.admin.web import NoPage, TextAnswer, admin_listener
from llmgw.config.router import RouterProcessConfig, load_router_config
from llmgw.hostnames import HostNames
from llmgw.huburl import parse_hub_url
from llmgw.link.client import client_service
from llmgw.process.common import ProcessTree, compose, config_options
from llmgw.router.metrics import RouterMetrics
from llmgw.router.tablesession import TableSession
from llmgw.router.service import Router, check_open_api

log = Logger()

Options = config_options("/etc/llmgw/router.yaml", "The router's configuration file.")
RESTART = "restart llmgw-router"


class RouterAdminPage(NoPage):
    """The note at ``/`` of llmgw-router's admin listener, and the names it and ``/metrics`` answer for."""

    def __init__(self, names: HostNames):
        super().__init__()
        # llmgw.admin.web holds /metrics to what this says.
        self.misdirected = names.refusal

    def render(self, request):
        refusal = self.misdirected(request)
        if refusal is not None:
            return TextAnswer(refusal.code, refusal.words).render(request)
        return super().render(request)


def makeService(options) -> service.MultiService:
    return compose("llmgw-router", options, load_router_config, build)


def build(reactor, config: RouterProcessConfig) -> service.MultiService:
    top = ProcessTree("llmgw-router", config.path)
    check_open_api(config.router, config.listen.api, config.path)
    registry = CollectorRegistry()
    router = Router(reactor, config.router, config.listen.api, metrics=RouterMetrics(registry),
                    follows_table=config.hub is not None, config_file="router.yaml", then=RESTART)
    router.setServiceParent(top)
    top.must_listen("listen.api", router)
    if config.listen.admin:
        names = HostNames.from_setting(config.admin.hosts, file="router.yaml", listener="this router's admin listener",
                                       then=RESTART)
        admin = admin_listener(reactor, config.listen.admin, registry, RouterAdminPage(names))
        admin.setServiceParent(top)
        top.must_listen("listen.admin", admin)
    if config.hub is not None:
        tls = config.tls
        client_service(reactor, parse_hub_url(config.hub), tls, lambda cfg: TableSession(cfg, router)).setServiceParent(top)
    top.router = router
    log.info("llmgw router: OpenAI API on {api}{hub}", api=config.listen.api,
             hub=f", following {config.hub}" if config.hub else ", static endpoints")
    return top
