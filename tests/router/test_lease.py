"""A lease: released once, with a known outcome, and it frees the share it counted against."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from llmgw.router.lease import OUTCOMES

from .test_admission import admit, dispatcher, result


def test_a_lease_is_released_once_and_gives_its_flow_back():
    d = dispatcher(Clock(), limit=2)
    lease = result(admit(d, client="10.0.0.1"))
    assert lease.flow.held == 1 and lease.attempt == 1
    lease.release("ok")
    lease.release("ok")
    assert lease.flow.held == 0 and d.endpoints("echo")[0].inflight == 0


def test_an_unknown_outcome_is_refused_naming_those_known():
    lease = result(admit(dispatcher(Clock())))
    with pytest.raises(ValueError, match=", ".join(OUTCOMES)):
        lease.release("fine")


def test_an_ipv6_client_has_one_share_per_64_however_many_addresses_it_uses():
    from llmgw.router.lease import share_of

    assert share_of("2001:db8:1:2::1") == share_of("2001:db8:1:2:ffff::7") == "2001:db8:1:2::/64"
    assert share_of("2001:db8:1:3::1") != share_of("2001:db8:1:2::1")
    assert share_of("::ffff:10.0.0.5") == "10.0.0.5"
    assert share_of("10.0.0.5") == "10.0.0.5"
    assert share_of("not an address") == "not an address"
