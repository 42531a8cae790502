"""Several hubs: the next after a failure, the leader a standby names (only one of the client's own), never a spin."""

from __future__ import annotations

from twisted.internet import defer, error, task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs, formatEvent
from twisted.python.failure import Failure

from llmgw.huburl import parse_hub_url
from llmgw.link.client import _factory, reconnecting
from llmgw.link.hubs import HANDSHAKE_TIMEOUT_S, SINGLE_HANDSHAKE_TIMEOUT_S, HubList

A, B, C = "wss://a.example.org:7443/", "wss://b.example.org:7443/", "wss://c.example.org:7443/"
LEADER_B = "standby; the leader is serverB at wss://b.example.org:7443/"


def test_a_leader_url_is_one_of_the_list_by_host_and_port_or_none():
    hubs = HubList.of([A, B])
    assert hubs.find("wss://B.EXAMPLE.org:7443/") == parse_hub_url(B)
    for other in ("wss://b.example.org:7444/", "wss://evil.example.org:7443/", "https://b.example.org:7443/",
                  "not a url", None, 7443, ["wss://b.example.org:7443/"], "wss://b.example.org:7443/" + "x" * 3000):
        assert hubs.find(other) is None, other


def test_a_standby_naming_a_listed_leader_sends_the_client_there_at_once_and_only_once_in_a_row():
    hubs = HubList.of([A, B, C])
    hubs.standby(LEADER_B, B)
    assert hubs.refused
    assert hubs.after_refusal() == (f"the hub at {A} stands by ({LEADER_B}); going to the leader's hub, {B}, now",
                                    True)
    assert not hubs.refused and hubs.current.url == B and hubs.refusals == 1
    # B stands by too, naming A (an election under way): no second jump, the next of the list after backoff.
    hubs.standby("standby; the leader is serverA", A)
    assert hubs.after_refusal() == (f"the hub at {B} stands by (standby; the leader is serverA); trying {C}", False)
    assert hubs.refusals == 2
    hubs.standby("standby; the leader is serverB", B)
    assert hubs.after_refusal()[1] is True  # the jump after a step through the list is allowed again
    hubs.settled()
    assert hubs.refusals == 0 and hubs.after_refusal() is None


def test_a_leader_the_client_does_not_list_is_named_and_never_dialled():
    hubs = HubList.of([A, B])
    hubs.standby("standby; the leader is serverX", "wss://x.example.org:7443/")
    said, at_once = hubs.after_refusal()
    assert not at_once and hubs.current.url == B
    assert said == (f"the hub at {A} stands by (standby; the leader is serverX); it names wss://x.example.org:7443/ "
                    "as the leader's hub, which is not in this node's list of hubs (add it to agent.yaml's hub: to go "
                    f"straight there); trying {B}")
    hubs.standby("\x1b[31mred", None)
    assert hubs.after_refusal()[0] == f"the hub at {B} stands by (\\x1b[31mred); trying {A}"


class Endpoint:
    """One hub's endpoint: refuses TCP, or accepts it and hands the test the protocol."""

    def __init__(self, name, refuse):
        self.name, self.refuse, self.protocols = name, refuse, []

    def connect(self, factory):
        if self.refuse:
            return defer.fail(error.ConnectionRefusedError())
        protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 7443))
        protocol.makeConnection(StringTransport())
        self.protocols.append(protocol)
        return defer.succeed(protocol)


def service(hubs: HubList, refuse: set[str]):
    clock = task.Clock()
    factory = _factory(hubs.current, lambda config: None)
    dial = {hub: Endpoint(hub.url, hub.url in refuse) for hub in hubs.hubs}
    dialled = []
    for endpoint in dial.values():
        endpoint.connect = (lambda f, e=endpoint, connect=endpoint.connect: dialled.append((e.name, factory.url))
                            or connect(f))
    return clock, factory, dial, dialled, reconnecting(clock, hubs, dial, factory, backoff=lambda n: float(2 ** n))


def test_a_refused_hub_passes_the_dial_to_the_next_in_order_with_backoff():
    hubs = HubList.of([A, B, C])
    clock, factory, dial, dialled, svc = service(hubs, refuse={A, B})
    with capturedLogs() as events:
        svc.startService()
        clock.advance(2)
        clock.advance(4)
    assert dialled == [(A, A), (B, B), (C, C)]  # each handshake names the hub it is sent to
    said = [formatEvent(e) for e in events if e.get("log_namespace") == "llmgw.link.client"]
    assert said == ["connection refused by a.example.org:7443, trying wss://b.example.org:7443/ in 2.0 s",
                    "connection refused by b.example.org:7443, trying wss://c.example.org:7443/ in 4.0 s"]
    svc.stopService()


def test_a_standby_s_refusal_redials_the_leader_at_once_and_a_lost_session_tries_the_next_hub_first():
    hubs = HubList.of([A, B])
    clock, factory, dial, dialled, svc = service(hubs, refuse=set())
    with capturedLogs() as events:
        svc.startService()
        factory.on_join()
        hubs.standby(LEADER_B, B)  # what the agent's session does on llmgw.error.standby, then it leaves
        dial[hubs.current].protocols[-1].connectionLost(Failure(error.ConnectionDone()))
        clock.advance(0)
        assert dialled == [(A, A), (B, B)]
        factory.on_join()
        hubs.settled()
        # The leader B hangs: the link's ping gives up on it.  Its server may be hung, so A is tried first; if B
        # still leads, A (a standby) sends the client straight back.
        dial[hubs.current].protocols[-1].connectionLost(Failure(error.ConnectionLost()))
        clock.advance(2)
        assert dialled == [(A, A), (B, B), (A, A)]
        hubs.standby(LEADER_B, B)
        dial[hubs.current].protocols[-1].connectionLost(Failure(error.ConnectionDone()))
        clock.advance(0)
    assert dialled == [(A, A), (B, B), (A, A), (B, B)]
    said = [formatEvent(e) for e in events if e.get("log_namespace") == "llmgw.link.client"]
    assert said[0] == f"the hub at {A} stands by ({LEADER_B}); going to the leader's hub, {B}, now in 0.0 s"
    assert said[1].startswith(f"link to {B} lost: ")
    assert said[2] == f"reconnecting to {A} in 2.0 s"
    svc.stopService()


def test_a_lost_session_on_the_only_hub_tries_it_again():
    hubs = HubList.of([A])
    clock, factory, dial, dialled, svc = service(hubs, refuse=set())
    svc.startService()
    factory.on_join()
    dial[hubs.current].protocols[-1].connectionLost(Failure(error.ConnectionLost()))
    clock.advance(2)
    assert dialled == [(A, A), (A, A)]
    svc.stopService()


def test_an_opening_handshake_with_several_hubs_is_bounded_by_hub_handshake_timeout_s_and_one_hub_waits_30_s():
    assert HubList.of([A, B], handshake_timeout_s=7).handshake_timeout_s == 7
    assert HubList.of([A, B]).handshake_timeout_s == HANDSHAKE_TIMEOUT_S == 10
    assert HubList.of([A], handshake_timeout_s=7).handshake_timeout_s == SINGLE_HANDSHAKE_TIMEOUT_S == 30
    factory = _factory(parse_hub_url(A), lambda config: None, HubList.of([A, B], 7).handshake_timeout_s)
    assert factory.openHandshakeTimeout == 7

