"""The hub over real mutual TLS on 127.0.0.1, with certificates from `llmgw pki`.

Every refusal is checked for its reason, not only for having failed: a test
that passes because the connection broke for some other cause proves nothing.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import SubscribeOptions
from twisted.internet import defer, endpoints, reactor, ssl

from llmgw.errors import HubUnreachable
from llmgw.link import uris
from llmgw.link.client import _factory, connect_once
from llmgw.roles import ROLE_CONTROL
from llmgw.tlsfiles import TLSFiles
from tests.link.conftest import files, join


@pytest_twisted.ensureDeferred
async def test_identity_comes_from_the_certificate(hub, pki):
    node = await join(hub, pki, "node01")
    assert (node._authid, node._authrole) == ("node01", "node")
    assert await node.call(uris.CP_AGENT + "whoami") == {"authid": "node01", "role": "node"}
    node.leave()


@pytest_twisted.ensureDeferred
async def test_no_client_certificate_gets_no_session(hub, pki):
    ca = ssl.Certificate.loadPEM((pki / "ca.crt").read_bytes())
    options = ssl.optionsForClientTLS("127.0.0.1", trustRoot=ca)  # no client certificate
    joined = defer.Deferred()
    lost = defer.Deferred()

    class Probe(ApplicationSession):
        def onConnect(self):
            self.join(self.config.realm)

        def onJoin(self, details):
            joined.callback(details)

    factory = _factory(hub.address, Probe)
    factory.on_lost = lambda reason: lost.called or lost.callback(reason.value)
    tcp = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", hub.address.port)
    await endpoints.wrapClientTLS(options, tcp).connect(factory)
    reason = await lost
    assert not joined.called
    assert "certificate required" in str(reason).lower()  # the hub's TLS alert
    assert [s for s in hub.sessions.values() if s.role != ROLE_CONTROL] == []


@pytest_twisted.ensureDeferred
async def test_a_certificate_from_another_ca_is_refused(hub, pki, other_pki):
    mixed = TLSFiles(str(pki / "ca.crt"), str(other_pki / "node01.crt"), str(other_pki / "node01.key"))
    with pytest.raises(HubUnreachable, match="TLS handshake failed") as refused:
        await connect_once(reactor, hub.address, mixed, timeout=5)
    assert "unknown ca" in str(refused.value).lower() or "certificate" in str(refused.value).lower()
    assert [s for s in hub.sessions.values() if s.role != ROLE_CONTROL] == []


@pytest_twisted.ensureDeferred
async def test_a_hello_claiming_another_authid_is_aborted(hub, pki):
    outcome = defer.Deferred()

    class Impostor(ApplicationSession):
        def onConnect(self):
            self.join(self.config.realm, authid="node02")

        def onJoin(self, details):
            outcome.callback("joined")

        def onLeave(self, details):
            outcome.called or outcome.callback(details)

    factory = _factory(hub.address, Impostor)
    from llmgw.link.client import _endpoint

    await _endpoint(reactor, hub.address, files(pki, "node01"), 5).connect(factory)
    details = await outcome
    assert details != "joined"
    assert details.reason == uris.ERROR_NOT_AUTHORIZED
    assert "'node01'" in details.message and "'node02'" in details.message


@pytest_twisted.ensureDeferred
async def test_a_node_may_register_only_under_its_own_prefix(hub, pki):
    node = await join(hub, pki, "node01")
    await node.register(lambda: "mine", uris.node_uri("node01", "ping"))
    with pytest.raises(ApplicationError) as refused:
        await node.register(lambda: "theirs", uris.node_uri("node02", "ping"))
    assert refused.value.error == uris.ERROR_NOT_AUTHORIZED
    assert "llmgw.node.node01." in refused.value.args[0]
    # nor sneak in under a longer id that starts with its own
    with pytest.raises(ApplicationError):
        await node.register(lambda: "x", "llmgw.node.node01x.ping")
    node.leave()


@pytest_twisted.ensureDeferred
async def test_an_agent_may_not_make_operator_calls(hub, pki):
    node = await join(hub, pki, "node01")
    with pytest.raises(ApplicationError) as refused:
        await node.call(uris.CP_NODES)
    assert refused.value.error == uris.ERROR_NOT_AUTHORIZED
    assert "node node01 may" in refused.value.args[0]
    with pytest.raises(ApplicationError) as refused:
        await node.subscribe(lambda *a: None, uris.EVENT_NODE)
    assert refused.value.error == uris.ERROR_NOT_AUTHORIZED
    node.leave()


@pytest_twisted.ensureDeferred
async def test_an_operator_queries_and_the_callee_sees_who_asked(hub, pki):
    alice = await join(hub, pki, "alice")
    assert await alice.call(uris.CP_NODES) == ["node list for alice"]
    with pytest.raises(ApplicationError) as refused:
        await alice.call(uris.CP_AGENT + "whoami")
    assert refused.value.error == uris.ERROR_NOT_AUTHORIZED
    alice.leave()


@pytest_twisted.ensureDeferred
async def test_events_reach_prefix_subscribers_with_their_topic(hub, pki):
    alice = await join(hub, pki, "alice")
    got = defer.Deferred()
    await alice.subscribe(
        lambda *args, details=None: got.callback((details.topic, args)),
        uris.EVENT_PREFIX, SubscribeOptions(match="prefix", details_arg="details"),
    )
    hub.control.publish(uris.EVENT_NODE, "node01", {"change": "registered"})
    assert await got == (uris.EVENT_NODE, ("node01", {"change": "registered"}))
    alice.leave()


@pytest_twisted.ensureDeferred
async def test_a_call_nobody_answers_times_out(hub, pki):
    from autobahn.wamp.types import CallOptions

    node = await join(hub, pki, "node01")
    with pytest.raises(ApplicationError) as late:
        await node.call(uris.CP_AGENT + "never", options=CallOptions(timeout=200))
    assert late.value.error == "wamp.error.timeout"
    assert not hub.dealer.invocations
    node.leave()


@pytest_twisted.ensureDeferred
async def test_a_callee_that_leaves_fails_its_pending_calls(hub, pki):
    node = await join(hub, pki, "node01")
    alice = await join(hub, pki, "alice")
    called = defer.Deferred()

    def hang():
        called.callback(None)
        return defer.Deferred()

    await node.register(hang, uris.node_uri("node01", "hang"))
    # operators cannot call nodes directly; the control plane can
    pending = hub.control.call(uris.node_uri("node01", "hang"))
    await called
    node.leave()
    with pytest.raises(ApplicationError) as gone:
        await pending
    assert gone.value.error == "wamp.error.canceled"
    assert "node01" in gone.value.args[0]
    alice.leave()


@pytest_twisted.ensureDeferred
async def test_a_misbehaving_peer_is_cut_off_and_others_carry_on(hub, pki):
    """A client that sends a router's message (WELCOME) loses its session only, with ABORT (Basic Profile, "Sessions")."""
    from tests.link.wire import ABORT, WELCOME, wire_peer

    alice = await join(hub, pki, "alice")
    rogue = await wire_peer(hub, files(pki, "node01"))
    await rogue.hello()
    rogue.send(WELCOME, 1, {"roles": {"broker": {}}})
    abort = await rogue.next()
    assert abort[0] == ABORT and abort[2] == "wamp.error.protocol_violation"
    assert "WELCOME" in abort[1]["message"]
    await rogue.until_closed()
    assert rogue.session_id not in hub.sessions
    assert await alice.call(uris.CP_NODES) == ["node list for alice"]
    alice.leave()


@pytest_twisted.ensureDeferred
async def test_garbage_on_the_wire_closes_only_that_connection(hub, pki):
    alice = await join(hub, pki, "alice")
    rogue = await join(hub, pki, "node01")
    closed = defer.Deferred()
    rogue.onLeave = lambda details: closed.called or closed.callback(details)
    rogue._transport.sendMessage(json.dumps({"not": "wamp"}).encode(), False)
    await closed
    assert rogue.session_id not in hub.sessions
    assert await alice.call(uris.CP_NODES) == ["node list for alice"]
    alice.leave()
