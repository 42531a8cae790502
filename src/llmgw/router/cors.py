"""CORS: which other sites' pages a browser lets call the API, from ``router.cors``.

Off by default (``allow_origins: []``): no answer carries an
``Access-Control-*`` field, a preflight is refused, and a key-less API
refuses a browser's cross-site request outright (``llmgw.router.door``).
With origins listed, a preflight (``OPTIONS`` with ``Origin`` and
``Access-Control-Request-Method``) from one of them is answered 204 with the
allow fields, and every answer to a request it sends carries
``Access-Control-Allow-Origin`` (``cors_fields``: the router's own answers and
the heads it relays from engines).

Credentials, as the Fetch standard means them, are cookies, HTTP
authentication the browser keeps, and TLS client certificates.  llmgw uses
none: an API key is an ``Authorization`` field the page's script sets, which
is a request header to be allowed (``Access-Control-Allow-Headers`` names it;
the ``*`` wildcard there would not cover it), not a credential.  So the router
never sends ``Access-Control-Allow-Credentials``, and ``allow_origins: ["*"]``
is answered with ``Access-Control-Allow-Origin: *``, which the standard allows
exactly because no credentials ride along: a page that asks for
``credentials: "include"`` is refused by its browser.  A listed origin is
echoed back with ``Vary: Origin``, so a cache does not hand one site's answer
to another.
"""

from __future__ import annotations

import re

import attrs

from llmgw.config.routing import CorsSettings
from llmgw.http11 import ParsedRequest, status_line
from llmgw.router import errors

METHODS = b"GET, POST, OPTIONS"
# Read by the openai clients (the request id) and by anyone told to wait (Retry-After).
EXPOSED = b"Access-Control-Expose-Headers: X-Request-Id, Retry-After\r\n"
# A preflight's Access-Control-Request-Headers: a list of field names.
_FIELD_NAMES = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+(?:[ \t]*,[ \t]*[!#$%&'*+\-.^_`|~0-9A-Za-z]+)*")
MAX_REQUEST_HEADERS = 2048
_PREFLIGHT_VARY = b"Vary: Origin, Access-Control-Request-Method, Access-Control-Request-Headers\r\n"


class CorsRefused(errors.RouterError):
    """A preflight from a page whose origin router.cors.allow_origins does not name."""

    status = 403
    type = "permission_error"
    code = "cors_origin_not_allowed"


@attrs.frozen
class Cors:
    """The origins whose pages may read the API's answers; the default lets none."""

    origins: frozenset[str] = frozenset()
    any_origin: bool = False
    max_age_s: int = 600

    @classmethod
    def for_config(cls, settings: CorsSettings) -> Cors:
        return cls(frozenset(o for o in settings.allow_origins if o != "*"), "*" in settings.allow_origins,
                   settings.max_age_s)

    @property
    def enabled(self) -> bool:
        return self.any_origin or bool(self.origins)

    def described(self) -> str:
        """The allowed origins in words, for a refusal."""
        if self.any_origin:
            return "any"
        return ", ".join(sorted(self.origins)) if self.origins else "none: []"

    def allows(self, origin: str | None) -> bool:
        """Whether a page of ``origin`` (an ``Origin`` field's value) may read the answers."""
        if origin is None or not (self.any_origin or self.origins):
            return False
        return self.any_origin or origin in self.origins

    def _allow_origin(self, origin: str) -> bytes:
        if self.any_origin:
            return b"Access-Control-Allow-Origin: *\r\n"
        return b"Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n" % origin.encode("latin-1")

    def fields(self, request: ParsedRequest) -> bytes:
        """The header lines an answer to ``request`` carries: none unless its Origin is allowed."""
        if not (self.any_origin or self.origins):
            return b""
        origin = request.headers.get("origin")
        if origin is None or not (self.any_origin or origin in self.origins):
            return b""
        return self._allow_origin(origin) + EXPOSED

    def answer_preflight(self, request: ParsedRequest) -> bytes | CorsRefused:
        """An OPTIONS request's answer: the header lines of a 204 allowing it, or the error refusing it."""
        allowed = self.preflight(request) if is_preflight(request) else None
        if allowed is not None:
            return allowed
        origin = request.headers.get("origin")
        if origin is None or not is_preflight(request):
            return CorsRefused("OPTIONS answers only a browser's CORS preflight (Origin and "
                               "Access-Control-Request-Method)")
        if self.allows(origin):
            # The origin is listed: what else the preflight asked for is what is refused.
            method = request.headers["access-control-request-method"]
            if method not in ("GET", "POST", "HEAD"):
                return CorsRefused("the API is called with GET or POST, not %s" % _shown(method))
            return CorsRefused("Access-Control-Request-Headers must list at most %d characters of field names "
                               "separated by commas" % MAX_REQUEST_HEADERS)
        return CorsRefused("this router's API lets no page of %s call it from a browser: name the origin in "
                           "router.cors.allow_origins (now %s)" % (_shown(origin), self.described()))

    def preflight(self, request: ParsedRequest) -> bytes | None:
        """The header lines of a 204 answering a preflight from an allowed origin, or None to refuse it."""
        origin = request.headers.get("origin")
        if not self.allows(origin):
            return None
        method = request.headers.get("access-control-request-method", "")
        if method not in ("GET", "POST", "HEAD"):
            return None
        lines = [self._allow_origin(origin), b"Access-Control-Allow-Methods: ", METHODS, b"\r\n"]
        wanted = request.headers.get("access-control-request-headers", "").strip()
        if wanted:
            # Any field may be sent: the API key, not a header, is what grants anything.
            if len(wanted) > MAX_REQUEST_HEADERS or _FIELD_NAMES.fullmatch(wanted) is None:
                return None
            lines += [b"Access-Control-Allow-Headers: ", wanted.encode("latin-1"), b"\r\n"]
        lines.append(b"Access-Control-Max-Age: %d\r\n" % self.max_age_s)
        if not self.any_origin:
            lines[0] = lines[0].replace(b"Vary: Origin\r\n", b"")
        lines.append(_PREFLIGHT_VARY)
        return b"".join(lines)


def _shown(value: str) -> str:
    """A client's field value for a message: as it is when short and plain, else quoted and cut at 100 characters."""
    if len(value) <= 100 and value.isascii() and value.isprintable():
        return value
    return repr(value[:100]) + ("..." if len(value) > 100 else "")


def is_preflight(request: ParsedRequest) -> bool:
    headers = request.headers
    return request.method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers


def cors_fields(request: ParsedRequest, cors: Cors) -> bytes:
    """The CORS header lines for an answer to ``request`` (``b""`` unless ``cors`` allows its Origin).

    What a relay adds to the engine's head; ``cors`` is the router's policy,
    ``factory.door.cors`` (read it per request: a reload replaces the door).
    """
    return cors.fields(request)


def no_content(date: bytes, fields: bytes, connection: bytes = b"") -> bytes:
    """A 204 answer: no body, and no Content-Length (RFC 9110 §8.6)."""
    return b"".join((status_line(204), date, connection, fields, b"\r\n"))
