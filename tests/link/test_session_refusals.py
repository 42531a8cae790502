"""Every session the hub refuses at HELLO is counted in llmgw_link_refusals_total, by a kind llmgw names.

Before, a certificate the cluster CA signed but refused for its dates, its
revocation, its purpose or its subject completed its handshake and got
ABORT at HELLO, and no figure counted it; nor a HELLO for another realm, nor
one claiming another certificate's name.  Now each is counted once, under a
label from llmgw's fixed set (``link.metrics.LIMITS``), never a peer's text.
"""

from __future__ import annotations

import datetime

import pytest_twisted
from cryptography.x509.oid import ExtendedKeyUsageOID
from prometheus_client import CollectorRegistry

from llmgw import pki
from llmgw.link import uris
from llmgw.link.metrics import LIMITS, LinkCollector
from llmgw.tlsfiles import TLSFiles
from tests.link.test_tls_revocation import ca, ca_signed, files, start_hub  # noqa: F401  (fixtures)
from tests.link.wire import ABORT, HELLO, wire_peer

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
