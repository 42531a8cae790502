"""Asking an engine whether it serves yet: one GET, 200 or not."""

from __future__ import annotations

from twisted.internet import defer, protocol
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from llmgw.webclient import connection_pool


class HttpProbe:
    """GETs with a deadline and no connection reuse: a probe must not keep a
    socket open to an engine that is being stopped."""

    def __init__(self, reactor, clock, timeout_s: float):
        self._clock = clock
        self._timeout_s = timeout_s
        self._agent = Agent(reactor, connectTimeout=timeout_s, pool=connection_pool(reactor, persistent=False))

    async def ok(self, url: str) -> bool:
        """True when *url* answers 200 within the deadline; never raises."""
        try:
            request = self._agent.request(b"GET", url.encode("ascii"), Headers({b"User-Agent": [b"llmgw-agent"]}))
            request.addTimeout(self._timeout_s, self._clock)
            response = await request
            body = _Discard()
            response.deliverBody(body)
            body.done.addTimeout(self._timeout_s, self._clock)
            try:
                await body.done
            except (Exception, defer.CancelledError):
                pass
            return response.code == 200
        except (Exception, defer.CancelledError):
            return False


class _Discard(protocol.Protocol):
    """Reads a body to its end and forgets it: only the status code matters."""

    def __init__(self):
        self.done: defer.Deferred = defer.Deferred()

    def connectionLost(self, reason):
        if not self.done.called:
            self.done.callback(None)
