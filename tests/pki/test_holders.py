"""What the onboarding CA may act on: node certificates only, under a node's name, and never a revoked key again.

Before, ``sign_node(NAME, CSR, replace=True)`` and ``revoke_node(NAME)``
acted on whatever NAME.crt was beside the CA: an operator's and a router
worker's certificates were revoked, and the server's own certificate file
was overwritten with a node's (the next server restart failed).  A key whose
certificate had been revoked was signed again on the "same key, renewal"
path, and ``--force`` turned any role's file into another role's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw import pki
from llmgw.errors import PKIError
from llmgw.pki.nodes import revoke_node, sign_node

OTHERS = [("llmgw-server", "server"), ("alice", "operator"), ("r1", "router")]


@pytest.fixture
def ca(tmp_path, pki):  # noqa: F811 (the session's CA, copied: these tests write to it)
    shutil.copytree(pki, tmp_path / "ca")
    return tmp_path / "ca"


def request(cn: str, key=None, extensions=(), subject=()) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([*subject, x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def read(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.mark.parametrize("name, role", OTHERS)
def test_onboarding_neither_signs_over_nor_revokes_a_certificate_of_another_role(ca, name, role) -> None:
    before = snapshot(ca)
    said = f"{ca / name}.crt is the {role} certificate of {name}, not a node's; onboarding signs and revokes nodes' certificates only"
    for replace in (False, True):
        with pytest.raises(PKIError, match=f"^{said}") as refused:
            sign_node(ca, name, request(name), replace=replace)
    assert f"`llmgw pki revoke {ca} {name}` on the CA's host" in str(refused.value)
    with pytest.raises(PKIError, match=f"^{said}"):
        revoke_node(ca, name)
    assert snapshot(ca) == before  # nothing written, nothing revoked: no crl.pem either


def test_a_case_variant_that_is_the_same_file_is_refused_as_that_files_holder(ca) -> None:
    # On a case-insensitive file system Alice.crt is alice.crt; a link stands in for one here.
    os.link(ca / "alice.crt", ca / "Alice.crt")
    before = snapshot(ca)
    with pytest.raises(PKIError, match="is the operator certificate of alice, not a node's"):
        sign_node(ca, "Alice", request("Alice"), replace=True)
    with pytest.raises(PKIError, match="is the operator certificate of alice, not a node's"):
        revoke_node(ca, "Alice")
    # A node certificate under another node's file name is refused too.
    os.link(ca / "node01.crt", ca / "Node01.crt")
    with pytest.raises(PKIError, match="is the certificate of node node01, not of Node01; move it away"):
        revoke_node(ca, "Node01")
    assert snapshot(ca) == {**before, "Node01.crt": before["node01.crt"]}


@pytest.mark.parametrize("name", [
    "../llmgw-server", "../../etc/passwd", "/etc/passwd", "a/b", "node01\x00", "node01\n", "..", ".", "",
    "n" * 64, "n" * 300, "ca", "CA", "-node", "node_", "nodé",
])
def test_a_name_that_is_no_node_id_is_refused_before_any_file_is_read(ca, name) -> None:
    before, outside = snapshot(ca), snapshot(ca.parent)
    with pytest.raises(PKIError):
        sign_node(ca, name, request("node09"), replace=True)
    with pytest.raises(PKIError):
        revoke_node(ca, name)
    assert snapshot(ca) == before and snapshot(ca.parent) == outside


def test_a_dotted_node_name_is_refused_naming_the_short_name_to_use(ca) -> None:
    for sign in (lambda: sign_node(ca, "node09.example.org", request("node09.example.org")),
                 lambda: pki.sign_request(ca, request("node09.example.org"), "node"),
                 lambda: pki.issue(ca, "node09.example.org", "node")):
        with pytest.raises(PKIError, match=r"^'node09.example.org' is not a single DNS label, .*: use 'node09', "
                                           r"its short host name$"):
            sign()
    # No short name to offer: the rule is said, with an example.
    with pytest.raises(PKIError, match="use the node's short host name \\(what `hostname -s` prints\\), for example"):
        pki.issue(ca, "n" * 64, "node")
    assert not list(ca.glob("node09*"))


def test_force_replaces_a_certificate_only_with_one_for_the_same_holder_and_role(ca) -> None:
    before = snapshot(ca)
    with pytest.raises(PKIError, match=f"^{ca}/llmgw-server.crt is the server certificate of llmgw-server; --force "
                                       "replaces a certificate with one for the same holder and role, not with the "
                                       "node certificate of llmgw-server"):
        pki.issue(ca, "llmgw-server", "node", force=True)
    with pytest.raises(PKIError, match="is the operator certificate of alice; --force replaces"):
        pki.sign_request(ca, request("alice"), "router", force=True)
    assert snapshot(ca) == before
    # The same holder and role: replaced, as before.
    old = read(ca / "alice.crt")
    pki.sign_request(ca, request("alice"), "operator", force=True)
    assert read(ca / "alice.crt").serial_number != old.serial_number


def test_a_revoked_key_is_not_signed_again_without_replace_under_any_name(ca) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    first = sign_node(ca, "edge1", request("edge1", key))
    done = revoke_node(ca, "edge1")
    assert done.revocation.serial == first.certificate.serial_number
    before = snapshot(ca)
    with pytest.raises(PKIError, match=(
            f"^the request's key is the key of edge1.crt, revoked on .* \\(serial {done.revocation.serial:x}\\); "
            "a revoked key is not signed again. Onboard edge1 with a new key: remove node.key")):
        sign_node(ca, "edge1", request("edge1", key))
    with pytest.raises(PKIError, match="the request's key is the key of edge1.crt, revoked on .*Onboard edge2 "):
        sign_node(ca, "edge2", request("edge2", key))
    assert snapshot(ca) == before
    # The operator who trusts the key again says so.
    again = sign_node(ca, "edge1", request("edge1", key), replace=True)
    assert again.certificate.public_key().public_numbers() == key.public_key().public_numbers()
    # A new key for the offboarded name takes nothing from anyone.
    sign_node(ca, "edge1", request("edge1"), replace=True)


def test_pki_sign_refuses_a_revoked_key_too_unless_forced(ca, tmp_path, capsys) -> None:
    from llmgw.cli import main as llmgw

    key = ec.generate_private_key(ec.SECP256R1())
    pki.sign_request(ca, request("edge1", key), "node")
    serial = pki.revoke(ca, "edge1").revocation.serial
    csr = tmp_path / "edge2.csr"
    csr.write_bytes(request("edge2", key))
    assert llmgw(["pki", "sign", str(ca), str(csr), "--role", "node"]) == 1
    said = capsys.readouterr().err
    assert said.startswith(f"llmgw: the request's key is the key of edge1.crt, revoked on ")
    assert f"(serial {serial:x}); a revoked key is not signed again. Have the holder make a new key" in said
    assert not (ca / "edge2.crt").exists()
    assert llmgw(["pki", "sign", str(ca), str(csr), "--role", "node", "--force"]) == 0
    assert read(ca / "edge2.crt").public_key().public_numbers() == key.public_key().public_numbers()


def test_an_expired_certificate_is_renewed_for_the_same_key(ca, tmp_path) -> None:
    import datetime

    key = ec.generate_private_key(ec.SECP256R1())
    sign_node(ca, "edge1", request("edge1", key))
    ca_cert, ca_key = pki.authority._load_ca(ca)
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
    expired = (x509.CertificateBuilder().subject_name(read(ca / "edge1.crt").subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(past - datetime.timedelta(days=1)).not_valid_after(past).sign(ca_key, hashes.SHA256()))
    (ca / "edge1.crt").write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    renewed = sign_node(ca, "edge1", request("edge1", key))
    assert renewed.replaced is None and renewed.certificate.not_valid_after_utc > datetime.datetime.now(datetime.timezone.utc)


def test_what_a_request_asks_for_beyond_its_key_and_cn_is_not_granted(ca) -> None:
    asked = request(
        "edge1",
        extensions=[
            (x509.BasicConstraints(ca=True, path_length=None), True),
            (x509.SubjectAlternativeName([x509.DNSName("llmgw-server"), x509.DNSName("*.example.org")]), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CODE_SIGNING]), False),
            (x509.KeyUsage(True, False, False, False, False, True, True, False, False), True),
        ],
        subject=[x509.NameAttribute(NameOID.ORGANIZATION_NAME, "elsewhere"),
                 x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "server"),
                 x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "operator")],
    )
    cert = sign_node(ca, "edge1", asked).certificate
    assert pki.identity_of(cert) == pki.CertificateSubject("edge1", "node")
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "test-cluster"
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value == x509.SubjectAlternativeName(
        [x509.DNSName("edge1")])
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign and not usage.crl_sign


def test_a_request_with_two_cns_is_refused(ca) -> None:
    two = request("edge1", subject=[x509.NameAttribute(NameOID.COMMON_NAME, "llmgw-server")])
    with pytest.raises(PKIError, match="no single CN"):
        sign_node(ca, "edge1", two)
