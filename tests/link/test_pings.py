"""Auto-pings only on a quiet link: a heartbeating peer is not sent ping frames it does not need.

The protocols are the hub's and the client's own classes, driven by a
``task.Clock``; only the frame they would send is caught.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet import task

from llmgw.link.client import _Protocol
from llmgw.link.peer import HubProtocol
from llmgw.link.session import sweep_pings


class _Timer:
    """The factory's batched timer, on the test's clock."""

    def __init__(self, clock):
        self.clock = clock

    def call_later(self, delay, call):
        return self.clock.callLater(delay, call)


def _link(cls, clock):
    proto = cls()
    proto.factory = SimpleNamespace(reactor=clock, _batched_timer=_Timer(clock))
    proto.autoPingInterval, proto.autoPingTimeout, proto.autoPingSize = 10, 0, 16
    proto.autoPingPendingSeq = 0
    pings = []
    proto.sendPing = lambda payload=None: pings.append(clock.seconds())
    return proto, pings


@pytest.mark.parametrize("cls", [HubProtocol, _Protocol], ids=["hub", "client"])
def test_a_link_that_keeps_talking_is_not_pinged(cls):
    clock = task.Clock()
    proto, pings = _link(cls, clock)
    proto.autoPingPendingCall = clock.callLater(10, proto._sendAutoPing)  # as autobahn schedules it on open
    for _ in range(12):  # a heartbeat's answer every 5 s for a minute
        clock.advance(5)
        proto.heard()
    assert pings == []


@pytest.mark.parametrize("cls", [HubProtocol, _Protocol], ids=["hub", "client"])
def test_a_quiet_link_is_pinged_an_interval_after_it_last_heard(cls):
    clock = task.Clock()
    proto, pings = _link(cls, clock)
    proto.autoPingPendingCall = clock.callLater(10, proto._sendAutoPing)
    clock.advance(4)
    proto.heard()  # at 4 s: the ping due at 10 s waits until 14 s
    clock.advance(6)
    assert pings == []
    clock.advance(4)
    assert pings == [14]


# -- the sweep: one timer per reactor, not one per link --


def _swept(cls, clock, n=1):
    links, pings = [], []
    real = _Timer(clock)
    factory = SimpleNamespace(reactor=clock, _batched_timer=real)
    sweep_pings(factory)
    for _ in range(n):
        proto = cls()
        proto.factory = factory
        proto.autoPingInterval, proto.autoPingTimeout, proto.autoPingSize = 10, 0, 16
        proto.autoPingPendingSeq = 0
        proto.sendPing = lambda payload=None, proto=proto: pings.append((proto, clock.seconds()))
        # As autobahn schedules it when the link opens.
        proto.autoPingPendingCall = factory._batched_timer.call_later(proto.autoPingInterval, proto._sendAutoPing)
        links.append(proto)
    return links, pings


@pytest.mark.parametrize("cls", [HubProtocol, _Protocol], ids=["hub", "client"])
def test_a_thousand_links_wait_on_one_timer(cls):
    clock = task.Clock()
    links, pings = _swept(cls, clock, n=1000)
    assert len(clock.getDelayedCalls()) == 1
    for _ in range(12):  # every link hears an answer every 5 s for a minute
        clock.advance(5)
        for proto in links:
            proto.heard()
    assert pings == []
    assert len(clock.getDelayedCalls()) == 1


@pytest.mark.parametrize("cls", [HubProtocol, _Protocol], ids=["hub", "client"])
def test_a_quiet_link_in_the_sweep_is_pinged_within_a_quarter_interval_of_going_quiet(cls):
    clock = task.Clock()
    (talker, quiet), pings = _swept(cls, clock, n=2)
    for step in range(1, 39):  # to 19 s in half seconds, so the sweep reads its own time
        clock.advance(0.5)
        talker.heard()
        if step == 8:
            quiet.heard()  # at 4 s; it says nothing more
    # 19 s: quiet since 4 s, so due from 14 s; the sweep runs every 2.5 s.
    assert [(p, t) for p, t in pings] == [(quiet, 15.0)]


@pytest.mark.parametrize("cls", [HubProtocol, _Protocol], ids=["hub", "client"])
def test_after_its_pong_a_link_waits_in_the_sweep_again(cls):
    clock = task.Clock()
    (proto,), pings = _swept(cls, clock)
    clock.advance(10)
    assert [t for _, t in pings] == [10.0]
    # autobahn, on the pong: the next ping an interval on.
    proto.heard()
    proto.autoPingPendingCall = proto.factory._batched_timer.call_later(10, proto._sendAutoPing)
    clock.advance(10)
    assert [t for _, t in pings] == [10.0, 20.0]


@pytest.mark.parametrize("cls", [HubProtocol, _Protocol], ids=["hub", "client"])
def test_a_closed_link_leaves_the_sweep_and_its_timer_stops(cls):
    clock = task.Clock()
    (proto,), pings = _swept(cls, clock)
    proto.autoPingPendingCall.cancel()  # autobahn does this when the connection is lost
    clock.advance(60)
    assert pings == []
    assert clock.getDelayedCalls() == []


def test_other_timers_of_the_factory_pass_through_to_autobahns():
    clock = task.Clock()
    (proto,), _ = _swept(HubProtocol, clock)
    fired = []
    proto.factory._batched_timer.call_later(3, lambda: fired.append(clock.seconds()))
    clock.advance(3)
    assert fired == [3.0]
