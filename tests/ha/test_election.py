"""The election on a fake clock and an etcd in memory: who leads, when a leader must stop commanding, and who follows."""

from __future__ import annotations

import json

import pytest
from twisted.internet import task

from llmgw.ha.election import (
    LEADER_KEY,
    TABLE,
    Election,
    ElectionInput,
    ElectionState,
    Leader,
    leader_of,
)
from llmgw.ha.etcd import KeyValue
from tests.ha.fakeetcd import FakeEtcd

LEASE_S = 6.0
MARGIN_S = 1.0
URL_A, URL_B = "wss://a.example:7443/", "wss://b.example:7443/"


@pytest.fixture
def clock():
    return task.Clock()


@pytest.fixture
def etcd(clock):
    return FakeEtcd(clock)


def server(clock, etcd, name, url):
    client = etcd.client()
    election = Election(clock, client, name, url, LEASE_S, margin_s=MARGIN_S)
    election.told = []
    election.listeners.append(lambda e: e.told.append((e.leading, e.epoch, e.leader)))
    return election, client


def run(clock, seconds: float, step: float = 0.1) -> None:
    """The reactor running for *seconds*: every timer due on the way fires in order."""
    for _ in range(round(seconds / step)):
        clock.advance(step)


def test_the_table_walked_pair_by_pair(clock, etcd):
    for state in ElectionState:
        for given in ElectionInput:
            election, _ = server(clock, etcd, "a", URL_A)
            election.state = state
            moved = election.feed(given)
            expected = TABLE.get((state, given))
            assert moved == (expected is not None), (state, given)
            assert election.state is (expected or state), (state, given)


def test_a_lone_server_campaigns_and_leads_with_the_key_s_create_revision_as_its_epoch(clock, etcd):
    a, _ = server(clock, etcd, "a", URL_A)
    a.start()
    clock.advance(0)
    kv = etcd.keys[LEADER_KEY]
    assert a.state is ElectionState.LEADING and a.leading
    assert a.epoch == kv.create_revision
    assert a.leader == Leader("a", URL_A, kv.create_revision)
    assert json.loads(kv.value) == {"name": "a", "url": URL_A}
    assert a.told == [(True, kv.create_revision, a.leader)]
    assert a.can_command(clock.seconds())


def test_a_leader_renews_its_lease_and_keeps_commanding(clock, etcd):
    a, client = server(clock, etcd, "a", URL_A)
    a.start()
    run(clock, 10 * LEASE_S)
    assert a.leading and a.can_command(clock.seconds())
    assert client.calls.count("keepalive") >= 25  # every lease_s / 3
    assert len(a.told) == 1  # renewals change nothing anyone listens for


def test_a_leader_that_cannot_renew_stops_commanding_at_its_deadline_and_steps_down(clock, etcd):
    a, client = server(clock, etcd, "a", URL_A)
    a.start()
    run(clock, 5.0)
    renewed = a.renewed_at
    deadline = renewed + LEASE_S - MARGIN_S
    client.down = True
    while clock.seconds() + 0.1 < deadline:
        clock.advance(0.1)
        assert a.leading and a.can_command(clock.seconds())
    assert not a.can_command(deadline)
    clock.advance(deadline - clock.seconds())
    assert not a.leading and a.epoch is None and a.state is ElectionState.CAMPAIGNING
    assert a.told[-1] == (False, None, None)


def test_a_leader_stopped_past_its_deadline_refuses_at_once_before_it_has_noticed(clock, etcd):
    a, _ = server(clock, etcd, "a", URL_A)
    a.start()
    run(clock, 2.0)
    first = a.epoch
    # SIGSTOP for longer than a lease: the clock moves, and nothing of the server runs.
    clock.rightNow += LEASE_S + 1
    assert a.leading  # it has not noticed
    assert not a.can_command(clock.seconds())
    clock.advance(0)  # SIGCONT: the overdue renewal finds the lease gone
    # It stepped down, and (alone here) won again: under a new epoch, which agents tell from the old.
    assert a.told[1] == (False, None, None)
    assert a.told[2][0] is True and a.epoch > first


def test_a_leader_resumed_inside_its_lease_refuses_until_a_renewal_succeeds(clock, etcd):
    a, _ = server(clock, etcd, "a", URL_A)
    a.start()
    run(clock, 2.0)
    clock.rightNow = a.renewed_at + LEASE_S - MARGIN_S / 2  # past the deadline, inside etcd's lease
    assert a.leading and not a.can_command(clock.seconds())
    clock.advance(0)  # the renewal sent now is taken: no one else can have led meanwhile
    assert a.leading and a.can_command(clock.seconds())


def test_a_standby_names_the_leader_and_wins_with_a_higher_epoch_once_the_lease_lapses(clock, etcd):
    a, a_client = server(clock, etcd, "a", URL_A)
    b, _ = server(clock, etcd, "b", URL_B)
    a.start()
    clock.advance(0)
    b.start()
    clock.advance(0)
    assert b.state is ElectionState.STANDBY and not b.leading
    assert b.leader == a.leader == Leader("a", URL_A, a.epoch)
    first = a.epoch
    # When b wins, a must already have stopped commanding.
    a_at_b_s_win = []
    b.listeners.append(lambda e: e.leading and a_at_b_s_win.append(a.can_command(clock.seconds())))
    a_client.down = True
    cut = clock.seconds()
    while not b.leading:
        clock.advance(0.1)
        assert clock.seconds() - cut < LEASE_S + LEASE_S / 3 + 0.5, "b did not take over in time"
    assert a_at_b_s_win == [False] and not a.leading
    assert b.epoch > first and b.leader == Leader("b", URL_B, b.epoch)
    a_client.down = False
    run(clock, LEASE_S)
    assert a.state is ElectionState.STANDBY and a.leader == b.leader


def test_a_leader_that_stops_hands_over_at_once(clock, etcd):
    a, _ = server(clock, etcd, "a", URL_A)
    b, _ = server(clock, etcd, "b", URL_B)
    a.start()
    b.start()
    clock.advance(0)
    assert a.leading and b.state is ElectionState.STANDBY
    stopped = a.stop()
    assert stopped.called and a.state is ElectionState.STOPPED and not a.leading
    clock.advance(0)  # b watched the key go
    assert b.leading and b.epoch > a.told[0][1]


def test_with_etcd_lost_no_one_leads_and_one_does_when_it_is_back(clock, etcd):
    a, _ = server(clock, etcd, "a", URL_A)
    b, _ = server(clock, etcd, "b", URL_B)
    a.start()
    b.start()
    clock.advance(0)
    first = a.epoch
    etcd.down = True
    run(clock, 3 * LEASE_S)
    assert not a.leading and not b.leading
    assert not a.can_command(clock.seconds())
    etcd.down = False
    run(clock, 2 * LEASE_S)
    leaders = [e for e in (a, b) if e.leading]
    assert len(leaders) == 1 and leaders[0].epoch > first


def test_a_leader_whose_key_an_operator_deleted_steps_down_and_stands_again(clock, etcd):
    a, _ = server(clock, etcd, "a", URL_A)
    a.start()
    clock.advance(0)
    first = a.epoch
    etcd.client().delete(LEADER_KEY)
    assert not a.leading
    clock.advance(0)
    assert a.leading and a.epoch > first
    assert [t[0] for t in a.told] == [True, False, True]


@pytest.mark.parametrize("value", [b"not json", b"[1]", b'{"name": 5, "url": "x"}', b"x" * 5000])
def test_a_leader_key_llmgw_did_not_write_names_no_leader(value):
    assert leader_of(KeyValue(LEADER_KEY, value, 7, 7)) is None


def test_a_leader_s_words_are_made_printable_and_short():
    kv = KeyValue(LEADER_KEY, json.dumps({"name": "a\x1b[2J" + "y" * 500, "url": "u"}).encode(), 9, 9)
    leader = leader_of(kv)
    assert leader.name.startswith("a\\x1b[2J") and len(leader.name) == 256 and leader.epoch == 9


def test_a_margin_as_long_as_the_lease_is_refused(clock, etcd):
    with pytest.raises(ValueError, match="must be less than the lease"):
        Election(clock, etcd.client(), "a", URL_A, 5, margin_s=5)
