"""What more than one configuration file shares: TLS files, the hub URL, hashes, engines."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import attrs

from llmgw.config.schema import File, Section, Str

# The engines llmgw has an adapter for.  `sim` is llmgw's own simulator.
KNOWN_ENGINES = ("llama.cpp", "vllm", "sglang", "sim")

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def check_sha256(text: str) -> str:
    """*text* as 64 lowercase hex digits, or ``ValueError`` saying what is wrong."""
    if not _SHA256.fullmatch(text):
        if len(text) != 64:
            raise ValueError(
                f"a sha256 is 64 hex digits, this has {len(text)} characters; "
                "paste the whole output of sha256sum"
            )
        raise ValueError("a sha256 is 64 hex digits (0-9, a-f); this has other characters")
    return text.lower()


SHA256 = Str(what="a string of 64 hex digits (a sha256)", check=check_sha256)


def parse_hub_url(text: str) -> tuple[str, int]:
    """The ``(host, port)`` of a hub URL like ``wss://cp.example.org:7443/``.

    Raises ``ValueError`` saying what to change.  The port is required: the hub
    listens where server.yaml's ``listen.link`` says, which is rarely 443.
    """
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"not a URL ({e}); write it like 'wss://cp.example.org:7443/'") from None
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
    return parts.hostname, port


def check_hub_url(text: str) -> None:
    parse_hub_url(text)


HUB_URL = Str(what="a hub URL like wss://HOST:PORT/", check=check_hub_url)


@attrs.frozen
class TLSFiles:
    """The cluster CA, this process's certificate and its key, as absolute paths."""

    ca: str
    cert: str
    key: str


TLS = Section(TLSFiles, {"ca": File(), "cert": File(), "key": File()})
