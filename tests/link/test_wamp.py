"""The hub as a WAMP router, held to the Basic and Advanced Profile texts, one point at a time.

A raw peer (tests/link/wire.py) sends what autobahn would not; the
control plane's stand-in is a real autobahn session attached in process.
Whether something was *not* sent is read at a gate: a later message on the
same session, which WAMP delivers in order, arrives first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest_twisted
from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer, protocol, reactor
from twisted.logger import LogLevel, globalLogPublisher

from llmgw.link import uris
from tests.link.conftest import files, join
from tests.link.wire import (
    ABORT, CALL, CANCEL, CANCELLING_CALLEE, ERROR, HELLO, INTERRUPT, INVOCATION, PUBLISH, REGISTER,
    REGISTERED, RESULT, SUBSCRIBE, YIELD, wire_peer,
)

WHOAMI = uris.CP_AGENT + "whoami"
NEVER = uris.CP_AGENT + "never"


async def raw(hub, pki, name="node01", roles=None):
    peer = await wire_peer(hub, files(pki, name))
    await peer.hello(roles)
    return peer


async def raw_callee(hub, pki, roles):
    """node01 over the wire, registered at llmgw.node.node01.work; returns the peer and the registration id."""
    peer = await raw(hub, pki, roles=roles)
    peer.send(REGISTER, 1, {}, uris.node_uri("node01", "work"))
    registered = await peer.next()
    assert registered[0] == REGISTERED, registered
    return peer


def control_request(hub, d) -> int:
    """The CALL request id of the control plane's pending call *d*."""
    [request] = [r for r, req in hub.control._call_reqs.items() if req.on_reply is d]
    return request


async def cancel_from_control(hub, d, mode: str | None) -> None:
    """Send CANCEL for the control plane's call *d*, with a mode autobahn's API cannot choose."""
    hub.control._transport.send(message.Cancel(control_request(hub, d), mode=mode))


def within(d, seconds: float = 5.0):
    return d.addTimeout(seconds, reactor)


async def failure_of(d):
    try:
        result = await within(d)
    except ApplicationError as e:
        return e.error
    raise AssertionError(f"expected an error, got {result!r}")


# -- CANCEL, by mode (Advanced Profile, "Call Canceling") --


@pytest_twisted.ensureDeferred
async def test_cancel_skip_answers_the_caller_and_sends_the_callee_nothing(hub, pki):
    callee = await raw_callee(hub, pki, CANCELLING_CALLEE)
    d = hub.control.call(uris.node_uri("node01", "work"))
    invocation = await callee.next()
    assert invocation[0] == INVOCATION
    await cancel_from_control(hub, d, "skip")
    assert await failure_of(d) == "wamp.error.canceled"
    # The callee's late answer is discarded; the next thing it hears is the next call.
    callee.send(YIELD, invocation[1], {}, ["too late"])
    again = hub.control.call(uris.node_uri("node01", "work"))
    assert (await callee.next())[0] == INVOCATION
    assert not again.called


async def interrupted(hub, pki, mode: str):
    """The control plane calls node01 (which announced call_canceling) and cancels with *mode*; node01 is interrupted."""
    callee = await raw_callee(hub, pki, CANCELLING_CALLEE)
    d = hub.control.call(uris.node_uri("node01", "work"))
    invocation = await callee.next()
    await cancel_from_control(hub, d, mode)
    interrupt = await callee.next()
    assert interrupt[:2] == [INTERRUPT, invocation[1]] and interrupt[2].get("mode") == mode, interrupt
    return callee, d, invocation[1]


@pytest_twisted.ensureDeferred
async def test_cancel_kill_interrupts_and_waits_for_the_callee(hub, pki):
    callee, d, invocation = await interrupted(hub, pki, "kill")
    assert not d.called  # the caller waits for the callee's word
    callee.send(YIELD, invocation, {}, ["finished anyway"])
    assert await within(d) == "finished anyway"


@pytest_twisted.ensureDeferred
async def test_cancel_killnowait_answers_at_once_and_interrupts(hub, pki):
    callee, d, invocation = await interrupted(hub, pki, "killnowait")
    assert await failure_of(d) == "wamp.error.canceled"


@pytest_twisted.ensureDeferred
async def test_a_callee_that_did_not_announce_call_canceling_is_never_interrupted(hub, pki):
    callee = await raw_callee(hub, pki, {"callee": {}})
    for mode in ("kill", "killnowait", None):
        d = hub.control.call(uris.node_uri("node01", "work"))
        assert (await callee.next())[0] == INVOCATION
        await cancel_from_control(hub, d, mode)
        assert await failure_of(d) == "wamp.error.canceled"
    # nor on a timeout
    from autobahn.wamp.types import CallOptions

    late = hub.control.call(uris.node_uri("node01", "work"), options=CallOptions(timeout=50))
    assert (await callee.next())[0] == INVOCATION
    assert await failure_of(late) == "wamp.error.timeout"
    hub.control.call(uris.node_uri("node01", "work"))
    assert (await callee.next())[0] == INVOCATION  # not an INTERRUPT


@pytest_twisted.ensureDeferred
async def test_a_cancel_mode_the_spec_does_not_name_is_a_protocol_violation(hub, pki):
    caller = await raw(hub, pki)
    caller.send(CALL, 1, {}, NEVER, [])
    caller.send(CANCEL, 1, {"mode": "explode"})
    abort = await caller.next()
    assert abort[0] == ABORT and abort[2] == "wamp.error.protocol_violation", abort
    assert "explode" in abort[1]["message"]
    await caller.until_closed()


@pytest_twisted.ensureDeferred
async def test_a_cancelled_call_logs_at_most_one_info_line(hub, pki):
    node = await join(hub, pki, "node01")
    seen = []

    def observe(event):
        seen.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        d = node.call(NEVER)
        while not hub.control.pending:
            await node.call(WHOAMI)  # a round trip: the control plane has seen the call
        d.cancel()
        try:
            await within(d)
        except (defer.CancelledError, ApplicationError):
            pass
        await node.call(WHOAMI)  # and the INTERRUPT has been handled before this answer
        await hub.control.call(uris.CP_AGENT + "whoami")
    finally:
        globalLogPublisher.removeObserver(observe)
    assert hub.control.pending[0].called  # the control plane's handler was cancelled
    loud = [e for e in seen if e.get("log_level") is not None and e["log_level"] >= LogLevel.warn]
    assert loud == [], [e.get("log_format") for e in loud]
    infos = [e for e in seen if e.get("log_level") == LogLevel.info]
    assert len(infos) <= 1, [e.get("log_format") for e in infos]
    node.leave()


# -- PUBLISH (Basic Profile, "Publishing and Events") --


@pytest_twisted.ensureDeferred
async def test_a_refused_publish_without_acknowledge_gets_no_error(hub, pki):
    peer = await raw(hub, pki)
    peer.send(PUBLISH, 1, {}, uris.EVENT_NODE, ["forged"])
    peer.send(PUBLISH, 2, {"acknowledge": True}, uris.EVENT_NODE, ["forged"])
    refused = await peer.next()
    assert refused[:3] == [ERROR, PUBLISH, 2], refused
    assert refused[4] == uris.ERROR_NOT_AUTHORIZED


# -- URIs (Basic Profile, "Identifiers") --


@pytest_twisted.ensureDeferred
async def test_a_malformed_uri_gets_invalid_uri_and_the_session_stays(hub, pki):
    peer = await raw(hub, pki)
    peer.send(CALL, 1, {}, "llmgw.cp agent.whoami", [])
    peer.send(REGISTER, 2, {}, "llmgw.node.node01..ping")
    peer.send(SUBSCRIBE, 3, {}, "llmgw.event.#")
    peer.send(PUBLISH, 4, {}, "llmgw event")  # unacknowledged: nothing comes back
    peer.send(PUBLISH, 5, {"acknowledge": True}, "")
    peer.send(CALL, 6, {}, 42, [])
    for request_type, request in ((CALL, 1), (REGISTER, 2), (SUBSCRIBE, 3), (PUBLISH, 5), (CALL, 6)):
        answer = await peer.next()
        assert answer[:3] == [ERROR, request_type, request], answer
        assert answer[4] == "wamp.error.invalid_uri"
    peer.send(CALL, 7, {}, WHOAMI, [])
    assert (await peer.next())[:2] == [RESULT, 7]


@pytest_twisted.ensureDeferred
async def test_a_prefix_subscription_may_end_in_a_dot(hub, pki):
    peer = await raw(hub, pki, "alice")
    peer.send(SUBSCRIBE, 1, {"match": "prefix"}, uris.EVENT_PREFIX)
    assert (await peer.next())[:2] == [33, 1]


# -- sessions (Basic Profile, "Sessions" and "IDs") --


@pytest_twisted.ensureDeferred
async def test_a_second_hello_is_aborted_as_a_protocol_violation(hub, pki):
    peer = await raw(hub, pki)
    peer.send(HELLO, uris.REALM, {"roles": {"caller": {}}})
    abort = await peer.next()
    assert abort[0] == ABORT and abort[2] == "wamp.error.protocol_violation", abort
    await peer.until_closed()
    assert peer.session_id not in hub.sessions


@pytest_twisted.ensureDeferred
async def test_session_ids_are_random_in_the_spec_range(hub, pki):
    ids = []
    for _ in range(6):
        peer = await raw(hub, pki, "alice")
        ids.append(peer.session_id)
    assert all(1 <= i <= 2**53 for i in ids)
    # Sequential ids differ by one; six draws from 2^53 are never that close.
    gaps = sorted(abs(a - b) for a in ids for b in ids if a != b)
    assert gaps[0] > 1000, ids


@pytest_twisted.ensureDeferred
async def test_invocation_ids_count_from_one_for_each_callee(hub, pki):
    callee = await raw_callee(hub, pki, {"callee": {}})
    hub.control.call(uris.node_uri("node01", "work"))
    hub.control.call(uris.node_uri("node01", "work"))
    assert [(await callee.next())[1], (await callee.next())[1]] == [1, 2]


# -- a third-party client: autobahn's asyncio flavour, in its own process --


class _Lines(protocol.ProcessProtocol):
    def __init__(self):
        self.lines: list[str] = []
        self.output = b""
        self.waiting: dict[str, defer.Deferred] = {}
        self.ended = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output += data
        *done, self.rest = (getattr(self, "rest", "") + data.decode()).split("\n")
        for line in done:
            self.lines.append(line)
            if line in self.waiting:
                self.waiting.pop(line).callback(line)

    errReceived = outReceived

    def processEnded(self, reason) -> None:
        self.ended.callback(reason.value.exitCode)

    def line(self, text: str) -> defer.Deferred:
        if text in self.lines:
            return defer.succeed(text)
        self.waiting[text] = defer.Deferred()
        return self.waiting[text].addTimeout(30, reactor)


@pytest_twisted.ensureDeferred
async def test_autobahn_asyncio_as_an_agent_sees_a_conformant_router(hub, pki):
    tls = files(pki, "node01")
    peer = _Lines()
    script = str(Path(__file__).with_name("asyncio_peer.py"))
    reactor.spawnProcess(peer, sys.executable, [sys.executable, script, hub.address.url, tls.ca, tls.cert, tls.key],
                         env=dict(os.environ))
    await peer.line("READY")
    pending = hub.control.call(uris.node_uri("node01", "hang"))
    await peer.line("INVOKED")
    pending.cancel()
    exit_code = await peer.ended.addTimeout(30, reactor)
    output = peer.output.decode()
    assert exit_code == 0, output
    seen = json.loads([line for line in peer.lines if line.startswith("{")][-1])
    assert 1 <= seen["session"] <= 2**53
    assert (seen["authid"], seen["authrole"]) == ("node01", "node")
    assert seen["whoami"] == {"authid": "node01", "role": "node"}
    assert seen["timeout"] == "wamp.error.timeout"
    assert seen["cancel"] in ("wamp.error.canceled", "CancelledError")
    assert seen["publish_acknowledged"] == uris.ERROR_NOT_AUTHORIZED
    assert seen["subscribe"] == uris.ERROR_NOT_AUTHORIZED
    assert seen["after_refusals"] == "node01"
    assert seen["interrupted"] is True  # it announced call_canceling, so it was interrupted
    assert seen["after_interrupt"] == "node01"
    # autobahn logs its own handler's cancellation; what matters is that it saw no protocol error.
    assert "ProtocolError" not in output and "protocol_violation" not in output, output
