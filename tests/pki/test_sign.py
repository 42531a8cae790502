"""`llmgw pki sign`: a certificate for a key the CA never sees."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw import pki
from llmgw.errors import PKIError
from tests.support.cluster import environment


def _request(cn: str, key=None) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    key = key or ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                                 x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "operator")]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM), key


@pytest.fixture
def ca(tmp_path):
    pki.init_ca(tmp_path / "ca", name="prod")
    return tmp_path / "ca"


def test_sign_keeps_the_key_with_its_holder_and_the_role_with_the_signer(ca):
    request, key = _request("node07")
    path = pki.sign_request(ca, request, "node", name="node07")
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    assert path == ca / "node07.crt"
    assert not (ca / "node07.key").exists()
    # The request asked for OU=operator; the signer said node.
    assert pki.identity_of(cert).role == "node"
    assert pki.identity_of(cert).name == "node07"
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes()))


def test_sign_refuses_a_request_for_another_name_a_dotted_node_and_a_second_certificate(ca):
    with pytest.raises(PKIError, match="the certificate request is for 'node07', not 'node08'"):
        pki.sign_request(ca, _request("node07")[0], "node", name="node08")
    with pytest.raises(PKIError, match="one DNS label"):
        pki.sign_request(ca, _request("node07.example.org")[0], "node")
    pki.sign_request(ca, _request("node07")[0], "node")
    with pytest.raises(PKIError, match="already exists; to replace it, run again with --force"):
        pki.sign_request(ca, _request("node07")[0], "node")
    pki.sign_request(ca, _request("node07")[0], "node", force=True)


def test_sign_refuses_what_is_not_a_request_or_whose_signature_does_not_hold(ca):
    with pytest.raises(PKIError, match="not a PEM certificate request"):
        pki.sign_request(ca, b"hello", "node")
    with pytest.raises(PKIError, match="is not one"):
        pki.sign_request(ca, b"x" * (pki.authority.MAX_REQUEST_BYTES + 1), "node")
    good, _ = _request("node07")
    der = x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER)
    # Flip a bit of the signature, the DER's last byte.
    tampered = der[:-1] + bytes([der[-1] ^ 1])
    pem = x509.load_der_x509_csr(tampered).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(PKIError, match="signature does not hold"):
        pki.sign_request(ca, pem, "node")


def test_pki_sign_command_reads_the_request_from_stdin(ca):
    request, _ = _request("node09")
    out = subprocess.run([sys.executable, "-m", "llmgw", "pki", "sign", str(ca), "-", "--role", "node"],
                         input=request, capture_output=True, timeout=60, env=environment())
    assert out.returncode == 0, out.stderr
    assert b"wrote " in out.stdout and b"its key never left it" in out.stdout
    assert (ca / "node09.crt").exists()
