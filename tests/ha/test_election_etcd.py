"""Two elections on one real etcd: the one cut off stops commanding by its deadline, the other leads with a higher epoch."""

from __future__ import annotations

import time

import pytest
import pytest_twisted
from twisted.internet import reactor

from llmgw.ha.election import Election, ElectionState, Leader
from llmgw.ha.etcd import EtcdClient
from tests.support.etcd import etcd  # noqa: F401  (a fixture)
from tests.support.wait import until

pytestmark = pytest.mark.integration

LEASE_S = 2


@pytest_twisted.ensureDeferred
async def test_the_standby_leads_within_a_lease_of_the_leader_losing_etcd(etcd):  # noqa: F811
    clients = [EtcdClient(reactor, [etcd.client_url], timeout_s=0.5) for _ in range(2)]
    a = Election(reactor, clients[0], "a", "wss://a:7443/", LEASE_S, margin_s=0.5)
    b = Election(reactor, clients[1], "b", "wss://b:7443/", LEASE_S, margin_s=0.5)
    try:
        a.start()
        await until(lambda: a.leading, "a to lead")
        b.start()
        await until(lambda: b.state is ElectionState.STANDBY and b.leader is not None, "b to stand by")
        first = a.epoch
        assert b.leader == Leader("a", "wss://a:7443/", first)
        a_when_b_won = []
        b.listeners.append(lambda e: e.leading and a_when_b_won.append(a.can_command(reactor.seconds())))
        cut = time.monotonic()
        await clients[0].close()  # a's renewals fail from now on, as if etcd were gone for it alone
        await until(lambda: b.leading, "b to lead", timeout=LEASE_S + 5)
        took = time.monotonic() - cut
        assert took < LEASE_S + LEASE_S / 3 + 1.0, f"b led {took:.2f} s after a lost etcd"
        assert a_when_b_won == [False] and not a.leading
        assert b.epoch > first and b.leader == Leader("b", "wss://b:7443/", b.epoch)
    finally:
        await b.stop()
        await a.stop()
        for client in clients:
            await client.close()
