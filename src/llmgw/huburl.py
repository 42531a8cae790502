"""Where the hub is: a URL like ``wss://cp.example.org:7443/``, and the host and port in it.

agent.yaml, router.yaml, ctl.yaml, ``--hub`` and ``LLMGW_HUB`` write it;
the link dials it.  One parser serves both, so a URL the configuration
accepts is one the link can dial.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import attrs


@attrs.frozen
class HubAddress:
    """A hub URL as written, and the host and port it names."""

    url: str
    host: str
    port: int


def parse_hub_url(text: str) -> HubAddress:
    """The :class:`HubAddress` of a hub URL like ``wss://cp.example.org:7443/``.

    Raises ``ValueError`` saying what to change.  The port is required: the hub
    listens where server.yaml's ``listen.link`` says, which is rarely 443.
    """
    # urlsplit's own words ("Port could not be cast to integer value") are Python's, not the reader's.
    try:
        parts = urlsplit(text)
    except ValueError:
        raise ValueError("not a URL: a '[' opens an IPv6 address that no ']' closes; "
                         "write it like 'wss://[fd00::5]:7443/'") from None
    try:
        port = parts.port
    except ValueError:
        raise ValueError("not a URL: its port is not a number from 1 to 65535; "
                         "write it like 'wss://cp.example.org:7443/'") from None
    if parts.scheme != "wss":
        plain = " (the link is always TLS)" if parts.scheme in ("ws", "http", "https") else ""
        raise ValueError(
            f"the hub URL must start with wss://{plain}; write it like 'wss://cp.example.org:7443/'"
        )
    if not parts.hostname:
        raise ValueError("the hub URL has no host; write it like 'wss://cp.example.org:7443/'")
    if parts.username is not None or parts.password is not None:
        raise ValueError("remove the user name: the hub knows clients by their certificate")
    if parts.query or parts.fragment:
        raise ValueError("remove the '?...' or '#...' part; the hub URL is wss://HOST:PORT/")
    if port is None:
        raise ValueError(
            "the hub URL has no port; add the port of server.yaml's listen.link, "
            "like 'wss://cp.example.org:7443/'"
        )
    if port == 0:
        raise ValueError("port 0 cannot be dialled; use the port of server.yaml's listen.link")
    return HubAddress(text, parts.hostname, port)
