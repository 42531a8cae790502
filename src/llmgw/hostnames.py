"""Which host a request names, whether it is one of the listener's own, and whether a browser sent it from there.

A browser sends the host it thinks it is talking to: ``Host`` on every
request, ``Origin`` on a form's POST or a script's ``fetch``.  DNS rebinding
turns that against a listener that trusts where its peer is: a page at
``rebind.example`` re-points its own name at 127.0.0.1 (or at any address
the browser can reach), and the browser, still believing it talks to
``rebind.example``, sends the page's requests to the listener and lets the
page read the answers (same origin).  Its requests say
``Host: rebind.example``.  So a listener that answers without a key (the
admin page to a peer on ``admin.local``, the OpenAI API without
``router.keys``), and one that answers anyone (``/metrics``), answers only
requests that name one of its own names (``admin.hosts``, ``router.hosts``:
by default ``localhost`` and the machine's host name) or an IP address (no
DNS answer can re-point ``127.0.0.1``); another name is answered 421.

The port is not compared: an ssh tunnel (``ssh -L 8080:127.0.0.1:9090``)
makes the browser ask for ``localhost:8080``, and a rebinding page cannot
change the name it is served under, only where that name points.

Both the admin listener (twisted.web: ``asked``, ``HostNames.refusal``,
``same_origin``) and the router's own HTTP server (``asked_for``,
``HostNames.refusal_for``, ``same_origin_for``) use this one rule.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

import attrs

#: A DNS name is at most 253 characters; a longer ``Host`` is nobody's.
MAX_NAME_CHARS = 253
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")


class BadHost(Exception):
    """A request whose ``Host`` (or target) cannot be read as one host; the message says what to send."""


@attrs.frozen
class Asked:
    """The host a request names: ``name`` in lower case, without a trailing dot or IPv6 brackets."""

    name: str
    port: str | None
    # An IP address rather than a name: nothing a DNS answer can re-point.
    address: bool

    def __str__(self) -> str:
        name = f"[{self.name}]" if ":" in self.name else self.name
        return name if self.port is None else f"{name}:{self.port}"


@attrs.frozen
class Misdirected:
    """How a request that does not name this server is answered: 400 (no host, or not one) or 421, and why."""

    code: int
    words: str


def parse_authority(text: str) -> Asked:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; raises ``ValueError`` for anything else."""
    if not text.isascii():
        raise ValueError("not ASCII")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("an IPv6 address in [ ] has no ]")
        name, rest = text[1:end], text[end + 1:]
        try:
            address = ipaddress.IPv6Address(name)
        except ValueError:
            raise ValueError("what is in [ ] is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise ValueError("after ] comes :port or nothing")
        return Asked(str(address), _port(rest[1:]) if rest else None, True)
    name, colon, port = text.partition(":")
    name = normal_name(name)
    try:
        address = ipaddress.IPv4Address(name)
    except ValueError:
        return Asked(name, _port(port) if colon else None, False)
    return Asked(str(address), _port(port) if colon else None, True)


def normal_name(text: str) -> str:
    """A host name in lower case without its one trailing dot; raises ``ValueError`` if it is not a name."""
    name = text.lower()
    name = name[:-1] if name.endswith(".") else name
    if (not name.isascii() or not name or len(name) > MAX_NAME_CHARS
            or not all(_LABEL.fullmatch(label) for label in name.split("."))):
        raise ValueError("not a host name (letters, digits, '-' and '_' in labels between dots)")
    return name


def _port(text: str) -> str:
    if not _PORT.fullmatch(text) or not 0 < int(text) <= 65535:
        raise ValueError("the port is not a number from 1 to 65535")
    return text


def asked_for(target: str, hosts: list[str]) -> Asked:
    """The one host a request for *target* with these ``Host`` fields names; ``BadHost`` for none, two, or not a host.

    A request for a URL (``GET http://host/ HTTP/1.1``) rather than a path is
    refused too: only a proxy is sent those, and its host would be another
    place to hide a name.
    """
    if not target.startswith("/"):
        raise BadHost("ask for a path (GET /...), not a URL: this listener is not a proxy")
    if len(hosts) != 1:
        raise BadHost("a request names one host, in one Host header" + ("" if hosts else " (HTTP/1.0 too)"))
    try:
        return parse_authority(hosts[0].strip(" \t"))
    except ValueError as e:
        raise BadHost(f"the Host header is not a host: {e}") from None


def asked(request) -> Asked:
    """``asked_for`` a twisted.web request."""
    values = request.requestHeaders.getRawHeaders(b"host") or []
    return asked_for(request.uri.decode("latin-1"), [v.decode("latin-1") for v in values])


@attrs.frozen
class HostNames:
    """A listener's own names (``key``, in ``file``); any IP address is the listener's too.

    ``listener`` and ``then`` word the 421: whose names these are, and what
    makes a change to ``file`` take effect.
    """

    names: tuple[str, ...]
    key: str = "admin.hosts"
    file: str = "server.yaml"
    listener: str = "this server's admin listener"
    then: str = "reload"

    @classmethod
    def from_setting(cls, hosts: tuple[str, ...] | None, **wording: str) -> HostNames:
        """The names a setting lists; absent (None) is ``localhost`` and the machine's host name."""
        if hosts is None:
            hosts = ("localhost", socket.gethostname())
        names = []
        for host in hosts:
            try:
                names.append(normal_name(host))
            except ValueError:
                continue  # a host name that is not a DNS name (the config checks the setting's own)
        return cls(tuple(dict.fromkeys(names)), **wording)

    def ours(self, host: Asked) -> bool:
        return host.address or host.name in self.names

    def refusal(self, request) -> Misdirected | None:
        """``refusal_for`` a twisted.web request."""
        values = request.requestHeaders.getRawHeaders(b"host") or []
        return self.refusal_for(request.uri.decode("latin-1"), [v.decode("latin-1") for v in values])

    def refusal_for(self, target: str, hosts: list[str]) -> Misdirected | None:
        """None for a request that names this listener; else 400 (no host, or not a host) or 421 (another host)."""
        try:
            host = asked_for(target, hosts)
        except BadHost as e:
            return Misdirected(400, str(e))
        if self.ours(host):
            return None
        # The names themselves are not said: whoever asked may be the rebound page, and the
        # machine's host name is none of its business.
        return Misdirected(421, f"{host.name} is not a name of {self.listener} (an IP address always is): if it "
                            f"is this server's, add it to {self.key} in {self.file} and {self.then}")


def same_origin(request, host: Asked) -> bool:
    """``same_origin_for`` a twisted.web request."""
    def header(name: bytes) -> str | None:
        value = request.getHeader(name)
        return None if value is None else value.decode("latin-1")

    return same_origin_for(header(b"sec-fetch-site"), header(b"origin"), header(b"referer"), host)


def same_origin_for(fetch_site: str | None, origin: str | None, referer: str | None, host: Asked) -> bool:
    """Whether a request comes from a page of *host* itself, as far as the browser says.

    ``Origin`` decides when it is sent (``null`` is nobody's); without it a
    ``Referer`` must be this host's, and ``Sec-Fetch-Site`` must say
    same-origin (or ``none``: the person typed the address).  A client that
    sends none of them is not a browser.  Only host and port are compared,
    not the scheme: a TLS-terminating proxy in front of ``/admin`` forwards
    an https page's form over http.
    """
    if fetch_site is not None and fetch_site.strip(" \t") not in ("same-origin", "none"):
        return False
    if origin is None:
        origin = referer
        if origin is None:
            return True
    try:
        netloc = urlsplit(origin.strip()).netloc
        if not netloc or "@" in netloc:
            return False
        sent = parse_authority(netloc)
    except ValueError:
        return False
    return (sent.name, sent.port) == (host.name, host.port)
