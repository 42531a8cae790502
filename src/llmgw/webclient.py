"""Twisted HTTP client pools that keep out of the log.

Twisted writes "Starting factory" and "Stopping factory" for every
connection a pool opens; the agent's health probe and the router's /metrics
poller open one a second per engine.  ``LLMGW_VERBOSE=1`` brings them back.
"""

from __future__ import annotations

from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory

from llmgw.verbose import verbose_logs


class _QuietFactory(_HTTP11ClientFactory):
    noisy = False


def connection_pool(reactor, persistent: bool) -> HTTPConnectionPool:
    pool = HTTPConnectionPool(reactor, persistent=persistent)
    if not verbose_logs():
        pool._factory = _QuietFactory
    return pool
