"""Every server of one etcd, listed: each puts ``/llmgw/servers/<name>`` under a lease of its own.

``Servers(clock, client, name, lease_s)``: ``announce(role, url, api_url,
epoch, since)`` writes this server's entry (JSON ``{"role", "url",
"api_url", "epoch", "since"}``) under a lease it renews every ``lease_s / 3``,
so a server that dies leaves the list within ``lease_s``; a lease etcd has
lost is granted again and the entry written again.  ``list()`` reads every
entry (``ServerView``), and ``known`` holds the last list read, refreshed at
each renewal, for ``ctl status`` to answer at once.

What another server wrote is read as another process's word: at most
``MAX_SERVERS`` entries, each at most ``MAX_VALUE`` bytes, a name that is a
name, a role llmgw knows, URLs of bounded length, an epoch that is one; an
entry that is not is left out of the list (and logged once per key).
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from llmgw.ha.etcd import EtcdError, KeyValue
from llmgw.ha.fence import MOST
from llmgw.text import printable
from llmgw.views import ServerRole, ServerView
from llmgw.wire import WireError, from_wire

log = Logger()

PREFIX = b"/llmgw/servers/"
#: The most entries ``list()`` reads, and the most bytes one may hold.
MAX_SERVERS = 64
MAX_VALUE = 4096


def server_of(kv: KeyValue) -> ServerView | None:
    """The ``ServerView`` an entry holds; None when it is not one llmgw writes (too long, not JSON, a bad field)."""
    if len(kv.value) > MAX_VALUE or not kv.key.startswith(PREFIX):
        return None
    try:
        name = kv.key[len(PREFIX):].decode("utf-8")
        value = json.loads(kv.value)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("role") not in {r.value for r in ServerRole}:
        return None
    fields = {k: value.get(k) for k in ("role", "url", "api_url", "epoch", "since")}
    try:
        return from_wire(ServerView, {"name": name, **fields})
    except WireError:
        return None


class Servers:
    """This server's entry in ``/llmgw/servers/``, kept alive, and every server's, read."""

    def __init__(self, clock, client, name: str, lease_s: float):
        self.clock, self.client, self.name, self.lease_s = clock, client, name, lease_s
        self.key = PREFIX + name.encode("utf-8")
        self.lease: int | None = None
        self.value: bytes | None = None
        self.known: list[ServerView] = []
        self._call = None
        self._written: bytes | None = None  # the value etcd holds under this lease
        self._busy = self._again = False
        self._stopped = False
        self._refused: set[bytes] = set()

    def announce(self, role: ServerRole, url: str | None, api_url: str | None, epoch: int | None,
                 since: float) -> defer.Deferred[None]:
        """Say this server's *role* (and so on) in etcd now, and keep saying it; an unreachable etcd is tried again."""
        entry: dict[str, Any] = {"role": role.value, "url": url, "api_url": api_url,
                                 "epoch": epoch if epoch is not None and 1 <= epoch <= MOST else None, "since": since}
        self.value = json.dumps(entry).encode()
        return self._run()

    def start(self) -> None:
        self._stopped = False
        self._schedule(self.lease_s / 3)

    def stop(self) -> defer.Deferred[None]:
        """Leave the list: the lease is revoked (the entry goes with it), nothing more is renewed."""
        self._stopped = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        lease, self.lease = self.lease, None
        if lease is None:
            return defer.succeed(None)

        def unheard(failure):
            failure.trap(EtcdError)
            log.info("could not revoke {name}'s lease: its entry lapses in {s:g} s", name=self.name, s=self.lease_s)

        return self.client.revoke(lease).addErrback(unheard)

    async def list(self) -> list[ServerView]:
        """Every server listed, by name; at most ``MAX_SERVERS``, what is not llmgw's left out."""
        found = []
        for kv in (await self.client.get_prefix(PREFIX))[:MAX_SERVERS]:
            view = server_of(kv)
            if view is None:
                if kv.key not in self._refused and len(self._refused) < MAX_SERVERS:
                    self._refused.add(kv.key)
                    log.warn("etcd holds {key}, which is not a server's entry llmgw writes: left out of the list",
                             key=printable(kv.key.decode("utf-8", "replace"))[:200])
                continue
            found.append(view)
        self.known = sorted(found, key=lambda v: v.name)
        return self.known

    # -- the renewals --

    def _schedule(self, delay: float) -> None:
        if self._stopped:
            return
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = self.clock.callLater(delay, self._run)

    def _run(self) -> defer.Deferred[None]:
        if self._stopped:
            return defer.succeed(None)
        if self._busy:
            self._again = True  # asked while a step was in flight: another once it ends
            return defer.succeed(None)
        self._busy, self._again = True, False

        def done(result):
            self._busy = False
            if isinstance(result, Failure):
                if result.check(EtcdError) is None:
                    log.failure("listing {name} in etcd failed", result, name=self.name)
                else:
                    log.warn("could not list {name} in etcd: {why}; trying again in {s:.1f} s", name=self.name,
                             why=str(result.value), s=self.lease_s / 3)
            self._schedule(0 if self._again else self.lease_s / 3)

        return defer.Deferred.fromCoroutine(self._step()).addBoth(done)

    async def _step(self) -> None:
        if self.lease is not None and await self.client.keepalive(self.lease) <= 0:
            self.lease = None  # lapsed (etcd was away longer than the lease): a new one, and the entry again
        if self.lease is None:
            self.lease = await self.client.grant(max(1, round(self.lease_s)))
            self._written = None
        if self.value is not None and self._written != self.value:
            value = self.value
            await self.client.put(self.key, value, self.lease)
            self._written = value
        await self.list()
