"""The hub's limits over real mutual TLS: HELLO timeout, one session per node, subscriptions, nesting.

Timeouts run on a ``task.Clock`` given to the hub; the sockets are real.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.internet import task
from twisted.logger import LogLevel, globalLogPublisher

from llmgw.link.settings import LinkSettings
from llmgw.link import uris
from llmgw.link.hub import Hub
from tests.link.conftest import close, files, serve
from tests.link.wire import (ABORT, CALL, ERROR, INVOCATION, PUBLISH, REGISTER, REGISTERED, SUBSCRIBE, SUBSCRIBED, WELCOME,
                             YIELD, wire_peer)
from tests.support.wait import until


class Logged:
    """Warnings and errors logged while in the ``with`` block."""

    def __enter__(self):
        self.events = []
        globalLogPublisher.addObserver(self.events.append)
        return self

    def __exit__(self, *exc):
        globalLogPublisher.removeObserver(self.events.append)

    def lines(self, level=LogLevel.warn) -> list[str]:
        from twisted.logger import formatEvent

        return [formatEvent(e) for e in self.events if e.get("log_level") is not None and e["log_level"] >= level]


@pytest_twisted.async_yield_fixture
async def clocked(pki):
    """A hub on a fake clock, with no control plane."""
    clock = task.Clock()
    hub = Hub(clock, settings=LinkSettings(max_subscriptions_per_session=3))
    hub.clock = clock
    port = await serve(hub, pki, control=False)
    yield hub
    await close(hub, port)


@pytest_twisted.ensureDeferred
async def test_a_connection_that_never_says_hello_is_closed(clocked, pki):
    peer = await wire_peer(clocked, files(pki, "node01"))  # TLS and WebSocket open, then silence
    with Logged() as logged:
        clocked.clock.advance(LinkSettings().hello_timeout_s)
        await peer.until_closed()
    assert clocked.refusals["hello_timeout"] == 1
    [line] = [line for line in logged.lines() if "HELLO" in line]
    assert "127.0.0.1:" in line and "link.hello_timeout_s" in line


@pytest_twisted.ensureDeferred
async def test_a_second_session_for_a_live_node_is_refused_and_the_first_carries_on(clocked, pki):
    first = await wire_peer(clocked, files(pki, "node01"))
    await first.hello()
    first.send(64, 1, {}, uris.node_uri("node01", "ping"))
    assert (await first.next())[0] == 65
    second = await wire_peer(clocked, files(pki, "node01"))
    with Logged() as logged:
        second.send(1, uris.REALM, {"roles": {"callee": {}}})
        abort = await second.next()  # the first answered the hub's ping at once
    assert abort[0] == ABORT and abort[2] == uris.ERROR_ALREADY_CONNECTED, abort
    first_port = first.transport.getHost().port
    second_port = second.transport.getHost().port
    sentence = abort[1]["message"]
    assert sentence == (
        f"node01 is already connected from 127.0.0.1:{first_port}; a second agent with its certificate "
        f"from 127.0.0.1:{second_port} was refused: give each node its own certificate"
    )
    assert logged.lines() == [sentence]
    record = clocked.duplicates["node01"]
    assert (record.count, record.holder_peer, record.refused_peer) == (1, f"127.0.0.1:{first_port}",
                                                                        f"127.0.0.1:{second_port}")
    # The first keeps its session and its registration.
    assert first.session_id in clocked.sessions
    assert clocked.dealer.callee(uris.node_uri("node01", "ping")) is clocked.sessions[first.session_id]


@pytest_twisted.ensureDeferred
async def test_a_second_session_replaces_a_first_that_does_not_answer(clocked, pki):
    first = await wire_peer(clocked, files(pki, "node01"))
    await first.hello()
    first.transport.pauseProducing()  # a half-open connection: it reads nothing, answers no ping
    second = await wire_peer(clocked, files(pki, "node01"))
    second.send(1, uris.REALM, {"roles": {"callee": {}}})
    await until(lambda: "node01" in clocked._checking, "the hub to ping the first session")
    with Logged() as logged:
        clocked.clock.advance(LinkSettings().liveness_timeout_s)
        welcome = await second.next()
    assert welcome[0] == WELCOME
    assert first.session_id not in clocked.sessions
    assert clocked._nodes["node01"].session_id == welcome[1]
    assert any("did not answer a ping" in line for line in logged.lines())
    assert "node01" not in clocked.duplicates


@pytest_twisted.ensureDeferred
async def test_operators_may_hold_several_sessions(clocked, pki):
    one = await wire_peer(clocked, files(pki, "alice"))
    two = await wire_peer(clocked, files(pki, "alice"))
    assert await one.hello() != await two.hello()


@pytest_twisted.ensureDeferred
async def test_subscriptions_per_session_are_capped(clocked, pki):
    peer = await wire_peer(clocked, files(pki, "alice"))
    await peer.hello()
    for request in range(1, 4):
        peer.send(SUBSCRIBE, request, {}, f"{uris.EVENT_PREFIX}t{request}")
        assert (await peer.next())[:2] == [SUBSCRIBED, request]
    peer.send(SUBSCRIBE, 4, {}, uris.EVENT_PREFIX + "t1")  # one it holds: not another
    assert (await peer.next())[:2] == [SUBSCRIBED, 4]
    with Logged() as logged:
        peer.send(SUBSCRIBE, 5, {}, uris.EVENT_PREFIX + "t4")
        refused = await peer.next()
    assert refused[:3] == [ERROR, SUBSCRIBE, 5] and refused[4] == uris.ERROR_LIMIT
    assert "holds 3 subscriptions" in refused[5][0] and "link.max_subscriptions_per_session" in refused[5][0]
    assert len(logged.lines()) == 1 and "alice" in logged.lines()[0]
    assert clocked.refusals["subscriptions"] == 1


def nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


DEEP = {
    "a CALL": lambda: json.dumps([CALL, 1, {}, uris.CP_AGENT + "whoami", [nested(900)]]).encode(),
    "one too deep for the parser": lambda: b"[48, 2, {}, \"llmgw.cp.agent.whoami\", [" + b"[" * 5000 + b"]" * 5000 + b"]]",
    "an unacknowledged PUBLISH": lambda: json.dumps([PUBLISH, 3, {}, uris.EVENT_NODE, [nested(100)]]).encode(),
}


@pytest.mark.parametrize("what", list(DEEP))
@pytest_twisted.ensureDeferred
async def test_a_deeply_nested_message_ends_its_session_in_one_line(hub, pki, what):
    peer = await wire_peer(hub, files(pki, "node01"))
    session_id = await peer.hello()
    before = hub.refusals["message_depth"]
    with Logged() as logged:
        peer.send_raw(DEEP[what]())
        abort = await peer.next()
        await peer.until_closed()
    assert abort[0] == ABORT and abort[2] == "wamp.error.protocol_violation", abort
    assert "link.max_message_depth" in abort[1]["message"] and len(abort[1]["message"]) < 200
    assert session_id not in hub.sessions
    assert hub.refusals["message_depth"] == before + 1
    # Only this peer's lines: a handshake another test left to fail logs its own.
    [line] = [line for line in logged.lines() if "node01" in line]
    assert line.startswith("protocol violation by <session ") and len(line) < 400
    assert logged.lines(LogLevel.error) == []


@pytest_twisted.ensureDeferred
async def test_a_callee_s_answer_nested_too_deep_is_refused_to_its_caller_and_ends_the_callee_s_session(hub, pki):
    callee = await wire_peer(hub, files(pki, "node01"))
    await callee.hello()
    callee.send(REGISTER, 1, {}, uris.node_uri("node01", "deep"))
    assert (await callee.next())[0] == REGISTERED
    answer = hub.control.call(uris.node_uri("node01", "deep"))  # only the control plane calls a node
    invocation = await callee.next()
    assert invocation[0] == INVOCATION
    callee.send_raw(json.dumps([YIELD, invocation[1], {}, [nested(100)]]).encode())
    with pytest.raises(ApplicationError) as refused:
        await answer
    assert refused.value.error == "wamp.error.invalid_argument"
    assert refused.value.args[0].startswith("the answer of node01 was refused: YIELD nests deeper than 32 levels")
    assert (await callee.next())[0] == ABORT
    await callee.until_closed()
