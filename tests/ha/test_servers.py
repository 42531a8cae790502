"""The servers' list in etcd on a fake clock: each entry under its own lease, and what another server wrote read warily."""

from __future__ import annotations

import json

import pytest
from twisted.internet import task

from llmgw.ha.etcd import KeyValue
from llmgw.ha.servers import MAX_SERVERS, MAX_VALUE, PREFIX, Servers, server_of
from llmgw.views import ServerRole, ServerView
from tests.ha.fakeetcd import FakeEtcd

LEASE_S = 6.0


@pytest.fixture
def clock():
    return task.Clock()


@pytest.fixture
def etcd(clock):
    return FakeEtcd(clock)


def run(clock, seconds: float, step: float = 0.1) -> None:
    for _ in range(round(seconds / step)):
        clock.advance(step)


def read(servers: Servers) -> list[ServerView]:
    from twisted.internet import defer

    d = defer.Deferred.fromCoroutine(servers.list())
    return d.result  # the fake answers at once


def test_two_servers_list_each_other_with_role_urls_and_epoch(clock, etcd):
    a, b = Servers(clock, etcd.client(), "a", LEASE_S), Servers(clock, etcd.client(), "b", LEASE_S)
    a.start(), b.start()
    a.announce(ServerRole.LEADER, "wss://a:7443/", "https://a:8080", 7, 100.0)
    b.announce(ServerRole.STANDBY, "wss://b:7443/", None, None, 101.0)
    assert read(a) == [
        ServerView("a", ServerRole.LEADER, "wss://a:7443/", "https://a:8080", 7, 100.0),
        ServerView("b", ServerRole.STANDBY, "wss://b:7443/", None, None, 101.0),
    ]
    run(clock, 5 * LEASE_S)  # renewed all along
    assert [v.name for v in read(b)] == ["a", "b"]
    assert [v.name for v in b.known] == ["a", "b"]  # refreshed at each renewal, for ctl status


def test_a_server_that_dies_leaves_the_list_within_its_lease(clock, etcd):
    a, b = Servers(clock, etcd.client(), "a", LEASE_S), Servers(clock, etcd.client(), "b", LEASE_S)
    a.announce(ServerRole.LEADER, "wss://a:7443/", None, 3, 1.0)
    b.announce(ServerRole.STANDBY, "wss://b:7443/", None, None, 1.0)
    a.start(), b.start()
    a._stopped = True  # killed: no renewal, no revoke
    a._call.cancel()
    run(clock, LEASE_S + 1)
    assert [v.name for v in read(b)] == ["b"]


def test_a_role_announced_again_is_written_again_and_stop_revokes_the_entry(clock, etcd):
    a = Servers(clock, etcd.client(), "a", LEASE_S)
    a.start()
    a.announce(ServerRole.STANDBY, "wss://a:7443/", None, None, 1.0)
    a.announce(ServerRole.LEADER, "wss://a:7443/", None, 9, 2.0)
    assert read(a)[0].role is ServerRole.LEADER and read(a)[0].epoch == 9
    a.stop()
    assert PREFIX + b"a" not in etcd.keys


def test_etcd_away_longer_than_the_lease_the_entry_comes_back_under_a_new_lease(clock, etcd):
    client = etcd.client()
    a = Servers(clock, client, "a", LEASE_S)
    a.start()
    a.announce(ServerRole.LEADER, "wss://a:7443/", None, 4, 1.0)
    first = a.lease
    client.down = True
    run(clock, 2 * LEASE_S)
    etcd.expire()  # the fake lets leases go when asked anything
    assert PREFIX + b"a" not in etcd.keys
    client.down = False
    run(clock, LEASE_S)
    assert a.lease != first and json.loads(etcd.keys[PREFIX + b"a"].value)["role"] == "leader"


def kv(name: bytes, value) -> KeyValue:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return KeyValue(PREFIX + name, raw, 5, 5)


GOOD = {"role": "standby", "url": "wss://b:7443/", "api_url": None, "epoch": None, "since": 1.0}


@pytest.mark.parametrize("name, value", [
    (b"b", b"not json"),
    (b"b", b"[1, 2]"),
    (b"b", {**GOOD, "role": "emperor"}),
    (b"b", {**GOOD, "epoch": 0}),
    (b"b", {**GOOD, "epoch": 2**63}),
    (b"b", {**GOOD, "epoch": "7"}),
    (b"b", {**GOOD, "url": "x" * 600}),
    (b"b", {**GOOD, "since": -1}),
    (b"b", {**GOOD, "url": "wss://b\n:7443/"}),
    (b"b", json.dumps({**GOOD, "pad": "x" * MAX_VALUE}).encode()),
    (b"\xff\xfe", GOOD),
    (b"x" * 300, GOOD),
])
def test_an_entry_llmgw_does_not_write_is_left_out(name, value):
    assert server_of(kv(name, value)) is None


def test_a_good_entry_is_read_and_unknown_keys_ignored():
    assert server_of(kv(b"b", {**GOOD, "newer": 1})) == ServerView("b", ServerRole.STANDBY, "wss://b:7443/",
                                                                    None, None, 1.0)


def test_the_list_holds_at_most_max_servers_and_leaves_out_what_is_not_an_entry(clock, etcd):
    for i in range(MAX_SERVERS + 10):
        etcd.store(PREFIX + f"s{i:03}".encode(), json.dumps(GOOD).encode(), 0)
    etcd.store(PREFIX + b"aaa", b"junk", 0)
    a = Servers(clock, etcd.client(), "a", LEASE_S)
    found = read(a)
    assert len(found) == MAX_SERVERS - 1  # the junk one is among the first read, and left out
    assert all(v.name.startswith("s") for v in found)
