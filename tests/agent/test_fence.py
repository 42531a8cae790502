"""The node's fence: the newest leader's epoch kept on disk, an older leader's command refused and logged once.

Real files in a temporary state directory; the link is a stand-in session
(the real agent process is tests/agent/test_fence_process.py).
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer
from twisted.logger import capturedLogs, formatEvent

from llmgw.agent.fence import EPOCH_FILE, FENCED, Fence, register
from llmgw.huburl import parse_hub_url
from llmgw.link import uris
from llmgw.link.hubs import HubList

START = uris.node_uri("node01", uris.NODE_START_SHARD)


def refused(fence: Fence, epoch) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        fence.check(START, epoch)
    return caught.value


def lines(events) -> list[str]:
    return [formatEvent(e) for e in events if e.get("log_namespace") == "llmgw.agent.fence"]


def test_a_node_takes_equal_and_newer_epochs_and_refuses_older_ones_in_words(tmp_path):
    fence = Fence(tmp_path / "state")
    assert fence.seen is None
    fence.check(START, None)  # no ha: nothing to fence
    fence.check(START, 5)
    assert fence.seen == 5 and (tmp_path / "state" / EPOCH_FILE).read_text() == "5\n"
    fence.check(START, 5)
    fence.check(START, None)  # a server without ha: after one with it: still taken
    fence.check(START, 9)
    no = refused(fence, 4)
    assert (no.error, no.args) == (uris.ERROR_REFUSED, (
        "refused a command of epoch 4: this node has seen epoch 9 (a newer leader); "
        "the server that sent it no longer leads",))
    assert fence.seen == 9


def test_the_newest_epoch_outlives_the_agent(tmp_path):
    Fence(tmp_path).check(START, 12)
    again = Fence(tmp_path)
    assert again.seen == 12
    assert refused(again, 11).error == uris.ERROR_REFUSED
    again.check(START, 12)


def test_each_old_epoch_is_logged_once_however_often_it_is_refused(tmp_path):
    fence = Fence(tmp_path)
    with capturedLogs() as events:
        fence.check(START, 7)
        for epoch in (6, 6, 6, 5, 6, 5):
            refused(fence, epoch)
    said = lines(events)
    assert said[0] == "the leader's epoch is 7 (" + START + "); commands of older epochs are refused from now on"
    assert said[1:] == [f"{START}: refused a command of epoch {n}: this node has seen epoch 7 (a newer leader); "
                        "the server that sent it no longer leads" for n in (6, 5)]


def test_an_epoch_that_is_no_whole_number_is_refused_as_the_caller_s_mistake(tmp_path):
    fence = Fence(tmp_path)
    for wrong in ("5", 0, -1, True, 2**63, [5]):
        no = refused(fence, wrong)
        assert no.error == uris.ERROR_INVALID_ARGUMENT and no.args[0].startswith(f"{START}'s epoch: an epoch is"), wrong
    assert fence.seen is None and not (tmp_path / EPOCH_FILE).exists()


def test_a_damaged_epoch_file_is_said_and_the_node_goes_on(tmp_path):
    (tmp_path / EPOCH_FILE).write_text("five\n")
    with capturedLogs() as events:
        fence = Fence(tmp_path)
    assert fence.seen is None
    assert any(str(tmp_path / EPOCH_FILE) in line and "check the disk, or remove the file" in line
               for line in lines(events))
    fence.check(START, 3)
    assert Fence(tmp_path).seen == 3


def test_only_the_procedures_that_change_the_node_take_an_epoch(tmp_path):
    fence = Fence(tmp_path)
    fence.check(START, 8)
    calls = []

    def procedure(*args, **kwargs):
        calls.append((args, kwargs))
        return "done"

    for verb in (uris.NODE_PING, uris.NODE_LOGS):
        assert fence.guarded(verb, uris.node_uri("node01", verb), procedure) is procedure
    assert FENCED == {uris.NODE_START_SHARD, uris.NODE_STOP_SHARD, uris.NODE_DRAIN_SHARD, uris.NODE_CORDON,
                      uris.NODE_COLLECT_WEIGHTS, uris.NODE_SET_ENGINES}
    for verb in FENCED:
        guarded = fence.guarded(verb, uris.node_uri("node01", verb), procedure)
        assert guarded("a", epoch=8, other=1) == "done"
        assert guarded("b") == "done"
        with pytest.raises(ApplicationError):
            guarded("c", epoch=7)
    # The epoch is taken off before the procedure sees the call; a refused one never reaches it.
    assert calls == [(("a",), {"other": 1}), (("b",), {})] * len(FENCED)


class Session:
    """What ``register`` asks of a link session: a call, answered by *answer*, and leaving."""

    def __init__(self, answer):
        self.answer = answer
        self.left = 0

    def call(self, uri, inventory):
        assert uri == uris.AGENT_REGISTER
        if isinstance(self.answer, Exception):
            return defer.fail(self.answer)
        return defer.succeed(self.answer)

    def leave(self):
        self.left += 1


HUBS = ["wss://a.example.org:7443/", "wss://b.example.org:7443/"]


@pytest_twisted.ensureDeferred
async def test_registering_learns_the_leader_s_epoch_and_leaves_a_standby_or_an_old_leader(tmp_path):
    fence, hubs = Fence(tmp_path), HubList.of(HUBS)
    session = Session({"node_id": "node01", "epoch": 5})
    assert await register(session, hubs, fence, {}) == {"node_id": "node01", "epoch": 5}
    assert (fence.seen, session.left, hubs.refused) == (5, 0, False)

    standby = Session(ApplicationError(uris.ERROR_STANDBY, "standby; the leader is b at wss://b.example.org:7443/",
                                       leader_url="wss://B.example.org:7443/"))
    assert await register(standby, hubs, fence, {}) is None
    assert standby.left == 1 and hubs.refused
    assert hubs.after_refusal() == (
        "the hub at wss://a.example.org:7443/ stands by (standby; the leader is b at wss://b.example.org:7443/); "
        "going to the leader's hub, wss://b.example.org:7443/, now", True)

    old = Session({"node_id": "node01", "epoch": 4})
    assert await register(old, hubs, fence, {}) is None
    assert old.left == 1 and fence.seen == 5
    said, at_once = hubs.after_refusal()
    assert not at_once and said == (
        "the hub at wss://b.example.org:7443/ stands by (it answered as the leader of epoch 4, but this node has seen "
        "epoch 5: it no longer leads); trying wss://a.example.org:7443/")

    with pytest.raises(ApplicationError):  # any other refusal is the session's to handle, as before
        await register(Session(ApplicationError(uris.ERROR_REFUSED, "no")), hubs, fence, {})
    assert hubs.current == parse_hub_url(HUBS[0])
