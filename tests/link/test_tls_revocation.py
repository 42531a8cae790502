"""The hub's TLS over real handshakes on 127.0.0.1: a revoked certificate is refused, and every refusal says who and why.

Before, a certificate could not be taken back (re-issuing a name left the old
one valid until it expired), and the server logged a refused handshake as
"SSL error: certificate verify failed (in )": no peer, no subject, no reason.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet import endpoints, reactor, ssl
from twisted.logger import formatEvent, globalLogPublisher
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol

from llmgw import pki
from llmgw.config.server import load_server_config
from llmgw.control.catalog import Catalog
from llmgw.control.reload import reload_all, revocation_listener
from llmgw.errors import HubUnreachable, PKIError
from llmgw.huburl import HubAddress
from llmgw.link.client import connect_once
from llmgw.link.hub import Hub
from llmgw.link.tls import server_options
from llmgw.roles import ROLE_CONTROL
from llmgw.tlsfiles import TLSFiles
from tests.support.wait import until


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    """A CA of this test's own, since these tests revoke its certificates."""
    directory = tmp_path / "ca"
    pki.init_ca(directory, name="prod")
    pki.issue(directory, "hub", "server", sans=["127.0.0.1"])
    for node in ("node01", "node02"):
        pki.issue(directory, node, "node")
    (directory / "server.yaml").write_text(
        'listen: {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: hub.crt, key: hub.key}\n'
    )
    return directory


def files(directory: Path, name: str) -> TLSFiles:
    return TLSFiles(str(directory / "ca.crt"), str(directory / f"{name}.crt"), str(directory / f"{name}.key"))


@pytest.fixture
def logged():
    """Every log line while the test runs, formatted, with the namespace that wrote it."""
    lines: list[tuple[str, str]] = []

    def observe(event):
        lines.append((event.get("log_namespace", ""), formatEvent(event)))

    globalLogPublisher.addObserver(observe)
    yield lines
    globalLogPublisher.removeObserver(observe)


async def start_hub(directory: Path):
    hub = Hub(reactor)
    tls = server_options(load_server_config(directory / "server.yaml").tls)
    port = await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(
        TLSMemoryBIOFactory(tls, False, hub.websocket_factory())
    )
    hub.address = HubAddress(f"wss://127.0.0.1:{port.getHost().port}/", "127.0.0.1", port.getHost().port)
    hub.tls, hub.port = tls, port
    return hub


@pytest_twisted.async_yield_fixture
async def hub(ca):
    hub = await start_hub(ca)
    yield hub
    for session in list(hub.sessions.values()):
        session.drop()
    await hub.port.stopListening()


def joined(hub) -> list[str]:
    return sorted(s.authid for s in hub.sessions.values() if s.role != ROLE_CONTROL)


def refusals(logged) -> list[str]:
    # Refusals about a certificate: every one these tests provoke is.  A
    # garbled handshake another test left behind ("the hub ended the
    # handshake (decode error)") can land in this test's window.
    return [text for _, text in logged if text.startswith("refused the link connection") and "certificate" in text]


def server_side_tls_noise(logged) -> list[str]:
    # What autobahn's server protocol logs for a TLS failure it was not told the reason of.
    return [text for ns, text in logged if "ServerProtocol" in ns and "SSL error" in text]


@pytest_twisted.ensureDeferred
async def test_a_revoked_certificate_gets_no_session_and_is_told_why(ca, logged) -> None:
    serial = x509.load_pem_x509_certificate((ca / "node02.crt").read_bytes()).serial_number
    pki.revoke(ca, "node02")
    today = datetime.datetime.now(datetime.timezone.utc)
    hub = await start_hub(ca)
    try:
        with pytest.raises(HubUnreachable) as refused:
            await connect_once(reactor, hub.address, files(ca, "node02"), timeout=5)
        node01 = await connect_once(reactor, hub.address, files(ca, "node01"), timeout=5)
        assert joined(hub) == ["node01"]
        assert [p.subject for p in hub.tls.live()] == ["CN=node01,OU=node,O=prod"]  # node02's is no live peer
        node01.leave()
    finally:
        await hub.port.stopListening()

    # What the agent's log and ctl show: the hub's reason, and what to do, not only a TLS alert's name.
    assert str(refused.value) == (
        f"the hub refused the session: certificate CN=node02,OU=node,O=prod: revoked on {today:%Y-%m-%d} "
        f"(serial {serial:x}); issue a new certificate with `llmgw pki issue DIR NAME --role ROLE --force` where the CA is"
    )
    [line] = refusals(logged)
    assert line.startswith("refused the link connection from 127.0.0.1:")
    assert line.endswith(f": certificate CN=node02,OU=node,O=prod: revoked on {today:%Y-%m-%d} (serial {serial:x})")
    assert server_side_tls_noise(logged) == []


@pytest_twisted.ensureDeferred
async def test_a_reload_revokes_without_a_restart_and_closes_the_live_session(ca, hub, logged) -> None:
    catalog = Catalog(load_server_config(ca / "server.yaml"))
    listeners = [revocation_listener(hub.tls)]
    node01 = await connect_once(reactor, hub.address, files(ca, "node01"), timeout=5)
    await connect_once(reactor, hub.address, files(ca, "node02"), timeout=5)
    assert joined(hub) == ["node01", "node02"]
    assert [p.subject for p in hub.tls.live()] == ["CN=node01,OU=node,O=prod", "CN=node02,OU=node,O=prod"]

    pki.revoke(ca, "node02")
    assert hub.tls.revoked_peers() == []  # written, not yet read: nothing changes until the reload
    outcome = reload_all(catalog, listeners)

    assert outcome.refused is None
    # What `ctl reload` prints: the list's change, not "no changes".
    assert outcome.changes == (f"revocation list {ca}/crl.pem: 1 certificates revoked (+1); 1 connections closed",)
    await until(lambda: joined(hub) == ["node01"], "node02's session to be closed")
    [closed] = [text for _, text in logged if text.startswith("closed the link connection")]
    assert closed.startswith("closed the link connection of CN=node02,OU=node,O=prod from 127.0.0.1:")
    assert ": its certificate was revoked on " in closed
    with pytest.raises(HubUnreachable, match="the hub refused the session: certificate CN=.*: revoked on "):
        await connect_once(reactor, hub.address, files(ca, "node02"), timeout=5)
    [refused] = refusals(logged)
    assert refused.endswith(closed.split("its certificate was ")[1])
    assert node01.is_attached()
    node01.leave()


@pytest_twisted.ensureDeferred
async def test_a_certificate_re_issued_under_its_name_is_revoked_by_its_serial(ca, hub) -> None:
    old = x509.load_pem_x509_certificate((ca / "node01.crt").read_bytes())
    (ca / "old.crt").write_bytes((ca / "node01.crt").read_bytes())
    (ca / "old.key").write_bytes((ca / "node01.key").read_bytes())
    pki.issue(ca, "node01", "node", force=True)
    pki.revoke(ca, serial=old.serial_number)
    assert reload_all(Catalog(load_server_config(ca / "server.yaml")), [revocation_listener(hub.tls)]).refused is None

    with pytest.raises(HubUnreachable, match="the hub refused the session: certificate CN=.*: revoked on "):
        await connect_once(reactor, hub.address, files(ca, "old"), timeout=5)
    renewed = await connect_once(reactor, hub.address, files(ca, "node01"), timeout=5)
    assert joined(hub) == ["node01"]
    renewed.leave()


def test_a_list_not_signed_by_the_cluster_ca_refuses_the_reload_and_keeps_the_old_one(ca, tmp_path) -> None:
    pki.revoke(ca, "node02")
    tls = server_options(load_server_config(ca / "server.yaml").tls)
    other = tmp_path / "other"
    pki.init_ca(other, name="prod")
    pki.issue(other, "x", "node")
    pki.revoke(other, "x")
    (ca / "crl.pem").write_bytes((other / "crl.pem").read_bytes())

    outcome = reload_all(Catalog(load_server_config(ca / "server.yaml")), [revocation_listener(tls)])

    assert outcome.refused == (
        f"reload refused, the old catalog stays: the revocation list refused it: {ca}/crl.pem is not signed by "
        "the cluster CA 'CN=prod CA,O=prod'; write it with `llmgw pki revoke` in that CA's directory"
    )
    assert len(tls.revocations) == 1


def test_a_list_that_is_gone_refuses_the_reload_rather_than_forget_it(ca) -> None:
    pki.revoke(ca, "node02")
    tls = server_options(load_server_config(ca / "server.yaml").tls)
    (ca / "crl.pem").unlink()

    outcome = reload_all(Catalog(load_server_config(ca / "server.yaml")), [revocation_listener(tls)])

    assert outcome.refused is not None
    assert f"{ca}/crl.pem is gone, and the hub would forget the 1 certificates it revokes" in outcome.refused
    assert len(tls.revocations) == 1


def test_tls_crl_in_server_yaml_names_the_list(ca, tmp_path) -> None:
    pki.revoke(ca, "node02")
    elsewhere = tmp_path / "lists" / "revoked.pem"
    elsewhere.parent.mkdir()
    (ca / "crl.pem").rename(elsewhere)
    (ca / "server.yaml").write_text(
        f'listen: {{link: "ssl:7443"}}\ntls: {{ca: ca.crt, cert: hub.crt, key: hub.key, crl: {elsewhere}}}\n'
    )
    tls = server_options(load_server_config(ca / "server.yaml").tls)
    assert (tls.revocations.path, len(tls.revocations)) == (str(elsewhere), 1)


def test_a_server_that_starts_with_a_foreign_list_does_not_start(ca, tmp_path) -> None:
    (ca / "crl.pem").write_text("not a list\n")
    with pytest.raises(PKIError, match="crl.pem is not a certificate revocation list"):
        server_options(load_server_config(ca / "server.yaml").tls)


@pytest_twisted.ensureDeferred
async def test_a_certificate_from_another_ca_is_logged_with_peer_subject_and_reason(ca, hub, other_pki, logged) -> None:
    stranger = TLSFiles(str(ca / "ca.crt"), str(other_pki / "node01.crt"), str(other_pki / "node01.key"))
    with pytest.raises(HubUnreachable):
        await connect_once(reactor, hub.address, stranger, timeout=5)
    [line] = refusals(logged)
    assert line.startswith("refused the link connection from 127.0.0.1:")
    assert line.endswith(": certificate CN=node01,OU=node,O=other-cluster: it was not issued by the cluster CA")
    assert server_side_tls_noise(logged) == []


@pytest_twisted.ensureDeferred
async def test_a_client_without_a_certificate_is_logged(ca, hub, logged) -> None:
    from llmgw.link.client import _factory
    from autobahn.twisted.wamp import ApplicationSession
    from twisted.internet import defer

    lost = defer.Deferred()
    factory = _factory(hub.address, ApplicationSession)
    factory.on_lost = lambda reason: lost.called or lost.callback(None)
    options = ssl.optionsForClientTLS("127.0.0.1", trustRoot=ssl.Certificate.loadPEM((ca / "ca.crt").read_bytes()))
    tcp = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", hub.address.port)
    await endpoints.wrapClientTLS(options, tcp).connect(factory)
    await lost
    await until(lambda: refusals(logged), "the hub to log the refusal")
    [line] = refusals(logged)
    assert line.startswith("refused the link connection from 127.0.0.1:")
    assert line.endswith(": it sent no client certificate; a node, an operator and a router each need one "
                         "from `llmgw pki issue`")
    assert server_side_tls_noise(logged) == []


def _odd_certificate(directory: Path, cn: str) -> tuple[Path, Path]:
    """A node certificate from the CA with a CN `llmgw pki issue` would refuse to write."""
    return ca_signed(directory, cn)


def ca_signed(directory: Path, cn: str, ou: str | None = "node", valid_from: datetime.timedelta = -datetime.timedelta(hours=1),
              valid_for: datetime.timedelta = datetime.timedelta(days=1), name: str = "odd",
              usage=ExtendedKeyUsageOID.CLIENT_AUTH, forged: bool = False) -> tuple[Path, Path]:
    """A client certificate signed by *directory*'s CA as `llmgw pki issue` would not write it: its CN, OU
    (None: none) and validity (from now + *valid_from*, for *valid_for*) as given; written as NAME.crt and NAME.key.
    *forged*: signed by another key under the CA's name."""
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    if forged:
        ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.datetime.now(datetime.timezone.utc) + valid_from
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "prod")]
    if ou is not None:
        subject.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_for)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


FORGED = "node05\n2026-12-01T00:00:00 [-] joined: control\x1b[2J"


def _no_raw_forgery(logged) -> None:
    for _, text in logged:
        assert "\n2026-12-01T00:00:00" not in text and "\x1b" not in text, text


@pytest_twisted.ensureDeferred
async def test_a_cn_with_a_newline_never_reaches_a_log_line_raw(ca, hub, logged) -> None:
    cert, key = _odd_certificate(ca, FORGED)
    with pytest.raises(HubUnreachable):
        await connect_once(reactor, hub.address, TLSFiles(str(ca / "ca.crt"), str(cert), str(key)), timeout=5)
    _no_raw_forgery(logged)
    assert any("CN=node05\\n2026-12-01T00:00:00 [-] joined: control\\x1b[2J" in text
               for _, text in logged)


@pytest_twisted.ensureDeferred
async def test_a_revoked_cn_with_a_newline_is_logged_escaped(ca, logged) -> None:
    cert, key = _odd_certificate(ca, FORGED)
    pki.revoke(ca, serial=x509.load_pem_x509_certificate(cert.read_bytes()).serial_number)
    hub = await start_hub(ca)
    try:
        with pytest.raises(HubUnreachable, match="the hub refused the session: certificate CN=.*: revoked on "):
            await connect_once(reactor, hub.address, TLSFiles(str(ca / "ca.crt"), str(cert), str(key)), timeout=5)
    finally:
        await hub.port.stopListening()
    _no_raw_forgery(logged)
    [line] = refusals(logged)
    assert "certificate CN=node05\\n2026-12-01T00:00:00 " in line and ": revoked on " in line


@pytest_twisted.ensureDeferred
async def test_the_hub_knows_each_live_certificate_s_expiry(ca, hub) -> None:
    node = await connect_once(reactor, hub.address, files(ca, "node01"), timeout=5)
    cert = x509.load_pem_x509_certificate((ca / "node01.crt").read_bytes())
    [peer] = hub.tls.live()
    assert (peer.serial, peer.not_after) == (cert.serial_number, cert.not_valid_after_utc)
    identity = pki.identity_of(cert)
    assert (identity.serial, identity.not_after) == (cert.serial_number, cert.not_valid_after_utc)
    node.leave()


def test_twisted_still_reports_a_handshake_s_end_through_reason_unless_one_is_set() -> None:
    # llmgw.link.tls sets it so that a refusal ends with the hub's sentence, not OpenSSL's.
    assert TLSMemoryBIOProtocol._reason is None
    import inspect

    assert "if self._reason is None:" in inspect.getsource(TLSMemoryBIOProtocol._tlsShutdownFinished)


@pytest_twisted.ensureDeferred
async def test_a_tcp_probe_that_sends_nothing_is_no_refusal(ca, hub, other_pki, logged) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", hub.address.port)):
        pass
    stranger = TLSFiles(str(ca / "ca.crt"), str(other_pki / "node01.crt"), str(other_pki / "node01.key"))
    with pytest.raises(HubUnreachable):
        await connect_once(reactor, hub.address, stranger, timeout=5)
    # The stranger came after the probe, so the probe's line would be first.
    [line] = refusals(logged)
    assert "it was not issued by the cluster CA" in line


@pytest_twisted.ensureDeferred
async def test_a_link_garbled_after_its_handshake_is_not_logged_as_a_refused_connection(hub, ca, logged) -> None:
    """A fatal alert on an established link (a peer killed mid-record) ends it; it was not refused."""
    from tests.link.test_limits import until
    from tests.link.wire import wire_peer

    peer = await wire_peer(hub, files(ca, "node01"))  # TLS and WebSocket open
    tcp = peer.transport.transport  # beneath TLS: what reaches the hub's OpenSSL unencrypted
    tcp.write(b"\x17\x03\x03\x00\x20" + b"\x00" * 32)  # an application-data record that decrypts to nothing
    await until(lambda: not tcp.connected, "the hub to end the link")
    noise = [text for _, text in logged if text.startswith("refused the link connection")]
    assert noise == []
