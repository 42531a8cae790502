"""The reconnecting client on a test clock: the backoff grows across refused handshakes and starts again only once a session joins."""

from __future__ import annotations

import random

from twisted.internet import defer, error, task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs
from twisted.python.failure import Failure

from llmgw.huburl import HubAddress
from llmgw.link.client import _factory, jittered_backoff, reconnecting
from llmgw.link.tls import HubNameMismatch

HUB = HubAddress("wss://127.0.0.1:7443/", "127.0.0.1", 7443)


class Endpoint:
    """Accepts TCP at once; each connection then ends with *reason* half a second later."""

    def __init__(self, clock, reason):
        self.clock = clock
        self.reason = reason
        self.protocols = []

    def connect(self, factory):
        if isinstance(self.reason, error.ConnectionRefusedError):
            return defer.fail(self.reason)
        protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 7443))
        protocol.makeConnection(StringTransport())
        self.protocols.append(protocol)
        self.clock.callLater(0.5, protocol.connectionLost, Failure(self.reason))
        return defer.succeed(protocol)


def run(reason, seconds: float, on_join_after: float | None = None):
    clock = task.Clock()
    attempts: list[int] = []
    factory = _factory(HUB, lambda config: None)
    service = reconnecting(clock, HUB, Endpoint(clock, reason), factory,
                           backoff=lambda n: attempts.append(n) or float(2 ** min(n, 3)))
    with capturedLogs() as events:
        service.startService()
        for step in range(1, int(seconds * 10) + 1):
            clock.advance(0.1)
            if on_join_after is not None and abs(step / 10 - on_join_after) < 0.01:
                factory.on_join()
        service.stopService()
    lines = [e["log_format"].format(**e) for e in events if e.get("log_namespace") == "llmgw.link.client"]
    return attempts, lines


def test_a_handshake_the_hub_refuses_grows_the_backoff_though_tcp_connected():
    attempts, lines = run(HubNameMismatch("127.0.0.1", ["cp", "cp.example.org"]), seconds=30)
    assert attempts[:5] == [1, 2, 3, 4, 5]
    assert lines[0] == (
        "the hub's certificate is for cp, cp.example.org, not 127.0.0.1: re-issue it with "
        "llmgw pki issue DIR --role server cp --san cp.example.org --san 127.0.0.1 --force "
        "and restart the server; retrying in 2.0 s"
    )
    assert lines[2].endswith("retrying in 8.0 s")


def test_a_refused_connection_says_by_whom_and_when_the_next_try_is():
    attempts, lines = run(error.ConnectionRefusedError(), seconds=15)
    assert attempts[:3] == [1, 2, 3]
    assert lines[:3] == [
        "connection refused by 127.0.0.1:7443, retrying in 2.0 s",
        "connection refused by 127.0.0.1:7443, retrying in 4.0 s",
        "connection refused by 127.0.0.1:7443, retrying in 8.0 s",
    ]


def test_a_session_that_joined_starts_the_backoff_again():
    attempts, _ = run(HubNameMismatch("127.0.0.1", ["cp"]), seconds=10, on_join_after=7.2)
    # Lost at 0.5 s and 3 s; the third connection (7 s) joins at 7.2 s, so its loss waits the first wait again.
    assert attempts[:3] == [1, 2, 1]


def test_the_jittered_backoff_stays_under_its_ceiling_of_ten_seconds():
    delay = jittered_backoff(random.Random(25))
    assert all(1 <= delay(1) <= 2 for _ in range(100))
    assert all(5 <= delay(n) <= 10 for n in (4, 10, 1000) for _ in range(100))


def test_the_jittered_backoff_draws_each_wait_from_the_generator_it_is_given():
    delay = jittered_backoff(random.Random(25))
    twin = random.Random(25)
    # Ceilings 2, 4, 8, then the 10 s cap; each wait lies in its upper half.
    ceilings = [2, 4, 8, 10, 10]
    waits = [delay(n) for n in range(1, 6)]
    assert waits == [twin.uniform(c / 2, c) for c in ceilings]
    assert all(c / 2 <= w <= c for w, c in zip(waits, ceilings))
    assert jittered_backoff(random.Random(26))(1) != jittered_backoff(random.Random(25))(1)
