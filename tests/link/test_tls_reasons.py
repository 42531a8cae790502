"""What a client the hub refuses is told, over real handshakes on 127.0.0.1: the hub's reason, not only a TLS alert's name.

A certificate the cluster CA signed that is refused only for its dates, its
revocation or its subject completes the handshake, opens no session, and
hears the reason in the ABORT that answers its HELLO; ctl and the agent's
log show that sentence.  A certificate from elsewhere is still refused by
an alert (test_tls_revocation.py).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.twisted.websocket import WebSocketClientFactory
from cryptography.x509.oid import ExtendedKeyUsageOID
from twisted.internet import defer, endpoints, reactor, ssl
from twisted.logger import capturedLogs

from llmgw.errors import HubUnreachable
from llmgw.link import uris
from llmgw.link.client import _endpoint, _factory, connect_once, reconnecting
from llmgw.tlsfiles import TLSFiles
from tests.link.test_tls_revocation import ca, ca_signed, hub, joined, logged, refusals  # noqa: F401  (fixtures)
from tests.link.wire import ABORT, CALL, HELLO, WirePeer, wire_peer
from tests.support.wait import until

DAY = datetime.timedelta(days=1)
REISSUE = "issue a new certificate with `llmgw pki issue DIR NAME --role ROLE --force` where the CA is"


def _files(ca, cert_key) -> TLSFiles:
    cert, key = cert_key
    return TLSFiles(str(ca / "ca.crt"), str(cert), str(key))


@pytest_twisted.ensureDeferred
async def test_an_expired_certificate_is_told_it_has_expired_and_what_to_do(ca, hub, logged):
    expired = _files(ca, ca_signed(ca, "node07", valid_from=-3 * DAY, valid_for=DAY))
    ended = (datetime.datetime.now(datetime.timezone.utc) - 2 * DAY).strftime("%Y-%m-%d")
    with pytest.raises(HubUnreachable) as refused:
        await connect_once(reactor, hub.address, expired, timeout=5)
    assert str(refused.value) == (
        f"the hub refused the session: certificate CN=node07,OU=node,O=prod: it has expired (on {ended}); {REISSUE}"
    )
    [line] = refusals(logged)
    assert line.startswith("refused the link connection from 127.0.0.1:")
    assert line.endswith(f": certificate CN=node07,OU=node,O=prod: it has expired (on {ended})")
    assert joined(hub) == [] and hub.tls.live() == []


@pytest_twisted.ensureDeferred
async def test_a_certificate_not_yet_valid_is_told_from_when(ca, hub, logged):
    early = ca_signed(ca, "node08", valid_from=2 * DAY)
    starts = x509_not_before(early[0])
    with pytest.raises(HubUnreachable) as refused:
        await connect_once(reactor, hub.address, _files(ca, early), timeout=5)
    assert str(refused.value) == (
        f"the hub refused the session: certificate CN=node08,OU=node,O=prod: it is not valid until "
        f"{starts:%Y-%m-%d %H:%M} UTC; check the clocks of this machine and the server"
    )
    assert refusals(logged)[0].endswith(f"it is not valid until {starts:%Y-%m-%d %H:%M} UTC")
    assert joined(hub) == []


def x509_not_before(path) -> datetime.datetime:
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_before_utc


@pytest_twisted.ensureDeferred
async def test_a_certificate_without_a_role_is_told_what_it_lacks(ca, hub):
    roleless = _files(ca, ca_signed(ca, "node09", ou=None))
    with pytest.raises(HubUnreachable) as refused:
        await connect_once(reactor, hub.address, roleless, timeout=5)
    message = str(refused.value)
    assert message.startswith("the hub refused the session: certificate ")
    assert "node09" in message and "has no OU" in message and "llmgw pki issue" in message
    assert "no valid client certificate from the cluster CA" not in message
    assert joined(hub) == []


@pytest_twisted.ensureDeferred
async def test_a_refused_certificate_s_connection_can_do_nothing_but_hear_why(ca, hub):
    """Its handshake completed, but nothing it sends opens a session or reaches a procedure."""
    expired = _files(ca, ca_signed(ca, "node07", valid_from=-3 * DAY, valid_for=DAY))
    early = await wire_peer(hub, expired)
    early.send(CALL, 1, {}, uris.CP_NODES, [])  # before HELLO: a violation, whoever it is
    abort = await early.next()
    assert abort[0] == ABORT and abort[2] == "wamp.error.protocol_violation", abort
    await early.until_closed()

    peer = await wire_peer(hub, expired)
    peer.send(HELLO, uris.REALM, {"roles": {"caller": {}}, "authid": "node07"})
    abort = await peer.next()
    assert abort[0] == ABORT and abort[2] == uris.ERROR_NOT_AUTHORIZED
    assert abort[1]["message"].startswith("certificate CN=node07,OU=node,O=prod: it has expired")
    await peer.until_closed()
    assert joined(hub) == []


class Agent(ApplicationSession):
    """Joins, as an agent's session does; the reconnecting service around it logs each failed attempt."""

    def onConnect(self):
        self.join(self.config.realm)


@pytest_twisted.ensureDeferred
async def test_the_agent_s_log_says_why_the_hub_refused_it(ca, hub):
    expired = _files(ca, ca_signed(ca, "node07", valid_from=-3 * DAY, valid_for=DAY))
    factory = _factory(hub.address, Agent)
    service = reconnecting(reactor, hub.address, _endpoint(reactor, hub.address, expired, 5), factory,
                           backoff=lambda n: 3600.0)  # one attempt within the test
    with capturedLogs() as events:
        service.startService()
        try:
            await until(lambda: [e for e in events if "retrying in" in e.get("log_format", "")], "the retry line")
        finally:
            await service.stopService()
    [line] = [e["log_format"].format(**e) for e in events if "retrying in" in e.get("log_format", "")]
    assert line.startswith("the hub refused the session: certificate CN=node07,OU=node,O=prod: it has expired (on ")
    assert line.endswith(f"; {REISSUE}; retrying in 3600.0 s")


@pytest_twisted.ensureDeferred
async def test_a_tls_1_2_client_is_told_the_same(ca, hub):
    """Under TLS 1.2 the hub judges the certificate before its own Finished; the answer is the same ABORT."""
    expired = _files(ca, ca_signed(ca, "node07", valid_from=-3 * DAY, valid_for=DAY))
    options = ssl.optionsForClientTLS(
        "127.0.0.1", trustRoot=ssl.Certificate.loadPEM((ca / "ca.crt").read_bytes()),
        clientCertificate=ssl.PrivateCertificate.loadPEM(
            Path(expired.cert).read_bytes() + b"\n" + Path(expired.key).read_bytes()),
        extraCertificateOptions={"lowerMaximumSecurityTo": ssl.TLSVersion.TLSv1_2},
    )
    factory = WebSocketClientFactory(hub.address.url, protocols=["wamp.2.json"])
    factory.protocol = WirePeer
    factory.opened = defer.Deferred()
    tcp = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", hub.address.port)
    await endpoints.wrapClientTLS(options, tcp).connect(factory)
    peer = await factory.opened.addTimeout(5, reactor)
    assert peer.transport.getHandle().get_protocol_version_name() == "TLSv1.2"
    peer.send(HELLO, uris.REALM, {"roles": {"caller": {}}})
    abort = await peer.next()
    assert abort[0] == ABORT and abort[1]["message"].startswith("certificate CN=node07,OU=node,O=prod: it has expired")
    await peer.until_closed()
    assert joined(hub) == []


@pytest_twisted.ensureDeferred
async def test_a_certificate_not_for_client_use_is_told_so(ca, hub):
    server_only = _files(ca, ca_signed(ca, "node10", usage=ExtendedKeyUsageOID.SERVER_AUTH))
    with pytest.raises(HubUnreachable) as refused:
        await connect_once(reactor, hub.address, server_only, timeout=5)
    assert str(refused.value) == (
        f"the hub refused the session: certificate CN=node10,OU=node,O=prod: it is not for TLS client use; {REISSUE}"
    )
    assert joined(hub) == []


@pytest.mark.parametrize("how", ["expired", "not for client use"])
@pytest_twisted.ensureDeferred
async def test_a_forgery_under_the_ca_s_name_gets_only_the_alert(ca, hub, logged, how):
    """Told only what a certificate the CA signed may be told: a bad signature is an alert, whatever else it has."""
    kw = {"valid_from": -3 * DAY, "valid_for": DAY} if how == "expired" else {"usage": ExtendedKeyUsageOID.SERVER_AUTH}
    forged = _files(ca, ca_signed(ca, "node11", forged=True, **kw))
    with pytest.raises(HubUnreachable) as refused:
        await connect_once(reactor, hub.address, forged, timeout=5)
    assert "TLS handshake failed" in str(refused.value) and "the hub refused the session" not in str(refused.value)
    [line] = refusals(logged)
    assert line.endswith(": certificate CN=node11,OU=node,O=prod: its signature does not verify")
    assert joined(hub) == []


@pytest.mark.parametrize("alert, meaning", [
    ("certificate expired", "the hub says this certificate has expired (or is not valid yet: check the clocks); "
                            "issue a new one with `llmgw pki issue"),
    ("certificate revoked", "the hub's revocation list names this certificate; issue a new one"),
    ("certificate required", "the hub needs a client certificate and this client sent none"),
    ("unknown ca", "check that the CA file is the cluster CA"),
])
def test_a_hub_s_alert_is_read_for_what_it_means(alert, meaning):
    """A hub that refuses by alert (an older one, or a certificate from elsewhere): the client says what it means."""
    from OpenSSL import SSL

    from llmgw.huburl import HubAddress
    from llmgw.link.client import describe_failure

    failure = SSL.Error([("SSL routines", "", f"tls alert {alert}")])
    said = describe_failure(failure, HubAddress("wss://127.0.0.1:7443/", "127.0.0.1", 7443))
    assert said.startswith(f"link to wss://127.0.0.1:7443/ failed: TLS handshake failed (tls alert {alert}): {meaning}")
