"""EtcdClient against a real etcd: keys, the claim, leases that lapse, and a member that cannot or will not answer."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.web import resource, server

from llmgw.ha.etcd import EtcdClient, EtcdClosed, EtcdRefused, EtcdUnavailable, KeyValue, prefix_end
from tests.support.etcd import etcd  # noqa: F401  (a fixture)
from tests.support.net import free_port
from tests.support.wait import until_awaited

pytestmark = pytest.mark.integration


@pytest.fixture
def client(etcd):  # noqa: F811
    made = EtcdClient(reactor, [etcd.client_url], timeout_s=2.0)
    yield made
    pytest_twisted.blockon(made.close())


def test_a_prefix_ends_where_etcd_says():
    assert prefix_end(b"/llmgw/servers/") == b"/llmgw/servers0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


@pytest_twisted.ensureDeferred
async def test_keys_are_put_read_listed_and_deleted(client):
    assert await client.get("/llmgw/nothing") is None
    await client.put("/llmgw/servers/a", b"one")
    await client.put("/llmgw/servers/b", b"\x00\xfftwo")
    await client.put("/llmgw/serversz", b"not under the prefix")
    got = await client.get("/llmgw/servers/a")
    assert (got.key, got.value, got.lease) == (b"/llmgw/servers/a", b"one", 0)
    assert got.create_revision == got.mod_revision > 0
    listed = await client.get_prefix("/llmgw/servers/")
    assert [(kv.key, kv.value) for kv in listed] == [(b"/llmgw/servers/a", b"one"), (b"/llmgw/servers/b", b"\x00\xfftwo")]
    assert await client.delete("/llmgw/servers/", prefix=True) == 2
    assert await client.get_prefix("/llmgw/servers/") == []
    assert (await client.get("/llmgw/serversz")).value == b"not under the prefix"


@pytest_twisted.ensureDeferred
async def test_a_claim_is_won_once_and_a_loser_learns_the_holder(client):
    lease = await client.grant(30)
    won, holder = await client.claim("/llmgw/leader", b'{"name": "a"}', lease)
    assert won and holder.value == b'{"name": "a"}' and holder.lease == lease
    other = await client.grant(30)
    lost, still = await client.claim("/llmgw/leader", b'{"name": "b"}', other)
    assert not lost and still == holder
    assert await client.create("/llmgw/leader", b"c", other) is False
    await client.revoke(lease)  # the key goes with its lease
    assert await client.get("/llmgw/leader") is None
    assert await client.create("/llmgw/leader", b"c", other) is True
    # A key created anew has a later create_revision: the election's epoch grows.
    assert (await client.get("/llmgw/leader")).create_revision > holder.create_revision


@pytest_twisted.ensureDeferred
async def test_a_lease_kept_alive_holds_its_key_and_one_left_lapses_with_it(client):
    kept, left = await client.grant(2), await client.grant(2)
    await client.put("/llmgw/kept", b"k", lease=kept)
    await client.put("/llmgw/left", b"l", lease=left)
    assert await client.keepalive(kept) == 2

    async def left_gone() -> bool:
        await client.keepalive(kept)
        return await client.get("/llmgw/left") is None
    # etcd expires a lease on its own clock: renew one, and wait for the other's key to go.
    await until_awaited(left_gone, "etcd to let the unrenewed lease go", timeout=10, interval=0.2)
    assert await client.keepalive(left) == 0  # etcd no longer has it
    assert (await client.get("/llmgw/kept")).value == b"k"
    await client.revoke(left)  # revoking a lease etcd no longer has is no error
    with pytest.raises(EtcdRefused) as refused:
        await client.put("/llmgw/x", b"x", lease=left)
    assert "requested lease not found" in str(refused.value) and refused.value.code == 5


@pytest_twisted.ensureDeferred
async def test_an_unreachable_member_is_passed_over_and_the_one_that_answers_asked_first(etcd):  # noqa: F811
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(reactor, [dead, etcd.client_url], timeout_s=2.0)
    try:
        await client.put("/k", b"v")
        assert client.current == 1
        assert (await client.get("/k")).value == b"v"
    finally:
        await client.close()
    alone = EtcdClient(reactor, [dead], timeout_s=2.0)
    with pytest.raises(EtcdUnavailable) as failed:
        await alone.get("/k")
    assert dead in str(failed.value) and "check ha.etcd" in str(failed.value)
    await alone.close()
    with pytest.raises(EtcdClosed):
        await alone.get("/k")


class Hostile(resource.Resource):
    """A member that answers wrongly: what it answers is set per test."""

    isLeaf = True

    def __init__(self, body: bytes | None, chunked: bool):
        super().__init__()
        self.body, self.chunked = body, chunked

    def render_POST(self, request):
        if self.body is None:
            return server.NOT_DONE_YET  # holds the request open
        request.setHeader(b"content-type", b"application/json")
        if not self.chunked:
            return self.body
        for start in range(0, len(self.body), 4096):  # no Content-Length: read until too much has come
            request.write(self.body[start:start + 4096])
        request.finish()
        return server.NOT_DONE_YET


HOSTILE = {
    "too long": (b"x" * (70 * 1024), False, "70 KiB bytes, more than ha.max_response_bytes (65536)"),
    "too long, chunked": (b"x" * (70 * 1024), True, "more than ha.max_response_bytes (65536)"),
    "html": (b"<html>proxy error</html>", False, "not JSON"),
    "a list": (b"[1, 2]", False, "not an object"),
    "a key not base64": (json.dumps({"kvs": [{"key": "!!", "value": "dg=="}]}).encode(), False, "key is not base64"),
    "a revision not an int64": (json.dumps({"kvs": [{"key": "aw==", "create_revision": "1e99"}]}).encode(), False,
                                "create_revision is not an int64"),
    "silence": (None, False, "no answer within 0.5 s (ha.request_timeout_s)"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest_twisted.ensureDeferred
async def test_a_member_that_answers_wrongly_is_named_and_passed_over(etcd, case):  # noqa: F811
    body, chunked, words = HOSTILE[case]
    words = words.replace("70 KiB", str(70 * 1024))
    port = reactor.listenTCP(0, server.Site(Hostile(body, chunked)), interface="127.0.0.1")
    hostile = f"http://127.0.0.1:{port.getHost().port}"
    try:
        alone = EtcdClient(reactor, [hostile], timeout_s=0.5, max_response_bytes=65536)
        with pytest.raises(EtcdUnavailable) as refused:
            await alone.get("/k")
        assert hostile in str(refused.value) and words in str(refused.value)
        await alone.close()
        both = EtcdClient(reactor, [hostile, etcd.client_url], timeout_s=0.5, max_response_bytes=65536)
        assert await both.get("/k") is None
        assert both.current == 1
        await both.close()
    finally:
        await port.stopListening()


def test_a_key_value_is_a_value():
    assert KeyValue(b"k", b"v", 1, 2) == KeyValue(b"k", b"v", 1, 2, 0)
