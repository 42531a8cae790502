"""What the router turns away before it routes: a connection too many, and a request a browser was tricked into.

A connection over ``router.clients.max_connections`` is answered 503 and
closed (``OverCapacity``).

An API without ``router.keys`` answers whoever reaches it, and an
operator's browser reaches a loopback listener: a web page whose DNS name
is re-pointed at 127.0.0.1 (DNS rebinding) makes the browser send the
page's requests to the router, and lets the page read the answers, since to
the browser they come from the page's own name.  So a key-less API answers
only requests that name one of ``router.hosts`` (absent: ``localhost`` and
the machine's host name) or an IP address, by the rule of
``llmgw.hostnames``: another name is 421, no Host or two, one that is not a
host, or a URL for a target is 400.  A request a browser says comes from
another site's page (``Origin``, ``Referer``, ``Sec-Fetch-Site``) is 403: such
a page cannot read the answer, but it could spend the engines' time, and no
API client sends those fields.  The exception is a page of an origin
``router.cors.allow_origins`` names (``llmgw.router.cors``): the operator let
it in.  The router sends an engine none of the client's fields (its request
to the engine is its own), so no engine's CORS answer lets another site's
page read an answer: only the router's own ``Access-Control-*`` fields do.

An API with keys needs none of that: a browser sends no bearer token by
itself, so a page's request carries none, and every route, ``GET
/v1/models`` included, is 401 without one.  A key that may use some models
only is shown only those.
"""

from __future__ import annotations

import attrs
from twisted.internet.protocol import Protocol

from llmgw.config.routing import RouterSettings
from llmgw.hostnames import HostNames, asked_for, same_origin_for
from llmgw.http11 import ParsedRequest, response_bytes
from llmgw.router import errors
from llmgw.router.cors import Cors
from llmgw.router.keys import KeyRing
from llmgw.router.requestid import error_json, id_field, request_id

MODELS = "/v1/models"


class NotThisRoutersName(errors.RouterError):
    """The request names a host that is not one of this router's: DNS rebinding looks like this."""

    status = 421
    type = "invalid_request_error"
    code = "misdirected_request"


class FromAnotherSite(errors.RouterError):
    """A browser sent this request from another site's page: a key-less API answers no page but its own."""

    status = 403
    type = "permission_error"
    code = "cross_site_request"


@attrs.frozen
class Door:
    """Who a router's API answers, as its ``router:`` section says; the default answers everyone (tests' routers).

    ``names``: a key-less API's own names (None: the API has keys, or no
    guard was asked for).  ``keys``: the API's keys, for the routes the
    dispatcher does not see (``/v1/models``); None: it has none.  ``cors``:
    which other sites' pages may call it from a browser.
    """

    names: HostNames | None = None
    keys: KeyRing | None = None
    cors: Cors = Cors()

    @classmethod
    def for_config(cls, config: RouterSettings, clock, file: str = "server.yaml", then: str = "reload") -> Door:
        cors = Cors.for_config(config.cors)
        if config.keys:
            return cls(None, KeyRing(config.keys, clock), cors)
        names = HostNames.from_setting(config.hosts, key="router.hosts", file=file,
                                       listener="this router's OpenAI API, which has no keys", then=then)
        return cls(names, None, cors)

    def refusal(self, request: ParsedRequest) -> errors.RouterError | None:
        """What to answer instead of routing *request*, or None to route it."""
        if self.keys is not None:
            if request.path == MODELS or request.path.startswith(MODELS + "/"):
                try:
                    self.keys.authenticate(bearer(request))
                except errors.RouterError as e:
                    return e
            return None
        if self.names is None:
            return None
        headers = request.headers
        host = headers.get("host")
        # The parser joins repeated fields with ", "; no host has a comma in it.
        hosts = [] if host is None else host.split(",")
        misdirected = self.names.refusal_for(request.target, hosts)
        if misdirected is not None:
            if misdirected.code == 400:
                return errors.InvalidRequest(misdirected.words)
            return NotThisRoutersName(misdirected.words)
        if not same_origin_for(headers.get("sec-fetch-site"), headers.get("origin"), headers.get("referer"),
                               asked_for(request.target, hosts)) and not self.cors.allows(headers.get("origin")):
            return FromAnotherSite(
                "a browser sent this request from another site's page (Origin, Referer or Sec-Fetch-Site says "
                "so), and this API has no keys: call it from a program, add router.keys, or name the page's origin in "
                "router.cors.allow_origins")
        return None

    def models(self, request: ParsedRequest, served: list[str]) -> list[str]:
        """Of the models *served*, those the request's key may use (all of them on an API without keys)."""
        if self.keys is None:
            return served
        key = self.keys.authenticate(bearer(request))
        return served if key.models is None else [m for m in served if m in key.models]


def bearer(request: ParsedRequest) -> str | None:
    auth = request.headers.get("authorization")
    if auth is not None and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


class OverCapacity(Protocol):
    """A connection over ``router.clients.max_connections``: 503, then closed."""

    def connectionMade(self) -> None:
        error = errors.TooManyConnections(
            "the router has %d API connections open, as many as router.clients.max_connections allows: try again "
            "after Retry-After, and reuse connections (keep-alive)" % self.factory.max_connections)
        extra = b"".join(b"%s: %s\r\n" % (name.encode(), value.encode()) for name, value in error.headers)
        # No request is read: the id is one made for this answer.
        rid = request_id(None)
        self.transport.write(response_bytes(error.status, error_json(error, rid), self.factory.date(),
                                            connection=b"Connection: close\r\n", extra=extra + id_field(rid)))
        self.transport.loseConnection()
