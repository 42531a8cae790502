"""What a certificate from `llmgw pki` says on the link (identity_of), and that mutual TLS accepts it."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from twisted.internet import defer, endpoints, protocol, ssl
from twisted.internet.interfaces import IHandshakeListener
from zope.interface import implementer

from llmgw import pki
from llmgw.errors import PKIError


# -- identity_of ------------------------------------------------------------


def _certificate_with(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "somebody's CA")]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )


CN, OU = NameOID.COMMON_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME


def test_identity_of_reads_cn_and_ou() -> None:
    identity = pki.identity_of(_certificate_with((OU, "operator"), (CN, "alice")))
    assert identity == pki.CertificateSubject(name="alice", role="operator")
    with pytest.raises(AttributeError):
        identity.name = "mallory"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("attributes", "complaint"),
    [
        ([(OU, "node")], "has no CN"),
        ([(CN, "node05")], "has no OU"),
        ([(OU, "node"), (CN, "node05"), (CN, "node06")], "has 2 CNs"),
        ([(OU, "node"), (OU, "operator"), (CN, "node05")], "has 2 OUs"),
        ([(OU, "agent"), (CN, "node05")], "role OU='agent'"),
        ([(OU, "control"), (CN, "node05")], "role OU='control'"),
        ([(OU, "node"), (CN, "../node05")], "not a usable certificate name"),
    ],
)
def test_identity_of_refuses_a_certificate_without_one_clear_identity(
    attributes, complaint: str
) -> None:
    with pytest.raises(PKIError, match=complaint):
        pki.identity_of(_certificate_with(*attributes))


# -- a real handshake ---------------------------------------------------------


@implementer(IHandshakeListener)
class _End(protocol.Protocol):
    def __init__(self) -> None:
        self.handshook = False
        self.peer: x509.Certificate | None = None
        self.received = b""
        self.reason = None
        self.lost: defer.Deferred[None] = defer.Deferred()

    def handshakeCompleted(self) -> None:
        self.handshook = True
        peer = self.transport.getPeerCertificate()
        self.peer = None if peer is None else peer.to_cryptography()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason) -> None:
        self.reason = reason
        self.lost.callback(None)


class _Hub(_End):
    def handshakeCompleted(self) -> None:
        super().handshakeCompleted()
        self.transport.write(b"welcome")
        self.transport.loseConnection()


def _private(directory: Path, name: str) -> ssl.PrivateCertificate:
    return ssl.PrivateCertificate.loadPEM(
        (directory / f"{name}.crt").read_text() + (directory / f"{name}.key").read_text()
    )


def _hub_options(directory: Path, name: str) -> ssl.CertificateOptions:
    # As the hub listens: present our certificate, require one from the CA.
    mine = _private(directory, name)
    return ssl.CertificateOptions(
        privateKey=mine.privateKey.original,
        certificate=mine.original,
        verify=True,
        caCerts=[ssl.Certificate.loadPEM((directory / "ca.crt").read_bytes()).original],
        requireCertificate=True,
    )


def _client_options(trust: Path, hostname: str, cert_dir: Path | None, name: str | None):
    return ssl.optionsForClientTLS(
        hostname,
        trustRoot=ssl.Certificate.loadPEM((trust / "ca.crt").read_bytes()),
        clientCertificate=None if cert_dir is None else _private(cert_dir, name),
    )


async def _connect(hub_options, client_options) -> tuple[_End, object, _End, object]:
    from twisted.internet import reactor

    hubs: list[_End] = []

    class Factory(protocol.Factory):
        def buildProtocol(self, addr):
            hubs.append(_Hub())
            return hubs[-1]

    port = await endpoints.SSL4ServerEndpoint(
        reactor, 0, hub_options, interface="127.0.0.1"
    ).listen(Factory())
    try:
        client = _End()
        await endpoints.SSL4ClientEndpoint(
            reactor, "127.0.0.1", port.getHost().port, client_options
        ).connect(protocol.Factory.forProtocol(lambda: client)).addTimeout(10, reactor)
        await client.lost.addTimeout(10, reactor)
        await hubs[0].lost.addTimeout(10, reactor)
    finally:
        await port.stopListening()
    return client, client.reason, hubs[0], hubs[0].reason


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    directory = tmp_path / "cluster"
    pki.init_ca(directory, name="prod")
    pki.issue(directory, "hub", "server", sans=["127.0.0.1"])
    pki.issue(directory, "node05", "node")
    return directory


@pytest.fixture
def stranger(tmp_path: Path) -> Path:
    directory = tmp_path / "elsewhere"
    pki.init_ca(directory, name="prod")
    pki.issue(directory, "hub", "server", sans=["127.0.0.1"])
    pki.issue(directory, "node05", "node")
    return directory


@pytest.mark.parametrize("hostname", ["hub", "127.0.0.1"])
@pytest_twisted.ensureDeferred
async def test_node_and_hub_from_one_ca_complete_mutual_tls(cluster: Path, hostname: str) -> None:
    client, _, hub, _ = await _connect(
        _hub_options(cluster, "hub"), _client_options(cluster, hostname, cluster, "node05")
    )

    assert hub.handshook and client.received == b"welcome"
    assert pki.identity_of(hub.peer) == pki.CertificateSubject(name="node05", role="node")
    assert pki.identity_of(client.peer) == pki.CertificateSubject(name="hub", role="server")


@pytest_twisted.ensureDeferred
async def test_hub_refuses_a_node_certificate_from_another_ca(
    cluster: Path, stranger: Path
) -> None:
    client, _, hub, hub_reason = await _connect(
        _hub_options(cluster, "hub"), _client_options(cluster, "hub", stranger, "node05")
    )

    assert not hub.handshook and hub.peer is None
    assert client.received == b""
    assert hub_reason.check(SSL.Error)
    assert "certificate verify failed" in str(hub_reason.value)


@pytest_twisted.ensureDeferred
async def test_hub_refuses_a_client_without_a_certificate(cluster: Path) -> None:
    client, _, hub, hub_reason = await _connect(
        _hub_options(cluster, "hub"), _client_options(cluster, "hub", None, None)
    )

    assert not hub.handshook and client.received == b""
    assert hub_reason.check(SSL.Error)
    assert "peer did not return a certificate" in str(hub_reason.value)


@pytest_twisted.ensureDeferred
async def test_node_refuses_a_hub_certificate_from_another_ca(
    cluster: Path, stranger: Path
) -> None:
    client, client_reason, hub, _ = await _connect(
        _hub_options(stranger, "hub"), _client_options(cluster, "hub", cluster, "node05")
    )

    assert not client.handshook and client.received == b""
    assert client_reason.check(SSL.Error)
    assert "certificate verify failed" in str(client_reason.value)
    assert not hub.handshook
