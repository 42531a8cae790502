"""Who may see the admin page, and proof that a form was the page's own.

A peer on one of ``admin.local``'s networks is trusted as the person at
the machine, on ``listen.admin`` only, and only when it asks for one of this
server's names (``admin.hosts``, ``llmgw.hostnames``): a web page whose
DNS name was re-pointed at this listener asks for its own.  Under
``/admin`` on the API listener, which a reverse proxy on the same host may
face (every visitor then comes from the proxy's address), everyone signs in.  ``X-Forwarded-For`` is never
believed.  Anyone else logs in with an operator key from ``admin.keys``
(compared by sha256, never stored) and gets a session cookie: random,
HttpOnly, SameSite=Strict, Secure on a TLS listener, kept in memory for
``admin.session_ttl_s`` and at most ``admin.max_sessions`` of them (the
oldest goes first).  A restart logs everybody out; a reload that removes or changes a
key ends that key's sessions.

Every state-changing request carries a CSRF token: an HMAC, under a secret
this process draws at start, of a random cookie the browser holds and the
host the page was asked for (a token drawn under one name is no good under
another).  A page on another site can make the browser send the cookie but
cannot read the token, and SameSite=Strict keeps the cookie off its
requests anyway.

A peer whose sign-in fails waits before its next one is looked at:
``admin.login_backoff_s`` after the first, doubling with each failure in a
row up to ``admin.max_login_wait_s``; at most ``admin.max_login_peers``
peers are remembered (the least recently failed goes first).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import math
import secrets

import attrs

from llmgw.config.server import AdminSettings
from llmgw.hostnames import BadHost, HostNames, asked

SESSION_COOKIE = b"llmgw_admin_session"
CSRF_COOKIE = b"llmgw_admin_csrf"
CSRF_FIELD = b"csrf"
#: Longer than any key ``llmgw`` or a person makes; a longer one is not looked at.
MAX_KEY_CHARS = 512


@attrs.frozen
class Operator:
    """Who is asking: a local peer (``name`` is its address) or a logged-in key's name."""

    name: str
    local: bool
    # The token this browser's forms carry (its log-out button), once the page has drawn it.
    csrf: str | None = None


class Guard:
    """``admin:`` applied to requests; pass ``clock=reactor`` unless you are testing."""

    def __init__(self, settings: AdminSettings, clock, secret: bytes | None = None):
        self._clock = clock
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        # session id -> (operator name, its key's sha256, expires at), oldest first.
        self._sessions: collections.OrderedDict[str, tuple[str, str, float]] = collections.OrderedDict()
        self.backoff = Backoff(clock, settings)
        self.reconfigure(settings)

    def reconfigure(self, settings: AdminSettings) -> None:
        """A reloaded ``admin:``: its networks and keys from now on; a removed or changed key's sessions end."""
        self.settings = settings
        self.backoff.reconfigure(settings)
        self._networks = [ipaddress.ip_network(n, strict=False) for n in settings.local]
        self.names = HostNames.from_setting(settings.hosts)
        self._keys = {key.sha256.lower(): key.name for key in settings.keys}
        for sid in [sid for sid, (name, sha, _) in self._sessions.items() if self._keys.get(sha) != name]:
            del self._sessions[sid]
        while len(self._sessions) > settings.max_sessions:
            self._sessions.popitem(last=False)

    def is_local(self, host: str | None) -> bool:
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:
            return False  # a UNIX socket or anything else without an address: not on a local network
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._networks)

    def operator(self, request, trust_local: bool = True) -> Operator | None:
        """The local peer (when *trust_local*) asking for this server's name, or the logged-in operator, or None."""
        host = getattr(request.getClientAddress(), "host", None)
        if trust_local and self.is_local(host) and self.asks_for_us(request):
            return Operator(host, True)
        sid = _cookie(request, SESSION_COOKIE)
        if sid is None:
            return None
        found = self._sessions.get(sid)
        if found is None:
            return None
        name, _, expires = found
        if self._clock.seconds() >= expires:
            del self._sessions[sid]
            return None
        return Operator(name, False)

    def asks_for_us(self, request) -> bool:
        """Whether *request* names one of this server's hosts (``admin.hosts``, or an IP address)."""
        return self.names.refusal(request) is None

    def login(self, request, key: str) -> str | None:
        """The key's operator name, with a session cookie set; None for a key ``admin.keys`` does not have.

        Raises ``Throttled`` while this peer waits after failed sign-ins; its key is not looked at.
        """
        peer = str(getattr(request.getClientAddress(), "host", None))
        wait = self.backoff.wait_s(peer)
        if wait > 0:
            raise Throttled(peer, wait)
        digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest() if 0 < len(key) <= MAX_KEY_CHARS else ""
        sha = next((sha for sha in self._keys if hmac.compare_digest(sha, digest)), None)
        if sha is None:
            self.backoff.failed(peer)
            return None
        self.backoff.succeeded(peer)
        name = self._keys[sha]
        self._expire()
        while len(self._sessions) >= self.settings.max_sessions:
            self._sessions.popitem(last=False)
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = (name, sha, self._clock.seconds() + self.settings.session_ttl_s)
        self._set_cookie(request, SESSION_COOKIE, sid.encode(), max_age=int(self.settings.session_ttl_s))
        return name

    def logout(self, request) -> None:
        sid = _cookie(request, SESSION_COOKIE)
        if sid is not None:
            self._sessions.pop(sid, None)
        self._set_cookie(request, SESSION_COOKIE, b"", max_age=0)

    def sessions(self) -> int:
        self._expire()
        return len(self._sessions)

    def _expire(self) -> None:
        now = self._clock.seconds()
        for sid in [sid for sid, (_, _, expires) in self._sessions.items() if now >= expires]:
            del self._sessions[sid]

    # -- CSRF --

    def csrf_token(self, request) -> str:
        """The token this browser's forms carry; gives the browser its CSRF cookie when it has none."""
        seed = _cookie(request, CSRF_COOKIE)
        if seed is None or len(seed) != 43:
            seed = getattr(request, "_llmgw_csrf_seed", None) or secrets.token_urlsafe(32)
            request._llmgw_csrf_seed = seed
            self._set_cookie(request, CSRF_COOKIE, seed.encode())
        return self._sign(seed, request)

    def csrf_ok(self, request, token: str | None) -> bool:
        seed = _cookie(request, CSRF_COOKIE)
        if seed is None or not token:
            return False
        return hmac.compare_digest(self._sign(seed, request), token)

    def _sign(self, seed: str, request) -> str:
        try:
            host = str(asked(request))
        except BadHost:
            host = ""  # the page refuses such a request before it draws or checks a token
        return hmac.new(self._secret, f"{seed}\n{host}".encode(), hashlib.sha256).hexdigest()

    def _set_cookie(self, request, name: bytes, value: bytes, max_age: int | None = None) -> None:
        # Path=/ on every listener: cookies are the host's, whatever the port, so
        # the admin listener and /admin on the API share one of each.
        request.addCookie(name, value, path=b"/", httpOnly=True,
                          sameSite="strict", secure=request.isSecure() or None,
                          max_age=None if max_age is None else str(max_age).encode())


class Throttled(Exception):
    """A sign-in from a peer that must wait; ``wait_s`` says how long."""

    def __init__(self, peer: str, wait_s: float):
        super().__init__(peer, wait_s)
        self.peer = peer
        self.wait_s = wait_s

    def __str__(self) -> str:
        return (f"too many wrong keys from {self.peer}: try again in {math.ceil(self.wait_s)} s "
                "(admin.login_backoff_s, admin.max_login_wait_s)")


class Backoff:
    """Failed sign-ins per peer, in a table of at most ``admin.max_login_peers``.

    After the nth failure in a row a peer waits ``login_backoff_s * 2**(n-1)``,
    at most ``max_login_wait_s``; a success, or ``max_login_wait_s``
    quiet after its wait ends, forgets it.
    """

    def __init__(self, clock, settings: AdminSettings):
        self._clock = clock
        # peer -> (failures in a row, may try again at), least recently failed first.
        self._peers: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()
        self.reconfigure(settings)

    def reconfigure(self, settings: AdminSettings) -> None:
        self.settings = settings
        while len(self._peers) > settings.max_login_peers:
            self._peers.popitem(last=False)

    def wait_s(self, peer: str) -> float:
        found = self._peers.get(peer)
        if found is None:
            return 0.0
        now = self._clock.seconds()
        if now >= found[1] + self.settings.max_login_wait_s:
            del self._peers[peer]
            return 0.0
        return max(0.0, found[1] - now)

    def failed(self, peer: str) -> None:
        self.wait_s(peer)  # forgets a peer quiet long enough
        failures = self._peers.pop(peer, (0, 0.0))[0] + 1
        wait = min(self.settings.login_backoff_s * 2 ** min(failures - 1, 64), self.settings.max_login_wait_s)
        self._peers[peer] = (failures, self._clock.seconds() + wait)
        while len(self._peers) > self.settings.max_login_peers:
            self._peers.popitem(last=False)

    def succeeded(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def __len__(self) -> int:
        return len(self._peers)


def _cookie(request, name: bytes) -> str | None:
    value = request.getCookie(name)
    if not value or len(value) > 128:
        return None
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        return None
