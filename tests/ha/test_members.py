"""The leader's nodes in etcd: put when they change, at most once a second; read back only when a list of ids."""

from __future__ import annotations

import pytest
from twisted.internet import defer, task
from twisted.logger import capturedLogs, formatEvent

from llmgw.ha.members import KEY, MAX_NODES, Members, decode, encode
from tests.ha.fakeetcd import FakeEtcd

MAX_BYTES = 65536


def members(clock, etcd, ids):
    return Members(clock, etcd.client(), lambda: ids[0], MAX_BYTES)


def test_the_list_is_put_when_it_changes_at_most_once_a_second_and_only_what_changed():
    clock = task.Clock()
    etcd = FakeEtcd(clock)
    ids = [["node01"]]
    m = members(clock, etcd, ids)
    m.changed()
    clock.advance(0)
    assert etcd.keys[KEY].value == b'["node01"]'
    first = etcd.keys[KEY].mod_revision
    ids[0] = ["node02", "node01"]
    m.changed()
    m.changed()
    clock.advance(0.5)
    assert etcd.keys[KEY].mod_revision == first  # not within the second
    clock.advance(0.5)
    assert etcd.keys[KEY].value == b'["node01","node02"]'
    second = etcd.keys[KEY].mod_revision
    m.changed()  # a heartbeat's event: the same nodes
    clock.advance(2)
    assert etcd.keys[KEY].mod_revision == second
    m.forget_written()  # another leader may have put its own since
    m.changed()
    clock.advance(0)
    assert etcd.keys[KEY].mod_revision > second


def test_nothing_is_put_while_the_server_may_not_say_and_a_failed_put_is_tried_again():
    clock = task.Clock()
    etcd = FakeEtcd(clock)
    ids = [None]
    m = members(clock, etcd, ids)
    m.changed()
    clock.advance(1)
    assert KEY not in etcd.keys
    ids[0] = ["node01"]
    etcd.down = True
    with capturedLogs() as events:
        m.changed()
        clock.advance(0)
    assert [formatEvent(e) for e in events] == [
        "could not put the fleet's nodes in etcd (no etcd member answered put (fake: down)); trying again in 1 s"]
    etcd.down = False
    clock.advance(1)
    assert etcd.keys[KEY].value == b'["node01"]'


def test_a_list_too_long_for_etcd_is_not_put_and_says_which_key_to_raise():
    clock = task.Clock()
    etcd = FakeEtcd(clock)
    many = [f"node{i:05d}" for i in range(8000)]
    m = members(clock, etcd, [many])
    with capturedLogs() as events:
        m.changed()
        clock.advance(0)
    assert KEY not in etcd.keys
    assert "raise ha.max_response_bytes" in formatEvent(events[0])


def test_what_is_read_back_is_the_list_when_it_is_one_llmgw_writes():
    clock = task.Clock()
    etcd = FakeEtcd(clock)
    m = members(clock, etcd, [None])
    assert m.heard(encode(["node02", "node01"])) == frozenset({"node01", "node02"})
    assert m.known == frozenset({"node01", "node02"})
    with capturedLogs() as events:
        assert m.heard(b'["node01", "../etc"]') is None
        assert m.heard(b'["node01", "../etc"]') is None  # logged once
    assert m.known == frozenset({"node01", "node02"})  # the last good list stays
    assert [formatEvent(e) for e in events] == [
        "/llmgw/nodes in etcd is not a list of node ids llmgw reads ('../etc' is not a node id): a new leader here "
        "waits fleet.settle_s rather than for each node"]


@pytest.mark.parametrize("data, most, why", [
    (b"not json", MAX_BYTES, "it is not JSON"),
    (b'{"node01": 1}', MAX_BYTES, "it is a JSON dict, not a list of node ids"),
    (b"[1]", MAX_BYTES, "1 is not a node id"),
    (b'["\\u001b[31m"]', MAX_BYTES, "'\\x1b[31m' is not a node id"),
    (encode([f"n{i}" for i in range(MAX_NODES + 1)]), 10**8, f"it lists {MAX_NODES + 1} nodes, more than {MAX_NODES}"),
    (b"[" + b" " * MAX_BYTES + b"]", MAX_BYTES, f"it is {MAX_BYTES + 2} bytes, more than ha.max_response_bytes "
                                                f"({MAX_BYTES})"),
])
def test_a_value_that_is_not_a_list_of_node_ids_is_refused_saying_why(data, most, why):
    with pytest.raises(ValueError) as refused:
        decode(data, most)
    assert str(refused.value) == why


def answer(coroutine):
    results: list = []
    defer.Deferred.fromCoroutine(coroutine).addBoth(results.append)
    return results[0]


def test_a_read_gives_the_list_or_none_when_etcd_has_none_or_does_not_answer():
    clock = task.Clock()
    etcd = FakeEtcd(clock)
    m = members(clock, etcd, [None])
    assert answer(m.read()) is None
    etcd.store(KEY, b'["node07"]', 0)
    assert answer(m.read()) == frozenset({"node07"})
    etcd.down = True
    assert answer(m.read()) is None and m.known == frozenset({"node07"})
