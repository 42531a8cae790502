"""server.yaml: the desired state of the fleet and how the server listens.

``load_server_config(path)`` returns a frozen ``ServerConfig`` or raises
``ConfigError`` naming the file, line and key path of the first problem.  It
checks everything that can be checked without touching the network: types,
ranges, names, that the TLS files exist, and that every reference (a model's
profile, a key's models) points at something that is defined.  A reload calls
it again and keeps the old catalog when it raises.
"""

from __future__ import annotations

import os

import attrs

from llmgw.config.catalog import Engines, EnginesType, Model, Profile, check_engines, resolve_scales
from llmgw.config.common import HOST_NAMES, SHA256, TLS
from llmgw.config.endpoints import ServerEndpoint, check_link_listener, check_listener, parse_server_endpoint
from llmgw.config.ha import HASettings
from llmgw.config.history import HistorySettings
from llmgw.config.routing import RouterSettings
from llmgw.config.schema import (
    NAME_STR,
    File,
    ListOf,
    LocalPath,
    Loader,
    MapOf,
    Nullable,
    Section,
    Str,
    section,
    suggest,
)
from llmgw.config.yamlpos import read_document
from llmgw.link.settings import LinkSettings
from llmgw.setting import setting
from llmgw.tlsfiles import TLSFiles


@attrs.frozen
class Listen:
    """Endpoint strings; ``None`` for ``api``/``admin`` means that listener is off."""

    link: str = setting(kind=Str(what="an ssl: endpoint string", check=check_link_listener))
    api: str | None = setting("tcp:8080:interface=127.0.0.1", kind=Nullable(Str(what="an endpoint string", check=check_listener)))
    admin: str | None = setting("tcp:9090:interface=127.0.0.1", kind=Nullable(Str(what="an endpoint string", check=check_listener)))

    @property
    def link_endpoint(self) -> ServerEndpoint:
        """``link`` in parts: the server builds its mutual-TLS listener from port and interface."""
        return parse_server_endpoint(self.link)


@attrs.frozen
class FleetSettings:
    """How long a silent node stays a member: unreachable first, then lost."""

    unreachable_after_s: float = setting(15.0, above=0)
    lost_after_s: float = setting(120.0, above=0)
    # After the control plane starts, it only listens this long before it
    # places anything: agents are coming back with engines still running, and
    # a slot that looks empty for a second must not be started twice.
    settle_s: float = setting(15.0, least=0)
    # Then, while nodes are still arriving (one connected or registered within
    # settle_quiet_s), it waits on, up to settle_max_s from its start: ten
    # thousand agents take longer than settle_s to come back.  As long as an
    # agent's longest wait between tries (10 s), so a busy hub's pause
    # between arrivals is not taken for the end of the fleet.
    settle_quiet_s: float = setting(10.0, least=0)
    settle_max_s: float = setting(300.0, least=0)
    # A heartbeat is published to subscribers only when it changes what they
    # show, a live figure by more than node_figures_change of its whole, or
    # node_event_interval_s after the node's last event.
    node_event_interval_s: float = setting(30.0, least=0)
    node_figures_change: float = setting(0.05, least=0)
    # Downloads in progress one node may have shown at once.
    downloads_per_node: int = setting(64, least=1)
    # Lines one node's refused claims may write to the server's log a window;
    # the rest are counted, then summed up in one line as the window ends.
    refusal_log_lines: int = setting(20, least=1)
    refusal_log_window_s: float = setting(60.0, above=0)


@attrs.frozen
class PKISettings:
    """server.yaml's ``pki:``: the cluster CA's directory when the server keeps ca.key, for onboarding.

    ``None``: the server signs nothing; nodes' requests are signed with
    ``llmgw pki sign`` where the CA lives.  A relative path is read from
    server.yaml's directory, as ``tls.*`` are.
    """

    ca_dir: str | None = setting(None, kind=Nullable(LocalPath()))


@attrs.frozen
class AdminKey:
    """An operator's key for the admin page from beyond ``admin.local``, stored only as its sha256."""

    name: str = setting(kind=NAME_STR)
    sha256: str = setting(kind=SHA256)


def _check_network(text: str) -> None:
    import ipaddress

    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError("not an address or network; write it like '127.0.0.1/32' or '10.0.0.0/8'") from None


@attrs.frozen
class AdminSettings:
    """server.yaml's admin: section: who the admin page trusts, and how much it asks a node for."""

    # Peers on these networks need no key; everyone else logs in with one of ``keys``.
    local: tuple[str, ...] = setting(
        ("127.0.0.1/32", "::1/128"),
        kind=ListOf(Str(what="an address or network such as 127.0.0.1/32", check=_check_network)),
    )
    # The names a local peer may ask for (Host); None: localhost and the host name.  Any IP address may be asked.
    hosts: tuple[str, ...] | None = setting(None, kind=HOST_NAMES)
    keys: tuple[AdminKey, ...] = setting((), kind=ListOf(section(AdminKey)))
    session_ttl_s: float = setting(8 * 3600.0, above=0)
    max_sessions: int = setting(256, least=1)
    log_lines: int = setting(500, least=1)
    log_bytes: int = setting(256 * 1024, least=1024)
    max_rows: int = setting(500, least=1)
    # The page under /admin on the API listener (read at start); there, admin.local is not trusted.
    on_api: bool = setting(True)
    # A peer's failed sign-ins: it waits login_backoff_s, doubling up to max_login_wait_s.
    login_backoff_s: float = setting(1.0, least=0)
    max_login_wait_s: float = setting(300.0, least=0)
    max_login_peers: int = setting(4096, least=1)


@attrs.frozen
class ServerConfig:
    """The whole of server.yaml; ``path`` is the file it came from, absolute."""

    path: str
    listen: Listen = setting()
    # Only the hub reads a revocation list, so only server.yaml names one.
    tls: TLSFiles = setting(kind=Section(TLSFiles, {**TLS.keys, "crl": File()}))
    fleet: FleetSettings = setting(factory=FleetSettings)
    link: LinkSettings = setting(factory=LinkSettings)
    engines: Engines = setting(factory=Engines, kind=EnginesType())
    profiles: dict[str, Profile] = setting(factory=dict, kind=MapOf(section(Profile)))
    models: dict[str, Model] = setting(factory=dict, kind=MapOf(section(Model)))
    router: RouterSettings = setting(factory=RouterSettings)
    admin: AdminSettings = setting(factory=AdminSettings)
    pki: PKISettings = setting(factory=PKISettings)
    history: HistorySettings = setting(factory=HistorySettings)
    # Several servers on one etcd, one leading (llmgw.ha); null: this server leads alone, no etcd.
    ha: HASettings | None = setting(None)


SCHEMA = section(ServerConfig)


def load_server_config(path: str | os.PathLike[str]) -> ServerConfig:
    """Read server.yaml at *path*; raise ``ConfigError`` naming file, line and key."""
    document = read_document(path)
    loader = Loader(document)
    if document.root is None:
        raise document.origin.error(
            1,
            (),
            "the file is empty; it needs at least listen: and tls: (see docs/configuration.rst)",
        )
    config = SCHEMA.build(loader, document.root, (), path=os.path.abspath(os.fspath(path)))
    _check_references(loader, config)
    return attrs.evolve(config, models=resolve_scales(loader, config.models, config.profiles))


def _check_references(loader: Loader, config: ServerConfig) -> None:
    """What no single value shows: order of timeouts, names that must exist elsewhere."""
    check_engines(loader, config.engines)
    fleet = config.fleet
    if fleet.lost_after_s <= fleet.unreachable_after_s:
        path = ("fleet", "lost_after_s")
        raise loader.fail(
            loader.line(path),
            path,
            f"must be more than fleet.unreachable_after_s ({fleet.unreachable_after_s:g}); "
            "a node is unreachable before it is lost",
        )
    for model in config.models.values():
        if model.profile not in config.profiles:
            path = ("models", model.name, "profile")
            known = ", ".join(config.profiles) or "none are defined"
            raise loader.fail(
                loader.line(path),
                path,
                f"no profile named {model.profile!r}; "
                f"{suggest(model.profile, list(config.profiles))}"
                f"define it under profiles: (profiles: {known})",
            )
        engine = config.profiles[model.profile].engine
        if model.source is None and engine != "sim":
            path = ("models", model.name, "source")
            raise loader.fail(
                loader.line(path),
                path,
                f"required for a {engine} model; give the weights' path on the nodes or a URL "
                "(only sim models run without weights)",
            )
    if config.ha is not None:
        _check_ha(loader, config.ha)
    names: dict[str, int] = {}
    hashes: dict[str, int] = {}
    for i, key in enumerate(config.router.keys):
        here = ("router", "keys", i)
        if key.name in names:
            raise loader.fail(
                loader.line(here + ("name",)),
                here + ("name",),
                f"{key.name!r} is already the name of router.keys[{names[key.name]}]; "
                "give each key its own name",
            )
        if key.sha256 in hashes:
            raise loader.fail(
                loader.line(here + ("sha256",)),
                here + ("sha256",),
                f"the same hash as router.keys[{hashes[key.sha256]}]; "
                "two keys with one token cannot be told apart, issue a new token",
            )
        names[key.name] = hashes[key.sha256] = i
        for j, model in enumerate(key.models or ()):
            if model not in config.models:
                path = here + ("models", j)
                raise loader.fail(
                    loader.line(path),
                    path,
                    f"no model named {model!r}; {suggest(model, list(config.models))}"
                    "name one of models: or remove it",
                )


def _check_ha(loader: Loader, ha: HASettings) -> None:
    """The lease's parts fit in it; tls: and the etcd URLs' schemes agree."""
    if ha.fence_margin_s >= ha.lease_s:
        path = ("ha", "fence_margin_s")
        raise loader.fail(loader.line(path), path,
                          f"must be less than ha.lease_s ({ha.lease_s}); a leader stops commanding this long "
                          "before its lease could lapse")
    if ha.request_timeout_s >= ha.lease_s - ha.fence_margin_s:
        path = ("ha", "request_timeout_s")
        raise loader.fail(loader.line(path), path,
                          f"must be less than ha.lease_s less ha.fence_margin_s "
                          f"({ha.lease_s - ha.fence_margin_s:g}); a renewal must be able to end before the "
                          "leader's deadline")
    plain = [url for url in ha.etcd if url.startswith("http://")]
    if ha.tls is not None and plain:
        path = ("ha", "etcd")
        raise loader.fail(loader.line(path), path,
                          f"{plain[0]} is plain http but ha.tls is given; write https:// for every member")
