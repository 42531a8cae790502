"""The ``router:`` section of server.yaml and router.yaml: admission, scoring, limits, keys, static engines.

Each key is declared once, on its field (``llmgw.setting``); ``ROUTER_SECTION``
is read from them, and both files use it.
"""

from __future__ import annotations

import attrs

from llmgw.config.common import HOST_NAMES, SHA256
from llmgw.config.schema import NAME_STR, Enum, ListOf, Nullable, Str, section
from llmgw.setting import setting

SCORING_POLICIES = ("least-outstanding", "prefix-affinity", "engine-load")
# router.keys[].priority, highest first (llmgw.router.fairqueue.BANDS reads them).
KEY_PRIORITIES = ("interactive", "batch")
MiB = 1024 * 1024


@attrs.frozen
class Admission:
    max_inflight_per_endpoint: int = setting(16, least=1)
    queue: int = setting(256, least=0)
    queue_timeout_s: float = setting(30.0, above=0)


@attrs.frozen
class ClientLimits:
    """router.clients: how many API connections, and how long each may wait on its client."""

    # None: a quarter of the process's open-files limit, read when the router starts.
    max_connections: int | None = setting(None, least=1)
    idle_timeout_s: float = setting(60.0, above=0)
    header_timeout_s: float = setting(10.0, above=0)
    body_timeout_s: float = setting(60.0, above=0)
    write_stall_timeout_s: float = setting(30.0, above=0)


def check_origin(text: str) -> str:
    """A web origin a browser names in ``Origin`` (``scheme://host[:port]``, lower case), or ``*``."""
    from urllib.parse import urlsplit

    if text == "*":
        return text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path
            or parts.query or parts.fragment or parts.username is not None or parts.password is not None):
        raise ValueError("not an origin; write it as a browser sends it, like 'https://app.example.com' or "
                         "'http://localhost:5173' (scheme, host, port; no path, no trailing slash), or '*'")
    host = parts.hostname if ":" not in parts.hostname else "[%s]" % parts.hostname
    default = 443 if parts.scheme == "https" else 80
    return "%s://%s%s" % (parts.scheme, host, "" if port is None or port == default else ":%d" % port)


@attrs.frozen
class CorsSettings:
    """router.cors: which other sites' pages may call the API from a browser (none unless listed)."""

    # "*": any origin; [] (the default): none, as before.
    allow_origins: tuple[str, ...] = setting((), kind=ListOf(Str(what="an origin such as https://app.example.com",
                                                                 check=check_origin)))
    max_age_s: int = setting(600, least=0)


@attrs.frozen
class EngineLimits:
    """router.engines: how long the router waits on an engine, and how much of its /metrics it reads."""

    first_byte_timeout_s: float = setting(300.0, above=0)
    between_bytes_timeout_s: float = setting(120.0, above=0)
    metrics_max_bytes: int = setting(1 * MiB, least=1024)
    metrics_timeout_s: float = setting(2.0, above=0)


@attrs.frozen
class Continuation:
    """router.continuation: an answer whose engine fails mid-stream goes on on another replica (llmgw.router.continuing)."""

    # How many times one answer is continued; 0: never (the stream ends with an error event, as before).
    max_attempts: int = setting(1, least=0)


@attrs.frozen
class APIKey:
    """A bearer token, stored only as its sha256; ``models`` None means every model."""

    name: str = setting(kind=NAME_STR)
    sha256: str = setting(kind=SHA256)
    models: tuple[str, ...] | None = setting(None, kind=Nullable(ListOf(Str(what="the name of one of models:"))))
    # None: no limit (not a limit of zero).
    requests_per_minute: int | None = setting(None, least=1)
    tokens_per_minute: int | None = setting(None, least=1)
    # Whose requests get a model's free slots first: every interactive key's before any batch key's.
    priority: str = setting("interactive", kind=Enum(KEY_PRIORITIES, noun="priority"))
    # Slots of one model the key may hold at once; None: as many as its fair share leaves it.
    max_inflight: int | None = setting(None, least=1)


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
class StaticEndpoint:
    """An engine the router serves without a control plane: a model at a URL."""

    model: str = setting(kind=NAME_STR)
    url: str = setting(kind=Str(what="an engine URL like http://HOST:PORT", check=_check_engine_url))


@attrs.frozen
class RouterSettings:
    """server.yaml's router: section (router.yaml's too): admission, scoring, keys, static engines."""

    admission: Admission = setting(factory=Admission)
    scoring: str = setting("least-outstanding", kind=Enum(SCORING_POLICIES, noun="scoring policy"))
    allow_anonymous: bool = setting(False)
    # The names a key-less API answers to (Host); None: localhost and the host name.  Any IP address may be asked.
    hosts: tuple[str, ...] | None = setting(None, kind=HOST_NAMES)
    max_body_bytes: int = setting(4 * MiB, least=1)
    clients: ClientLimits = setting(factory=ClientLimits)
    engines: EngineLimits = setting(factory=EngineLimits)
    continuation: Continuation = setting(factory=Continuation)
    cors: CorsSettings = setting(factory=CorsSettings)
    keys: tuple[APIKey, ...] = setting((), kind=ListOf(section(APIKey)))
    # A stream unread this long while another request waits for its model's slot is cut; None: only
    # clients.write_stall_timeout_s cuts it.
    client_stall_s: float | None = setting(10.0, above=0)
    # Engines to serve without a control plane; the control plane's ready
    # replicas are added to these.
    endpoints: tuple[StaticEndpoint, ...] = setting((), kind=ListOf(section(StaticEndpoint)))


ROUTER_SECTION = section(RouterSettings)
