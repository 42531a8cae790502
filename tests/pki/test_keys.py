"""Which keys the CA signs: every kind it signs joins the hub over real TLS, and the kinds TLS refuses are refused at signing.

Before, a request for an RSA-1024 or P-192 key was signed; the node then
failed at every handshake with an alert that did not say why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.x509.oid import NameOID
from twisted.internet import reactor

from llmgw import pki
from llmgw.errors import PKIError
from llmgw.link.client import connect_once
from llmgw.pki.keys import key_problem
from tests.link.test_tls_revocation import ca, files, joined, start_hub  # noqa: F401 (ca: a fixture)

SIGNED = {
    "EC P-256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "EC P-384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "EC P-521": lambda: ec.generate_private_key(ec.SECP521R1()),
    "RSA-2048": lambda: rsa.generate_private_key(65537, 2048),
    "Ed25519": ed25519.Ed25519PrivateKey.generate,
    "Ed448": ed448.Ed448PrivateKey.generate,
}
REFUSED = {
    "RSA-1024": lambda: rsa.generate_private_key(65537, 1024),
    "EC secp192r1": lambda: ec.generate_private_key(ec.SECP192R1()),
    "EC secp224r1": lambda: ec.generate_private_key(ec.SECP224R1()),
    "EC secp256k1": lambda: ec.generate_private_key(ec.SECP256K1()),
    "DSA-2048": lambda: dsa.generate_private_key(2048),
}


def request(cn: str, key) -> bytes:
    algorithm = None if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)) else hashes.SHA256()
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])).sign(key, algorithm)
    return csr.public_bytes(serialization.Encoding.PEM)


def keep(directory: Path, name: str, key) -> None:
    (directory / f"{name}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


@pytest.mark.parametrize("kind", SIGNED)
@pytest_twisted.ensureDeferred
async def test_every_kind_of_key_the_ca_signs_joins_the_hub(ca, kind) -> None:  # noqa: F811
    key = SIGNED[kind]()
    pki.sign_request(ca, request("node07", key), "node", name="node07")
    keep(ca, "node07", key)
    hub = await start_hub(ca)
    try:
        session = await connect_once(reactor, hub.address, files(ca, "node07"), timeout=5)
        assert joined(hub) == ["node07"]
        session.leave()
    finally:
        await hub.port.stopListening()


@pytest.mark.parametrize("kind", REFUSED)
def test_a_key_the_links_tls_refuses_is_not_signed_and_the_minimum_is_stated(ca, kind) -> None:  # noqa: F811
    with pytest.raises(PKIError, match=re.escape(
            f"the certificate request's key is {kind}, which the link's TLS refuses (it takes an EC key on "
            "P-256, P-384, P-521, RSA of 2048 to 16384 bits, Ed25519 or Ed448). Make a new key and request")):
        pki.sign_request(ca, request("node07", REFUSED[kind]()), "node", name="node07")
    assert not (ca / "node07.crt").exists()


def test_an_rsa_key_past_what_tls_verifies_is_refused_too() -> None:
    # OpenSSL verifies no RSA signature over 16384 bits; the modulus need not be a real key's to be refused.
    assert "RSA-16385, which the link's TLS refuses" in key_problem(rsa.RSAPublicNumbers(65537, (1 << 16384) + 1).public_key())
    assert key_problem(rsa.RSAPublicNumbers(65537, (1 << 16383) + 1).public_key()) is None


def test_a_ca_whose_own_key_tls_refuses_signs_nothing(tmp_path) -> None:
    import datetime

    directory = tmp_path / "weak"
    directory.mkdir()
    key = rsa.generate_private_key(65537, 1024)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "weak CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keep(directory, "ca", key)
    with pytest.raises(PKIError, match=re.escape(
            f"the CA's key {directory / 'ca.key'} is RSA-1024, which the link's TLS refuses")):
        pki.issue(directory, "node07", "node")
    with pytest.raises(PKIError, match="Create a new CA with `llmgw pki init`"):
        pki.sign_request(directory, request("node07", ec.generate_private_key(ec.SECP256R1())), "node")
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "ca.key"]


@pytest.mark.parametrize("role", ["server", "node", "operator", "router"])
def test_pki_issue_makes_a_key_tls_accepts_for_every_role(tmp_path, role) -> None:
    directory = tmp_path / "ca"
    pki.init_ca(directory)
    cert_path, _ = pki.issue(directory, "holder1", role)
    key = x509.load_pem_x509_certificate(cert_path.read_bytes()).public_key()
    assert key_problem(key) is None and isinstance(key.curve, ec.SECP256R1)
