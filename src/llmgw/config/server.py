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

from llmgw.config.common import KNOWN_ENGINES, SHA256, TLS
from llmgw.config.endpoints import (
    ServerEndpoint,
    check_link_listener,
    check_listener,
    parse_server_endpoint,
)
from llmgw.config.schema import (
    NAME_STR,
    Bool,
    Enum,
    Int,
    ListOf,
    Loader,
    MapOf,
    Nullable,
    Number,
    Section,
    Str,
    suggest,
)
from llmgw.config.yamlpos import read_document
from llmgw.tlsfiles import TLSFiles

# The llama.cpp build this release was checked against; nodes converge to it
# unless server.yaml names another.
DEFAULT_LLAMA_CPP_VERSION = "b6000"
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


@attrs.frozen
class Engine:
    name: str
    version: str


def _default_engines() -> dict[str, Engine]:
    return {"llama.cpp": Engine("llama.cpp", DEFAULT_LLAMA_CPP_VERSION)}


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


@attrs.frozen
class Admission:
    max_inflight_per_endpoint: int = 16
    queue: int = 256
    queue_timeout_s: float = 30.0


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
    max_body_bytes: int = 4 * MiB
    keys: tuple[APIKey, ...] = ()
    # Engines to serve without a control plane; the control plane's ready
    # replicas are added to these.
    endpoints: tuple[StaticEndpoint, ...] = ()


@attrs.frozen
class ServerConfig:
    """The whole of server.yaml; ``path`` is the file it came from, absolute."""

    path: str
    listen: Listen
    tls: TLSFiles
    fleet: FleetSettings = attrs.Factory(FleetSettings)
    engines: dict[str, Engine] = attrs.Factory(_default_engines)
    profiles: dict[str, Profile] = attrs.Factory(dict)
    models: dict[str, Model] = attrs.Factory(dict)
    router: RouterSettings = attrs.Factory(RouterSettings)


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
    "max_body_bytes": Int(min=1),
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
        "tls": TLS,
        "fleet": Section(
            FleetSettings,
            {
                "unreachable_after_s": Number(min=0, exclusive=True),
                "lost_after_s": Number(min=0, exclusive=True),
                "settle_s": Number(min=0),
            },
        ),
        "engines": MapOf(
            Section(Engine, {"version": Str(what="a string (the engine's version)")}),
            key=Enum(KNOWN_ENGINES, noun="engine"),
        ),
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
                },
            )
        ),
        "router": ROUTER_SECTION,
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


def _check_references(loader: Loader, config: ServerConfig) -> None:
    """What no single value shows: order of timeouts, names that must exist elsewhere."""
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
