"""An etcd in memory on a fake clock, with EtcdClient's methods, for the election's unit tests.

Several clients (one per server) share one ``FakeEtcd``; ``down`` makes
every call of every client fail as an unreachable etcd does, and a client's
own ``down`` cuts that one server off.  Leases lapse on the clock, as etcd's
do; revisions grow by one per change, so a key created anew has a later
``create_revision``.  test_fakeetcd.py runs the same checks against it and a
real etcd, so it cannot drift from what EtcdClient does.
"""

from __future__ import annotations

from twisted.internet import defer

from llmgw.ha.etcd import EtcdUnavailable, KeyValue, as_bytes
from llmgw.ha.watch import WatchEvent, WatchKind


class FakeEtcd:
    def __init__(self, clock):
        self.clock = clock
        self.revision = 1
        self.keys: dict[bytes, KeyValue] = {}
        self.leases: dict[int, tuple[int, float]] = {}  # id -> (ttl, expires at)
        self.next_lease = 100
        self.watchers: list[tuple[bytes, object, FakeClient]] = []
        self.down = False

    def expire(self) -> None:
        now = self.clock.seconds()
        for lease, (_, at) in list(self.leases.items()):
            if at <= now:
                self.drop_lease(lease)

    def drop_lease(self, lease: int) -> None:
        self.leases.pop(lease, None)
        for key, kv in list(self.keys.items()):
            if kv.lease == lease:
                self.remove(key)

    def remove(self, key: bytes) -> None:
        self.revision += 1
        del self.keys[key]
        self.tell(WatchEvent(WatchKind.DELETE, KeyValue(key, b"", 0, self.revision)))

    def store(self, key: bytes, value: bytes, lease: int) -> KeyValue:
        self.revision += 1
        old = self.keys.get(key)
        kv = KeyValue(key, value, old.create_revision if old else self.revision, self.revision, lease)
        self.keys[key] = kv
        self.tell(WatchEvent(WatchKind.PUT, kv))
        return kv

    def tell(self, event: WatchEvent) -> None:
        for key, callback, client, prefix in list(self.watchers):
            # A server cut off from etcd hears nothing of it.
            hit = event.kv.key.startswith(key) if prefix else key == event.kv.key
            if hit and not client.down and not self.down:
                callback([event])

    def client(self) -> FakeClient:
        return FakeClient(self)


class _Watch:
    def __init__(self, etcd: FakeEtcd, entry):
        self.etcd, self.entry = etcd, entry

    def stop(self) -> None:
        if self.entry in self.etcd.watchers:
            self.etcd.watchers.remove(self.entry)


class FakeClient:
    """One server's client of a FakeEtcd; its answers come at once (or fail while it or etcd is down)."""

    def __init__(self, etcd: FakeEtcd):
        self.etcd = etcd
        self.down = False
        self.calls: list[str] = []

    def _ask(self, what: str, work):
        self.calls.append(what)
        if self.down or self.etcd.down:
            return defer.fail(EtcdUnavailable(f"no etcd member answered {what} (fake: down)"))
        self.etcd.expire()
        return defer.succeed(work())

    def get(self, key):
        return self._ask("get", lambda: self.etcd.keys.get(as_bytes(key)))

    def get_prefix(self, prefix):
        return self._ask("get_prefix", lambda: [kv for k, kv in sorted(self.etcd.keys.items())
                                                if k.startswith(as_bytes(prefix))])

    def put(self, key, value, lease=None):
        return self._ask("put", lambda: self.etcd.store(as_bytes(key), value, lease or 0) and None)

    def claim(self, key, value, lease):
        def claim():
            key_ = as_bytes(key)
            if key_ in self.etcd.keys:
                return False, self.etcd.keys[key_]
            if lease not in self.etcd.leases:
                raise AssertionError("the fake was asked to put a key under a lease it does not have")
            return True, self.etcd.store(key_, value, lease)
        return self._ask("claim", claim)

    def grant(self, ttl_s):
        def grant():
            self.etcd.next_lease += 1
            self.etcd.leases[self.etcd.next_lease] = (ttl_s, self.etcd.clock.seconds() + ttl_s)
            return self.etcd.next_lease
        return self._ask("grant", grant)

    def keepalive(self, lease):
        def keepalive():
            if lease not in self.etcd.leases:
                return 0
            ttl, _ = self.etcd.leases[lease]
            self.etcd.leases[lease] = (ttl, self.etcd.clock.seconds() + ttl)
            return ttl
        return self._ask("keepalive", keepalive)

    def revoke(self, lease):
        return self._ask("revoke", lambda: self.etcd.drop_lease(lease))

    def delete(self, key, prefix=False):
        def delete():
            key_ = as_bytes(key)
            gone = [k for k in self.etcd.keys if (k.startswith(key_) if prefix else k == key_)]
            for k in gone:
                self.etcd.remove(k)
            return len(gone)
        return self._ask("delete", delete)

    def close(self):
        self.down = True
        return defer.succeed(None)

    def watch(self, key, callback, prefix=False):
        entry = (as_bytes(key), callback, self, prefix)
        self.etcd.watchers.append(entry)
        return _Watch(self.etcd, entry)
