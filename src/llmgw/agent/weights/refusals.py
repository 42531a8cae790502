"""What a mirror's or the hub's answer says beyond its bytes: an error's meaning, a file's published sha256."""

from __future__ import annotations

import re

from llmgw.weightnames import WeightsSource

from .body import discard
from .errors import FetchError
from .sources import request_headers

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def header(response, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode("latin-1") if values else None


def linked_sha256(response) -> str | None:
    """The sha256 in ``X-Linked-Etag`` on *response* or a redirect before it, when it is one."""
    while response is not None:
        value = header(response, b"X-Linked-Etag")
        if value is not None:
            value = value.strip().removeprefix("W/").strip('"').lower()
            return value if _SHA256.fullmatch(value) else None
        response = getattr(response, "previousResponse", None)
    return None


async def refused(fetcher, src: WeightsSource, response, url: str | None = None) -> FetchError:
    """What an error answer to a request for *src* (at *url*, if not its own) means, and what to do."""
    body = await discard(response, fetcher._clock, fetcher._idle_timeout_s, keep=2048)
    said = body.decode("utf-8", "replace").strip().splitlines()[:1]
    detail = f" ({said[0][:200]})" if said else ""
    what = f"{url or src.url}: HTTP {response.code} {response.phrase.decode('latin-1')}{detail}"
    if src.kind == "hf" and response.code in (401, 403):
        if "Authorization" in request_headers(src, fetcher._environ):
            return FetchError(f"{what}; the HF_TOKEN sent was refused: check that it may read this repository")
        return FetchError(f"{what}; this repository needs a token: set HF_TOKEN in the agent's environment")
    if response.code == 404:
        kind = header(response, b"X-Error-Code")
        if kind == "RevisionNotFound":
            return FetchError(f"{what}; {src.repository} has no revision {src.revision}: check the source's @REVISION")
        if kind == "RepoNotFound":
            return FetchError(f"{what}; there is no repository {src.repository} (or it is private: set HF_TOKEN)")
        return FetchError(f"{what}; check {fetcher._check}")
    return FetchError(what)
