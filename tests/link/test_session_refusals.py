"""Every session the hub refuses at HELLO is counted in llmgw_link_refusals_total, by a kind llmgw names.

Before, a certificate the cluster CA signed but refused for its dates, its
revocation, its purpose or its subject completed its handshake and got
ABORT at HELLO, and no figure counted it; nor a HELLO for another realm, nor
one claiming another certificate's name; nor a connection refused by a TLS
alert (a certificate from elsewhere, a forgery, none at all).  Now each is
counted once, under a label from llmgw's fixed set (``link.metrics.LIMITS``),
never a peer's text.
"""

from __future__ import annotations

import datetime
import socket

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from cryptography.x509.oid import ExtendedKeyUsageOID
from prometheus_client import CollectorRegistry
from twisted.internet import defer, endpoints, reactor, ssl

from llmgw import pki
from llmgw.errors import HubUnreachable
from llmgw.link import uris
from llmgw.link.client import _factory, connect_once
from llmgw.link.metrics import LIMITS, LinkCollector
from llmgw.tlsfiles import TLSFiles
from tests.link.test_tls_revocation import ca, ca_signed, files, start_hub  # noqa: F401  (fixtures)
from tests.link.wire import ABORT, HELLO, wire_peer
from tests.support.wait import until

DAY = datetime.timedelta(days=1)
ROLES = {"caller": {}}


def signed(ca, name: str, **kw) -> TLSFiles:
    cert, key = ca_signed(ca, name, name=name, **kw)
    return TLSFiles(str(ca / "ca.crt"), str(cert), str(key))


@pytest_twisted.ensureDeferred
async def test_each_session_refused_at_hello_is_counted_by_its_kind(ca):
    pki.revoke(ca, "node02")
    hub = await start_hub(ca)
    registry = CollectorRegistry()
    registry.register(LinkCollector(hub, {}))
    hostile = "x\n{limit=\"pwned\"}\x1b[2J" + "y" * 300
    cases = [
        ("certificate_expired", signed(ca, "node07", valid_from=-3 * DAY, valid_for=DAY), {}),
        ("certificate_not_yet_valid", signed(ca, "node08", valid_from=2 * DAY, valid_for=DAY), {}),
        ("certificate_purpose", signed(ca, "node10", usage=ExtendedKeyUsageOID.SERVER_AUTH), {}),
        ("certificate_revoked", files(ca, "node02"), {}),
        ("certificate_subject", signed(ca, "node09", ou=None), {}),  # no role
        ("certificate_subject", files(ca, "hub"), {}),  # the hub's own certificate, as a client
        ("certificate_subject", signed(ca, "a.b"), {}),  # a node whose CN is no short host name
        ("no_such_realm", files(ca, "node01"), {"realm": "llmgw.prod"}),
        ("authid_mismatch", files(ca, "node01"), {"authid": hostile}),
    ]
    try:
        for kind, tls, hello in cases:
            before = registry.get_sample_value("llmgw_link_refusals_total", {"limit": kind})
            assert before is not None, f"{kind} is not emitted before its first refusal"
            peer = await wire_peer(hub, tls)
            details = {"roles": ROLES, **({"authid": hello["authid"]} if "authid" in hello else {})}
            peer.send(HELLO, hello.get("realm", uris.REALM), details)
            abort = await peer.next()
            assert abort[0] == ABORT, (kind, abort)
            assert registry.get_sample_value("llmgw_link_refusals_total", {"limit": kind}) == before + 1, kind
        labels = {s.labels["limit"] for m in registry.collect() if m.name == "llmgw_link_refusals" for s in m.samples}
        assert labels == set(LIMITS)  # no peer's text became a label
    finally:
        for session in list(hub.sessions.values()):
            session.drop()
        await hub.port.stopListening()


@pytest_twisted.ensureDeferred
async def test_each_connection_refused_by_a_tls_alert_is_counted_by_its_kind(ca, other_pki):
    hub = await start_hub(ca)
    registry = CollectorRegistry()
    registry.register(LinkCollector(hub, {}, hub.tls))

    def count(kind: str) -> float:
        return registry.get_sample_value("llmgw_link_refusals_total", {"limit": kind})

    try:
        with socket.create_connection(("127.0.0.1", hub.address.port)):
            pass  # a TCP probe: no TLS client, no refusal
        stranger = TLSFiles(str(ca / "ca.crt"), str(other_pki / "node01.crt"), str(other_pki / "node01.key"))
        cases = [
            ("tls_certificate", stranger),
            ("tls_certificate", signed(ca, "node11", forged=True)),
            ("tls_no_certificate", None),
        ]
        for kind, tls in cases:
            before = {k: count(k) for k in LIMITS}
            if tls is not None:
                with pytest.raises(HubUnreachable):
                    await connect_once(reactor, hub.address, tls, timeout=5)
            else:
                options = ssl.optionsForClientTLS("127.0.0.1",
                                                  trustRoot=ssl.Certificate.loadPEM((ca / "ca.crt").read_bytes()))
                lost = defer.Deferred()
                factory = _factory(hub.address, ApplicationSession)
                factory.on_lost = lambda reason: lost.called or lost.callback(None)
                tcp = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", hub.address.port)
                await endpoints.wrapClientTLS(options, tcp).connect(factory)
                await lost
            await until(lambda: count(kind) == before[kind] + 1, f"the hub to count a {kind} refusal")
            assert {k: count(k) for k in LIMITS} == {**before, kind: before[kind] + 1}  # that one, once: not the probe
    finally:
        await hub.port.stopListening()
