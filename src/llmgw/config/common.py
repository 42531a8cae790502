"""What more than one configuration file shares: TLS files, the hub URL, hashes, engines, host names."""

from __future__ import annotations

import re

from llmgw.config.schema import File, ListOf, Nullable, Section, Str
from llmgw.hostnames import normal_name
from llmgw.huburl import parse_hub_url
from llmgw.tlsfiles import TLSFiles

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


def check_hub_url(text: str) -> None:
    parse_hub_url(text)


HUB_URL = Str(what="a hub URL like wss://HOST:PORT/", check=check_hub_url)


TLS = Section(TLSFiles, {"ca": File(), "cert": File(), "key": File()})


def check_host_name(text: str) -> str:
    """A name a listener answers to (``admin.hosts``, ``router.hosts``), lower case, without a trailing dot."""
    try:
        return normal_name(text)
    except ValueError:
        raise ValueError("not a host name; write it like 'gw01.example.com' (no scheme, no port)") from None


#: ``admin.hosts`` and ``router.hosts`` (llmgw.hostnames): null is the defaults, ``[]`` none but IP addresses.
HOST_NAMES = Nullable(ListOf(Str(what="a host name such as gw01.example.com", check=check_host_name)))
