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
import re

import attrs

from llmgw.config.common import HOST_NAMES, KNOWN_ENGINES, SHA256, TLS
from llmgw.config.endpoints import (
    ServerEndpoint,
    check_link_listener,
    check_listener,
    parse_server_endpoint,
)
from yaml.nodes import MappingNode

from llmgw.config.schema import (
    NAME_STR,
    AbsPath,
    Bool,
    Enum,
    File,
    Int,
    ListOf,
    LocalPath,
    Loader,
    MapOf,
    Nullable,
    Number,
    Section,
    Str,
    Type,
    suggest,
)
from llmgw.config.yamlpos import is_null, read_document
from llmgw.tlsfiles import TLSFiles

# The llama.cpp build this release was checked against; nodes converge to it
# unless server.yaml names another.
DEFAULT_LLAMA_CPP_VERSION = "b11194"
SCORING_POLICIES = ("least-outstanding", "prefix-affinity", "engine-load")
MiB = 1024 * 1024


@attrs.frozen
class Listen:
    """Endpoint strings; ``None`` for ``api``/``admin`` means that listener is off."""

    link: str
    api: str | None = "tcp:8080:interface=127.0.0.1"
    admin: str | None = "tcp:9090:interface=127.0.0.1"

    @property
    def link_endpoint(self) -> ServerEndpoint:
        """``link`` in parts: the server builds its mutual-TLS listener from port and interface."""
        return parse_server_endpoint(self.link)


@attrs.frozen
class FleetSettings:
    """How long a silent node stays a member: unreachable first, then lost."""

    unreachable_after_s: float = 15.0
    lost_after_s: float = 120.0
    # After the control plane starts, it only listens this long before it
    # places anything: agents are coming back with engines still running, and
    # a slot that looks empty for a second must not be started twice.
    settle_s: float = 15.0
    # Then, while nodes are still arriving (one connected or registered within
    # settle_quiet_s), it waits on, up to settle_max_s from its start: ten
    # thousand agents take longer than settle_s to come back.  As long as an
    # agent's longest wait between tries (10 s), so a busy hub's pause
    # between arrivals is not taken for the end of the fleet.
    settle_quiet_s: float = 10.0
    settle_max_s: float = 300.0
    # A heartbeat is published to subscribers only when it changes what they
    # show, a live figure by more than node_figures_change of its whole, or
    # node_event_interval_s after the node's last event.
    node_event_interval_s: float = 30.0
    node_figures_change: float = 0.05
    # Downloads in progress one node may have shown at once.
    downloads_per_node: int = 64
    # Lines one node's refused claims may write to the server's log a window;
    # the rest are counted, then summed up in one line as the window ends.
    refusal_log_lines: int = 20
    refusal_log_window_s: float = 60.0


@attrs.frozen
class LinkSettings:
    """server.yaml's ``link:``: what the hub gives one connection, and how many it holds."""

    # From TCP connect to HELLO: TLS, the WebSocket opening handshake, then HELLO.
    hello_timeout_s: float = 10.0
    # A second session for a connected node: how long its first one has to answer a ping.
    liveness_timeout_s: float = 3.0
    # Link connections held at once (nodes, operators, routers); the API gets
    # what the open-files limit leaves after these.
    max_connections: int = 1024
    # Connections in their handshakes (TLS, WebSocket, HELLO) at once; while
    # this many are, the listener accepts no more and the rest wait their turn.
    max_handshakes: int = 64
    max_subscriptions_per_session: int = 256
    # How deep a message's lists and mappings may nest; llmgw's own are under 10.
    max_message_depth: int = 32


@attrs.frozen
class PKISettings:
    """server.yaml's ``pki:``: the cluster CA's directory when the server keeps ca.key, for onboarding.

    ``None``: the server signs nothing; nodes' requests are signed with
    ``llmgw pki sign`` where the CA lives.  A relative path is read from
    server.yaml's directory, as ``tls.*`` are.
    """

    ca_dir: str | None = None


def _check_base_url(text: str) -> None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
    except ValueError as e:
        raise ValueError(f"not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("write it as http://HOST/PATH/ or https://HOST/PATH/")
    if parts.query or parts.fragment:
        raise ValueError("a base URL has no ?query or #fragment; the asset's name is added after it")


def _check_asset_name(text: str) -> None:
    # The name becomes a path component of a URL and of a file on the node.
    if not text or "/" in text or "\\" in text or text in (".", "..") or text.startswith("."):
        raise ValueError("an asset is a file name such as llama-b6000-bin-ubuntu-x64.tar.gz, without / or a leading dot")


# One requirement, as pip takes it on its command line: a name, extras, and
# version clauses.  No options (a requirement may not smuggle --index-url),
# no URLs or paths: where packages come from is index_url's to say.
_REQUIREMENT = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
    r"(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"(?:\s*(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
    r"(?:\s*,\s*(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+)*)?"
)


def _check_requirement(text: str) -> None:
    if not _REQUIREMENT.fullmatch(text.strip()):
        raise ValueError(
            "give one requirement: a package name, optional [extras] and version clauses, "
            "such as 'vllm==0.11.0'; no options, URLs or paths (use index_url: for where it comes from)"
        )


@attrs.frozen
class Engine:
    """``engines.NAME`` in server.yaml: the build of one engine the fleet runs.

    llama.cpp: a release ``version`` (tag), fetched from ``base_url`` and
    checked against ``sha256`` (asset file name -> digest), which is merged
    over the table llmgw ships for the versions it was checked against.
    vLLM and SGLang: ``python`` (an environment the site provides) or ``pip``
    (a requirement each node installs into a venv of its own, from
    ``index_url`` when given); ``version`` is then what the package must
    report, when given.  ``llmgw.engines.releases`` turns one into the
    ``EngineBuild`` the nodes receive.
    """

    name: str
    version: str | None = None
    base_url: str | None = None
    sha256: dict[str, str] = attrs.Factory(dict)
    python: str | None = None
    pip: str | None = None
    index_url: str | None = None


def _default_engines() -> dict[str, Engine]:
    return {"llama.cpp": Engine("llama.cpp", DEFAULT_LLAMA_CPP_VERSION)}


@attrs.frozen
class Engines:
    """server.yaml's ``engines:`` section: the builds by engine name, and the OS-package policy.

    llama.cpp is always there: when server.yaml does not name it, the
    release this llmgw was checked against stands in (absent is not "none").
    """

    builds: dict[str, Engine] = attrs.Factory(_default_engines)
    # Let nodes install the OS packages an engine needs (apt-get / dnf) instead
    # of only naming them.  Off by default: it runs the node's package manager.
    install_os_packages: bool = False

    def get(self, name: str) -> Engine | None:
        return self.builds.get(name)


@attrs.frozen
class Profile:
    """How to run a model: which engine, its arguments, and what a node must offer."""

    name: str
    engine: str
    args: tuple[str, ...] = ()
    gpus: int = 0
    # None: no memory requirement stated (not "needs zero").
    min_memory_gb: float | None = None
    node_selector: dict[str, str] = attrs.Factory(dict)
    # Nodes one replica spans (vLLM/SGLang multi-node); 1 is a single node.
    ranks: int = 1
    # How those nodes' ranks meet: "native" (the engine's own launcher) or
    # "ray" (vLLM on a Ray cluster); None: native.
    launcher: str | None = None
    # Free memory each GPU given to a rank must have, in GB; None: not checked.
    min_gpu_free_gb: float | None = None


@attrs.frozen
class Model:
    """A model served under ``name``; ``source`` is a path on the nodes or a URL."""

    name: str
    profile: str
    source: str | None = None
    replicas: int = 1
    sha256: str | None = None
    # Room the weights need on a node that fetches them, in GB; None: not stated.
    disk_gb: float | None = None
    # Glob patterns of the files of a repository source (hf://ORG/REPO) to fetch; (): every file.
    files: tuple[str, ...] = ()


@attrs.frozen
class Admission:
    max_inflight_per_endpoint: int = 16
    queue: int = 256
    queue_timeout_s: float = 30.0


@attrs.frozen
class ClientLimits:
    """router.clients: how many API connections, and how long each may wait on its client."""

    # None: a quarter of the process's open-files limit, read when the router starts.
    max_connections: int | None = None
    idle_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    write_stall_timeout_s: float = 30.0


@attrs.frozen
class EngineLimits:
    """router.engines: how long the router waits on an engine, and how much of its /metrics it reads."""

    first_byte_timeout_s: float = 300.0
    between_bytes_timeout_s: float = 120.0
    metrics_max_bytes: int = 1 * MiB
    metrics_timeout_s: float = 2.0


@attrs.frozen
class APIKey:
    """A bearer token, stored only as its sha256; ``models`` None means every model."""

    name: str
    sha256: str
    models: tuple[str, ...] | None = None
    # None: no limit (not a limit of zero).
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@attrs.frozen
class StaticEndpoint:
    """An engine the router serves without a control plane: a model at a URL."""

    model: str
    url: str


def _check_engine_url(text: str) -> None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"not a URL ({e}); write it like 'http://10.0.0.5:8000'") from None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError("an engine URL is http://HOST:PORT (the router adds /v1/...)")


@attrs.frozen
class RouterSettings:
    """server.yaml's router: section (router.yaml's too): admission, scoring, keys, static engines."""

    admission: Admission = attrs.Factory(Admission)
    scoring: str = "least-outstanding"
    allow_anonymous: bool = False
    # The names a key-less API answers to (Host); None: localhost and the host name.  Any IP address may be asked.
    hosts: tuple[str, ...] | None = None
    max_body_bytes: int = 4 * MiB
    clients: ClientLimits = attrs.Factory(ClientLimits)
    engines: EngineLimits = attrs.Factory(EngineLimits)
    keys: tuple[APIKey, ...] = ()
    # Engines to serve without a control plane; the control plane's ready
    # replicas are added to these.
    endpoints: tuple[StaticEndpoint, ...] = ()


@attrs.frozen
class AdminKey:
    """An operator's key for the admin page from beyond ``admin.local``, stored only as its sha256."""

    name: str
    sha256: str


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
    local: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
    # The names a local peer may ask for (Host); None: localhost and the host name.  Any IP address may be asked.
    hosts: tuple[str, ...] | None = None
    keys: tuple[AdminKey, ...] = ()
    session_ttl_s: float = 8 * 3600.0
    max_sessions: int = 256
    log_lines: int = 500
    log_bytes: int = 256 * 1024
    max_rows: int = 500
    # The page under /admin on the API listener (read at start); there, admin.local is not trusted.
    on_api: bool = True
    # A peer's failed sign-ins: it waits login_backoff_s, doubling up to max_login_wait_s.
    login_backoff_s: float = 1.0
    max_login_wait_s: float = 300.0
    max_login_peers: int = 4096


@attrs.frozen
class ServerConfig:
    """The whole of server.yaml; ``path`` is the file it came from, absolute."""

    path: str
    listen: Listen
    tls: TLSFiles
    fleet: FleetSettings = attrs.Factory(FleetSettings)
    link: LinkSettings = attrs.Factory(LinkSettings)
    engines: Engines = attrs.Factory(Engines)
    profiles: dict[str, Profile] = attrs.Factory(dict)
    models: dict[str, Model] = attrs.Factory(dict)
    router: RouterSettings = attrs.Factory(RouterSettings)
    admin: AdminSettings = attrs.Factory(AdminSettings)
    pki: PKISettings = attrs.Factory(PKISettings)


_ENGINE_SECTION = Section(
    Engine,
    {
        "version": Str(what="a string (a release tag such as b6000, or a package version)"),
        "base_url": Str(what="an http:// or https:// URL (where the release assets are)", check=_check_base_url),
        "sha256": MapOf(SHA256, key=Str(what="an asset file name", check=_check_asset_name)),
        "python": AbsPath(),
        "pip": Str(what="one pip requirement such as 'vllm==0.11.0'", check=_check_requirement),
        "index_url": Str(what="an http:// or https:// URL (a package index)", check=_check_base_url),
    },
)
#: How the ranks of a multi-node replica meet (Profile.launcher).
LAUNCHERS = ("native", "ray")
_ENGINE_NAME = Enum(KNOWN_ENGINES, noun="engine")


@attrs.frozen
class EnginesType(Type):
    """``engines:``: a build per engine name, and ``install_os_packages``."""

    what = "a mapping of engine names to their builds, and install_os_packages"

    def convert(self, loader: Loader, node, path):
        if is_null(node):
            return Engines()
        if not isinstance(node, MappingNode):
            raise self.expected(loader, node, path)
        builds = _default_engines()
        install = False
        for key, key_node, value_node in loader.document.items(node, path):
            if key == "install_os_packages":
                install = loader.convert(Bool(), value_node, path + (key,))
                continue
            _ENGINE_NAME.convert(loader, key_node, path + (key,))
            engine = _ENGINE_SECTION.build(loader, value_node, path + (key,), name=key)
            if engine.name == "llama.cpp" and engine.version is None:
                engine = attrs.evolve(engine, version=DEFAULT_LLAMA_CPP_VERSION)
            builds[key] = engine
        return Engines(builds=builds, install_os_packages=install)


_LABEL_VALUE = Str(what="a string (a label value)")

ROUTER_FIELDS = {
    "admission": Section(
        Admission,
        {
            "max_inflight_per_endpoint": Int(min=1),
            "queue": Int(min=0),
            "queue_timeout_s": Number(min=0, exclusive=True),
        },
    ),
    "scoring": Enum(SCORING_POLICIES, noun="scoring policy"),
    "allow_anonymous": Bool(),
    "hosts": HOST_NAMES,
    "max_body_bytes": Int(min=1),
    "clients": Section(
        ClientLimits,
        {
            "max_connections": Nullable(Int(min=1)),
            "idle_timeout_s": Number(min=0, exclusive=True),
            "header_timeout_s": Number(min=0, exclusive=True),
            "body_timeout_s": Number(min=0, exclusive=True),
            "write_stall_timeout_s": Number(min=0, exclusive=True),
        },
    ),
    "engines": Section(
        EngineLimits,
        {
            "first_byte_timeout_s": Number(min=0, exclusive=True),
            "between_bytes_timeout_s": Number(min=0, exclusive=True),
            "metrics_max_bytes": Int(min=1024),
            "metrics_timeout_s": Number(min=0, exclusive=True),
        },
    ),
    "keys": ListOf(
        Section(
            APIKey,
            {
                "name": NAME_STR,
                "sha256": SHA256,
                "models": Nullable(ListOf(Str(what="the name of one of models:"))),
                "requests_per_minute": Nullable(Int(min=1)),
                "tokens_per_minute": Nullable(Int(min=1)),
            },
        )
    ),
    "endpoints": ListOf(
        Section(
            StaticEndpoint,
            {
                "model": NAME_STR,
                "url": Str(what="an engine URL like http://HOST:PORT", check=_check_engine_url),
            },
        )
    ),
}
ROUTER_SECTION = Section(RouterSettings, ROUTER_FIELDS)


def _check_files_pattern(text: str) -> None:
    """A model's ``files:`` pattern matches paths in a repository: nothing that could not be one."""
    if not text or len(text) > 1024 or re.search(r"[\x00-\x1f\x7f\\]", text) or text.startswith("/"):
        raise ValueError("a pattern is a path in the repository, 1 to 1024 characters, not starting with /, "
                         "without control characters or backslashes (config.json, *.safetensors, tokenizer/)")


SCHEMA = Section(
    ServerConfig,
    {
        "listen": Section(
            Listen,
            {
                "link": Str(what="an ssl: endpoint string", check=check_link_listener),
                "api": Nullable(Str(what="an endpoint string", check=check_listener)),
                "admin": Nullable(Str(what="an endpoint string", check=check_listener)),
            },
        ),
        # Only the hub reads a revocation list, so only server.yaml names one.
        "tls": Section(TLSFiles, {**TLS.keys, "crl": File()}),
        "fleet": Section(
            FleetSettings,
            {
                "unreachable_after_s": Number(min=0, exclusive=True),
                "lost_after_s": Number(min=0, exclusive=True),
                "settle_s": Number(min=0),
                "settle_quiet_s": Number(min=0),
                "settle_max_s": Number(min=0),
                "node_event_interval_s": Number(min=0),
                "node_figures_change": Number(min=0),
                "downloads_per_node": Int(min=1),
                "refusal_log_lines": Int(min=1),
                "refusal_log_window_s": Number(min=0, exclusive=True),
            },
        ),
        "link": Section(
            LinkSettings,
            {
                "hello_timeout_s": Number(min=0, exclusive=True),
                "liveness_timeout_s": Number(min=0, exclusive=True),
                "max_connections": Int(min=1),
                "max_handshakes": Int(min=1),
                "max_subscriptions_per_session": Int(min=1),
                "max_message_depth": Int(min=4),
            },
        ),
        "engines": EnginesType(),
        "profiles": MapOf(
            Section(
                Profile,
                {
                    "engine": Enum(KNOWN_ENGINES, noun="engine"),
                    "args": ListOf(Str(what="a string (one command-line argument)")),
                    "gpus": Int(min=0),
                    "min_memory_gb": Nullable(Number(min=0)),
                    "node_selector": MapOf(_LABEL_VALUE),
                    "ranks": Int(min=1),
                    "launcher": Nullable(Enum(LAUNCHERS, noun="launcher")),
                    "min_gpu_free_gb": Nullable(Number(min=0)),
                },
            )
        ),
        "models": MapOf(
            Section(
                Model,
                {
                    "source": Nullable(Str(what="a string (a path on the nodes or a URL)")),
                    "profile": Str(what="the name of one of profiles:"),
                    "replicas": Int(min=0),
                    "sha256": Nullable(SHA256),
                    "disk_gb": Nullable(Number(min=0)),
                    "files": ListOf(Str(what="a glob pattern of a repository's files (*.safetensors)",
                                        check=_check_files_pattern)),
                },
            )
        ),
        "router": ROUTER_SECTION,
        "admin": Section(
            AdminSettings,
            {
                "local": ListOf(Str(what="an address or network such as 127.0.0.1/32", check=_check_network)),
                "hosts": HOST_NAMES,
                "keys": ListOf(Section(AdminKey, {"name": NAME_STR, "sha256": SHA256})),
                "session_ttl_s": Number(min=0, exclusive=True),
                "max_sessions": Int(min=1),
                "log_lines": Int(min=1),
                "log_bytes": Int(min=1024),
                "max_rows": Int(min=1),
                "on_api": Bool(),
                "login_backoff_s": Number(min=0),
                "max_login_wait_s": Number(min=0),
                "max_login_peers": Int(min=1),
            },
        ),
        "pki": Section(PKISettings, {"ca_dir": Nullable(LocalPath())}),
    },
)



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
    return config


# Which keys of engines.NAME each engine takes.
_ENGINE_KEYS = {
    "llama.cpp": ("version", "base_url", "sha256"),
    "vllm": ("version", "python", "pip", "index_url"),
    "sglang": ("version", "python", "pip", "index_url"),
    "sim": (),
}


def _check_engines(loader: Loader, config: ServerConfig) -> None:
    """Keys that do not apply to an engine, a Python engine with no source, a release with no digests."""
    from llmgw.engines.releases import SHIPPED_SHA256, sha256_table

    for name, engine in config.engines.builds.items():
        here = ("engines", name)
        allowed = _ENGINE_KEYS[name]
        for key in ("version", "base_url", "sha256", "python", "pip", "index_url"):
            value = getattr(engine, key)
            if value in (None, {}) or key in allowed:
                continue
            path = here + (key,)
            raise loader.fail(
                loader.line(path), path,
                f"{name} takes no {key}:" + (f" it takes {', '.join(allowed)}" if allowed else " sim is llmgw's own and needs no build"),
            )
        if name in ("vllm", "sglang"):
            if (engine.python is None) == (engine.pip is None):
                raise loader.fail(
                    loader.line(here), here,
                    f"give {name} either python: (the interpreter of an environment the site provides) "
                    f"or pip: (a requirement each node installs into a venv of its own), not "
                    + ("both" if engine.python else "neither"),
                )
            if engine.index_url is not None and engine.pip is None:
                path = here + ("index_url",)
                raise loader.fail(loader.line(path), path, "index_url: is where pip: installs from; add pip:, or remove it")
        # The stand-in default (server.yaml names no llama.cpp) is not refused
        # here: its nodes say which asset lacks a digest when they need it.
        if name == "llama.cpp" and here in loader.lines and not sha256_table(engine):
            path = here + ("sha256",)
            shipped = ", ".join(sorted(SHIPPED_SHA256)) or "none"
            raise loader.fail(
                loader.line(path), path,
                f"llmgw has no sha256 for the assets of llama.cpp {engine.version} (it ships them for: {shipped}); "
                f"add sha256: {{ASSET: DIGEST}} under engines.llama.cpp with the digest of each asset your nodes "
                f"need (such as llama-{engine.version}-bin-ubuntu-x64.tar.gz), from the release page: "
                "nodes never install an engine they cannot check",
            )


def _check_references(loader: Loader, config: ServerConfig) -> None:
    """What no single value shows: order of timeouts, names that must exist elsewhere."""
    _check_engines(loader, config)
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
