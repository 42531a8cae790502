"""A watch on a real etcd: puts and deletions under its prefix reach the callback, until it stops."""

from __future__ import annotations

import pytest
import pytest_twisted

from llmgw.ha.watch import WatchKind
from tests.ha.test_etcd import client  # noqa: F401  (a fixture)
from tests.support.etcd import etcd  # noqa: F401  (a fixture)
from tests.support.wait import until, until_awaited

pytestmark = pytest.mark.integration


@pytest_twisted.ensureDeferred
async def test_a_watch_sees_puts_and_deletes_under_its_prefix_and_stops(client):
    seen = []
    watch = client.watch("/llmgw/servers/", seen.extend, prefix=True)
    # The watch is created by the time a put made after it is seen; a put before may or may not be.
    await until_put_seen(client, seen, "/llmgw/servers/a")
    await client.put("/llmgw/other", b"x")
    await client.delete("/llmgw/servers/a")
    await until(lambda: any(e.kind is WatchKind.DELETE for e in seen), "the deletion to be seen")
    assert {e.kv.key for e in seen} == {b"/llmgw/servers/a"}
    watch.stop()
    assert watch not in client.watches


async def until_put_seen(client, seen, key):
    async def put_and_look():
        await client.put(key, b"v")
        return any(e.kv.key == key.encode() for e in seen)
    await until_awaited(put_and_look, f"a put of {key} to reach the watch")


