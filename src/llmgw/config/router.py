"""router.yaml: a router process on its own (`twistd llmgw-router`).

Two ways to know the engines, and both may be used: join the hub with a
router certificate (``hub`` and ``tls``) and receive the control plane's
endpoint table as it changes, or list them under ``router.endpoints`` and
run with no control plane at all.
"""

from __future__ import annotations

import os

import attrs

from llmgw.config.common import HOST_NAMES, HUB_URL, TLS
from llmgw.config.endpoints import check_listener
from llmgw.config.schema import Loader, Nullable, Section, Str
from llmgw.config.server import ROUTER_SECTION, RouterSettings
from llmgw.config.yamlpos import read_document
from llmgw.tlsfiles import TLSFiles


@attrs.frozen
class RouterListen:
    api: str = "tcp:8080:interface=127.0.0.1"
    admin: str | None = "tcp:9091:interface=127.0.0.1"


@attrs.frozen
class RouterAdminSettings:
    """router.yaml's admin: section: the names ``listen.admin`` answers ``/metrics`` for (``llmgw.hostnames``)."""

    # None: localhost and the host name.  Any IP address may be asked.
    hosts: tuple[str, ...] | None = None


@attrs.frozen
class RouterProcessConfig:
    path: str
    listen: RouterListen = attrs.Factory(RouterListen)
    hub: str | None = None
    tls: TLSFiles | None = None
    router: RouterSettings = attrs.Factory(RouterSettings)
    admin: RouterAdminSettings = attrs.Factory(RouterAdminSettings)


SCHEMA = Section(
    RouterProcessConfig,
    {
        "listen": Section(
            RouterListen,
            {
                "api": Str(what="an endpoint string", check=check_listener),
                "admin": Nullable(Str(what="an endpoint string", check=check_listener)),
            },
        ),
        "hub": Nullable(HUB_URL),
        "tls": Nullable(TLS),
        "router": ROUTER_SECTION,
        "admin": Section(RouterAdminSettings, {"hosts": HOST_NAMES}),
    },
)


def load_router_config(path: str | os.PathLike[str]) -> RouterProcessConfig:
    """Read router.yaml at *path*; raise ``ConfigError`` naming file, line and key."""
    document = read_document(path)
    loader = Loader(document)
    if document.root is None:
        raise document.origin.error(
            1, (), "the file is empty; it needs hub: and tls:, or router.endpoints (see docs/configuration.rst)"
        )
    config = SCHEMA.build(loader, document.root, (), path=os.path.abspath(os.fspath(path)))
    if config.hub is not None and config.tls is None:
        raise loader.fail(loader.line(("hub",)), ("hub",),
                          "joining the hub needs tls: {ca, cert, key} with a router certificate")
    if config.hub is None and not config.router.endpoints:
        raise document.origin.error(
            1, (), "the router knows no engines: give hub: and tls: to follow the control plane, "
            "or list router.endpoints"
        )
    return config
