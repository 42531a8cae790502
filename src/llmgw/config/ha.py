"""server.yaml's ``ha:``: the etcd that several servers share to elect one leader, and how this server is named there.

Absent, nothing changes: no etcd is contacted and the server leads alone.
With it, ``llmgw.ha.election`` campaigns for ``/llmgw/leader`` under a lease
of ``lease_s`` seconds; a leader stops commanding ``fence_margin_s`` before
its lease could have lapsed (docs/configuration.rst, ``ha``).
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import attrs

from llmgw.config.common import HUB_URL, TLS
from llmgw.config.schema import NAME_STR, ListOf, Nullable, Str
from llmgw.setting import setting
from llmgw.tlsfiles import TLSFiles


def check_etcd_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("an etcd client URL starts with http:// or https://; write it like 'https://etcd1:2379'")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("its port is not a number from 1 to 65535") from None
    if not parts.hostname or port is None:
        raise ValueError("give the host and the client port, like 'https://etcd1:2379'")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError("give only scheme, host and port, like 'https://etcd1:2379'")
    return text.rstrip("/")


def check_api_url(text: str) -> None:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("write the API's URL as clients reach it, like 'https://gw1.example.com:8080'")


@attrs.frozen
class HASettings:
    """server.yaml's ``ha:``: the etcd members, the lease, and this server's name and URLs."""

    etcd: tuple[str, ...] = setting(kind=ListOf(Str(what="an etcd client URL like https://etcd1:2379",
                                                    check=check_etcd_url)))
    # The hub URL agents should dial to reach this server: wss://host:port/ of its listen.link.
    advertise: str = setting(kind=HUB_URL)
    tls: TLSFiles | None = setting(None, kind=Nullable(TLS))
    lease_s: int = setting(5, least=2)
    # null: the host name.  Each server of one etcd needs its own.
    name: str | None = setting(None, kind=Nullable(NAME_STR))
    api_advertise: str | None = setting(None, kind=Nullable(Str(what="an http(s) URL", check=check_api_url)))
    request_timeout_s: float = setting(2.0, above=0)
    fence_margin_s: float = setting(1.0, least=0)
    max_response_bytes: int = setting(4 * 1024 * 1024, least=65536)

    def server_name(self) -> str:
        """``name``, else this host's name."""
        return self.name or socket.gethostname()
