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
