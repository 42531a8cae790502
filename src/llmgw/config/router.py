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
from llmgw.config.routing import RouterSettings
from llmgw.config.schema import Loader, Nullable, Str, section
from llmgw.config.yamlpos import read_document
from llmgw.setting import setting
from llmgw.tlsfiles import TLSFiles

_ENDPOINT = Str(what="an endpoint string", check=check_listener)


@attrs.frozen
class RouterListen:
    api: str = setting("tcp:8080:interface=127.0.0.1", kind=_ENDPOINT)
    admin: str | None = setting("tcp:9091:interface=127.0.0.1", kind=Nullable(_ENDPOINT))


@attrs.frozen
class RouterAdminSettings:
    """router.yaml's admin: section: the names ``listen.admin`` answers ``/metrics`` for (``llmgw.hostnames``)."""

    # None: localhost and the host name.  Any IP address may be asked.
    hosts: tuple[str, ...] | None = setting(None, kind=HOST_NAMES)


@attrs.frozen
class RouterProcessConfig:
    path: str
    listen: RouterListen = setting(factory=RouterListen)
    hub: str | None = setting(None, kind=Nullable(HUB_URL))
    tls: TLSFiles | None = setting(None, kind=Nullable(TLS))
    router: RouterSettings = setting(factory=RouterSettings)
    admin: RouterAdminSettings = setting(factory=RouterAdminSettings)


SCHEMA = section(RouterProcessConfig)


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
