"""The fleet's nodes as the leader knows them, kept in etcd: what a new leader waits for before it places anything.

The leader puts ``/llmgw/nodes``, a JSON list of the ids of every node it
holds that is not lost, whenever that list changes, at most once every
``interval_s`` (1 s) and one put at a time.  The key has no lease: it must
outlive the leader that wrote it.  Every server follows it (a watch, and
one read at start), so a standby taking the lead knows at once which nodes
to hear again before placing (``llmgw.control.settle``): placing resumes as
soon as they are back, and a node whose agent backs off for a while is not
taken for one that has gone.

What etcd holds is another process's word: a value over ``max_bytes``, not
a JSON list, longer than ``MAX_NODES``, or naming something that is not a
node id (``llmgw.roles``) is not read, and logged once; the new leader then
waits as after a restart (``fleet.settle_s``).
"""

from __future__ import annotations

import json
from typing import Callable, Collection

from twisted.internet import defer
from twisted.logger import Logger

from llmgw.ha.etcd import EtcdError
from llmgw.roles import is_node_id
from llmgw.text import printable

log = Logger()

KEY = b"/llmgw/nodes"
#: The most node ids the list may hold.
MAX_NODES = 100_000
#: The least time between two puts of the list.
INTERVAL_S = 1.0


def encode(ids: Collection[str]) -> bytes:
    return json.dumps(sorted(ids), separators=(",", ":")).encode()


def decode(data: bytes, max_bytes: int) -> frozenset[str]:
    """The node ids *data* lists; ValueError, in words, when it is not a list llmgw writes."""
    if len(data) > max_bytes:
        raise ValueError(f"it is {len(data)} bytes, more than ha.max_response_bytes ({max_bytes})")
    try:
        ids = json.loads(data)
    except ValueError:
        raise ValueError("it is not JSON") from None
    if not isinstance(ids, list):
        raise ValueError(f"it is a JSON {type(ids).__name__}, not a list of node ids")
    if len(ids) > MAX_NODES:
        raise ValueError(f"it lists {len(ids)} nodes, more than {MAX_NODES}")
    wrong = next((i for i in ids if not is_node_id(i)), None)
    if wrong is not None:
        raise ValueError(f"{printable(repr(wrong))[:80]} is not a node id")
    return frozenset(ids)


class Members:
    """The leader's nodes put in etcd (``changed``), and the list etcd holds as this server last read it (``known``).

    *current* gives the ids to put, or None while this server should put
    none (it does not lead, or its own fleet is still coming back).
    """

    def __init__(self, clock, client, current: Callable[[], Collection[str] | None], max_bytes: int,
                 interval_s: float = INTERVAL_S):
        self.clock, self.client, self.current = clock, client, current
        self.max_bytes, self.interval_s = max_bytes, interval_s
        self.known: frozenset[str] | None = None  # None: not read yet, or not a list llmgw reads
        self._written: frozenset[str] | None = None
        self._last_put: float | None = None
        self._call = None
        self._putting = self._dirty = False
        self._refused: bytes | None = None

    # -- the leader's puts --

    def changed(self) -> None:
        """The fleet's nodes may have changed: put the list once the interval since the last put has passed."""
        self._dirty = True
        if self._putting or (self._call is not None and self._call.active()):
            return
        now = self.clock.seconds()
        wait = 0.0 if self._last_put is None else max(0.0, self._last_put + self.interval_s - now)
        self._call = self.clock.callLater(wait, self._flush)

    def forget_written(self) -> None:
        """Put the next list even if it is the one last put (another leader may have put its own since)."""
        self._written = None

    def _flush(self) -> None:
        self._call = None
        if not self._dirty:
            return
        self._dirty = False
        ids = self.current()
        if ids is None:
            return
        ids = frozenset(ids)
        if ids == self._written:
            return
        data = encode(ids)
        if len(data) > self.max_bytes:
            log.warn("the fleet's {n} node ids are {size} bytes, more than ha.max_response_bytes ({most}): not put "
                     "in etcd, so a new leader waits fleet.settle_s rather than for each node; raise "
                     "ha.max_response_bytes", n=len(ids), size=len(data), most=self.max_bytes)
            return
        self._putting = True
        self._last_put = self.clock.seconds()
        defer.Deferred.fromCoroutine(self._put(ids, data))

    async def _put(self, ids: frozenset[str], data: bytes) -> None:
        try:
            await self.client.put(KEY, data)
            self._written = ids
        except EtcdError as e:
            log.warn("could not put the fleet's nodes in etcd ({why}); trying again in {s:g} s", why=str(e),
                     s=self.interval_s)
            self._dirty = True
        finally:
            self._putting = False
        if self._dirty:
            self.changed()

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    # -- what etcd holds --

    def heard(self, data: bytes) -> frozenset[str] | None:
        """*data*, the key's value as read or watched: ``known`` from now on, if it is a list llmgw reads."""
        try:
            self.known = decode(data, self.max_bytes)
        except ValueError as e:
            if data[:200] != self._refused:
                self._refused = data[:200]
                log.warn("{key} in etcd is not a list of node ids llmgw reads ({why}): a new leader here waits "
                         "fleet.settle_s rather than for each node", key=KEY.decode(), why=str(e))
            return None
        return self.known

    async def read(self) -> frozenset[str] | None:
        """The list etcd holds now (also ``known``); None when there is none, or etcd does not answer."""
        try:
            kv = await self.client.get(KEY)
        except EtcdError as e:
            log.info("could not read the fleet's nodes from etcd ({why}); the watch brings them", why=str(e))
            return None
        return None if kv is None else self.heard(kv.value)
