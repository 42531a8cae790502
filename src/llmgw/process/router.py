"""`twistd llmgw-router`: the router alone, for when one process's CPU is the limit.

Run several behind a load balancer.  What the tree holds: the router and
its API listener; the admin listener; and, when router.yaml names a hub, a
session that joins it with a router certificate, asks the control plane
for the endpoint table and follows it as it changes.  With no hub it
serves ``router.endpoints`` from its file.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from twisted.application import service
from twisted.logger import Logger

from llmgw.admin.web import admin_listener
from llmgw.config.router import RouterProcessConfig, load_router_config
from llmgw.huburl import parse_hub_url
from llmgw.link.client import client_service
from llmgw.process.common import ProcessTree, compose, config_options
from llmgw.router.metrics import RouterMetrics
from llmgw.router.tablesession import TableSession
from llmgw.router.service import Router, check_open_api

log = Logger()

Options = config_options("/etc/llmgw/router.yaml", "The router's configuration file.")


def makeService(options) -> service.MultiService:
    return compose("llmgw-router", options, load_router_config, build)


def build(reactor, config: RouterProcessConfig) -> service.MultiService:
    top = ProcessTree("llmgw-router", config.path)
    check_open_api(config.router, config.listen.api, config.path)
    registry = CollectorRegistry()
    router = Router(reactor, config.router, config.listen.api, metrics=RouterMetrics(registry),
                    follows_table=config.hub is not None)
    router.setServiceParent(top)
    top.must_listen("listen.api", router)
    if config.listen.admin:
        admin = admin_listener(reactor, config.listen.admin, registry)
        admin.setServiceParent(top)
        top.must_listen("listen.admin", admin)
    if config.hub is not None:
        tls = config.tls
        client_service(reactor, parse_hub_url(config.hub), tls, lambda cfg: TableSession(cfg, router)).setServiceParent(top)
    top.router = router
    log.info("llmgw router: OpenAI API on {api}{hub}", api=config.listen.api,
             hub=f", following {config.hub}" if config.hub else ", static endpoints")
    return top
