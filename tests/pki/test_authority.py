"""The cluster CA: what `llmgw pki init` and `issue` write, and what they refuse."""

from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import DNSName as VerifyDNSName
from cryptography.x509.verification import IPAddress as VerifyIPAddress
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from hypothesis import given
from hypothesis import strategies as st

from llmgw import pki
from llmgw.errors import PKIError
from llmgw.roles import CERT_ROLES


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _key(path: Path):
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [a.value for a in cert.subject.get_attributes_for_oid(oid)]


def _ext(cert: x509.Certificate, kind):
    return cert.extensions.get_extension_for_class(kind)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "pki"
    pki.init_ca(directory, name="prod")
    return directory


# -- init -------------------------------------------------------------------


def test_init_creates_a_self_signed_ca(tmp_path: Path) -> None:
    directory = tmp_path / "pki"
    cert_path = pki.init_ca(directory, name="prod")

    assert cert_path == directory / "ca.crt"
    ca = _cert(cert_path)
    ca.verify_directly_issued_by(ca)
    assert ca.subject == ca.issuer
    assert _subject(ca, NameOID.ORGANIZATION_NAME) == ["prod"]
    constraints = _ext(ca, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = _ext(ca, x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature
    ski = _ext(ca, x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(ca.public_key())

    key = _key(directory / "ca.key")
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert isinstance(key.curve, ec.SECP256R1)
    assert key.public_key() == ca.public_key()
    lifetime = ca.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    assert abs(lifetime - datetime.timedelta(days=3650)) < datetime.timedelta(minutes=5)


def test_init_makes_a_new_directory_0700_key_0600_cert_0644(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "pki"
    old = os.umask(0)
    try:
        pki.init_ca(directory)
    finally:
        os.umask(old)

    assert _mode(directory) == 0o700
    assert _mode(directory / "ca.key") == 0o600
    assert _mode(directory / "ca.crt") == 0o644
    assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "ca.key"]


def test_init_into_an_existing_directory_leaves_its_mode(tmp_path: Path) -> None:
    directory = tmp_path / "pki"
    directory.mkdir(mode=0o750)
    os.chmod(directory, 0o750)

    pki.init_ca(directory, days=30)

    assert _mode(directory) == 0o750
    assert _mode(directory / "ca.key") == 0o600


@pytest.mark.parametrize("present", ["ca.key", "ca.crt", "both"])
def test_init_refuses_an_existing_ca_and_leaves_it_alone(tmp_path: Path, present: str) -> None:
    directory = tmp_path / "pki"
    pki.init_ca(directory)
    if present != "both":
        (directory / ({"ca.key", "ca.crt"} - {present}).pop()).unlink()
    before = _snapshot(directory)

    with pytest.raises(PKIError) as refused:
        pki.init_ca(directory)

    message = str(refused.value)
    assert f"{directory}/ca." in message and "already exists" in message
    assert "a cluster has one CA" in message and f"move {directory} away first" in message
    assert _snapshot(directory) == before


@pytest.mark.parametrize("name", ["", " prod", "prod\n", "x" * 62])
def test_init_refuses_an_unusable_cluster_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(PKIError, match="cluster name"):
        pki.init_ca(tmp_path / "pki", name=name)
    assert not (tmp_path / "pki" / "ca.key").exists()


# -- issue ------------------------------------------------------------------


def test_issue_node_certificate_signed_by_the_ca(ca_dir: Path) -> None:
    cert_path, key_path = pki.issue(ca_dir, "node05", "node")

    assert (cert_path, key_path) == (ca_dir / "node05.crt", ca_dir / "node05.key")
    ca, cert = _cert(ca_dir / "ca.crt"), _cert(cert_path)
    cert.verify_directly_issued_by(ca)
    assert _subject(cert, NameOID.COMMON_NAME) == ["node05"]
    assert _subject(cert, NameOID.ORGANIZATIONAL_UNIT_NAME) == ["node"]
    assert _subject(cert, NameOID.ORGANIZATION_NAME) == ["prod"]
    assert cert.subject.rfc4514_string() == "CN=node05,OU=node,O=prod"
    names = _ext(cert, x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["node05"]
    assert names.get_values_for_type(x509.IPAddress) == []
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not _ext(cert, x509.BasicConstraints).value.ca
    aki = _ext(cert, x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == _ext(ca, x509.SubjectKeyIdentifier).value.digest
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    assert abs(lifetime - datetime.timedelta(days=825)) < datetime.timedelta(minutes=5)

    key = _key(key_path)
    assert key.public_key() == cert.public_key()
    assert isinstance(key.curve, ec.SECP256R1)
    assert key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert pki.identity_of(cert) == pki.CertificateSubject(name="node05", role="node")


def test_issue_server_certificate_with_extra_names(ca_dir: Path) -> None:
    cert_path, _ = pki.issue(
        ca_dir, "hub", "server", sans=["cp.example.org", "10.0.0.5", "::1", "hub"]
    )

    cert = _cert(cert_path)
    names = _ext(cert, x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["hub", "cp.example.org"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("::1"),
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    ]


@pytest.mark.parametrize("role", CERT_ROLES)
def test_each_role_passes_a_strict_verifier_for_what_it_is_for(ca_dir: Path, role: str) -> None:
    cert = _cert(pki.issue(ca_dir, f"x-{role}", role, sans=["127.0.0.1"])[0])
    store = Store([_cert(ca_dir / "ca.crt")])

    client = PolicyBuilder().store(store).build_client_verifier().verify(cert, [])
    assert x509.DNSName(f"x-{role}") in client.subjects
    server = PolicyBuilder().store(store).build_server_verifier(VerifyDNSName(f"x-{role}"))
    if role == "server":
        server.verify(cert, [])
        by_ip = PolicyBuilder().store(store).build_server_verifier(
            VerifyIPAddress(ipaddress.ip_address("127.0.0.1"))
        )
        by_ip.verify(cert, [])
    else:
        with pytest.raises(VerificationError):
            server.verify(cert, [])


def test_issue_writes_key_0600_and_certificate_0644_whatever_the_umask(ca_dir: Path) -> None:
    for umask, name in ((0o000, "open"), (0o077, "closed")):
        old = os.umask(umask)
        try:
            cert_path, key_path = pki.issue(ca_dir, name, "operator")
        finally:
            os.umask(old)
        assert _mode(key_path) == 0o600, umask
        assert _mode(cert_path) == 0o644, umask


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a descriptor")
def test_no_byte_of_a_key_is_written_to_a_file_others_can_read(
    ca_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple[str, int]] = []
    real_write, real_chmod = os.write, os.chmod

    def spy_write(fd: int, data) -> int:
        written.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_IMODE(os.fstat(fd).st_mode)))
        return real_write(fd, data)

    def spy_chmod(path, mode, *a, **kw):
        assert not str(path).endswith(".key"), f"chmod after the fact on {path}"
        return real_chmod(path, mode, *a, **kw)

    monkeypatch.setattr(os, "write", spy_write)
    monkeypatch.setattr(os, "chmod", spy_chmod)
    pki.issue(ca_dir, "node05", "node")
    monkeypatch.undo()

    key_writes = [mode for path, mode in written if ".node05.key." in path]
    assert key_writes and set(key_writes) == {0o600}


def test_reissue_refuses_without_force(ca_dir: Path) -> None:
    pki.issue(ca_dir, "node05", "node")
    before = _snapshot(ca_dir)

    with pytest.raises(PKIError) as refused:
        pki.issue(ca_dir, "node05", "node")

    assert f"{ca_dir}/node05.crt already exists" in str(refused.value)
    assert "--force" in str(refused.value)
    assert _snapshot(ca_dir) == before


def test_a_lone_key_left_behind_also_needs_force(ca_dir: Path) -> None:
    _, key_path = pki.issue(ca_dir, "node05", "node")
    (ca_dir / "node05.crt").unlink()

    with pytest.raises(PKIError, match=r"node05\.key already exists"):
        pki.issue(ca_dir, "node05", "node")
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca.crt", "ca.key", "node05.key"]


def test_a_file_that_appears_while_issuing_is_not_overwritten(
    ca_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another `llmgw pki issue` writes node05.crt after our check and before
    # our rename; ours must lose without leaving half a pair behind.
    real_generate = ec.generate_private_key

    def racing_generate(curve):
        (ca_dir / "node05.crt").write_bytes(b"theirs")
        return real_generate(curve)

    monkeypatch.setattr(ec, "generate_private_key", racing_generate)
    with pytest.raises(PKIError, match=r"node05\.crt already exists"):
        pki.issue(ca_dir, "node05", "node")

    assert (ca_dir / "node05.crt").read_bytes() == b"theirs"
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca.crt", "ca.key", "node05.crt"]


def test_reissue_with_force_replaces_both_files(ca_dir: Path) -> None:
    old_cert_path, old_key_path = pki.issue(ca_dir, "node05", "node")
    old_cert, old_key = old_cert_path.read_bytes(), old_key_path.read_bytes()

    cert_path, key_path = pki.issue(ca_dir, "node05", "node", force=True)

    assert cert_path.read_bytes() != old_cert and key_path.read_bytes() != old_key
    assert _key(key_path).public_key() == _cert(cert_path).public_key()
    _cert(cert_path).verify_directly_issued_by(_cert(ca_dir / "ca.crt"))
    assert _mode(key_path) == 0o600 and _mode(cert_path) == 0o644
    assert sorted(p.name for p in ca_dir.iterdir()) == [
        "ca.crt", "ca.key", "node05.crt", "node05.key"
    ]


@pytest.mark.parametrize(
    "name",
    ["../x", "a/b", "", "-x", ".hidden", "..", "a..b", "x-", "a b", "ca", "CA", "nodé", "x\x00",
     "x" * 65],
)
def test_unusable_names_are_refused_before_anything_is_written(ca_dir: Path, name: str) -> None:
    before = _snapshot(ca_dir)
    with pytest.raises(PKIError):
        pki.issue(ca_dir, name, "operator")
    assert _snapshot(ca_dir) == before
    assert not (ca_dir.parent / "x.crt").exists()


def test_a_node_name_is_one_dns_label(ca_dir: Path) -> None:
    with pytest.raises(PKIError, match="short host name"):
        pki.issue(ca_dir, "node05.example.org", "node")
    with pytest.raises(PKIError, match="short host name"):
        pki.issue(ca_dir, "n" * 64, "node")
    # Other roles may use a dotted name: the hub's is its host name.
    pki.issue(ca_dir, "cp.example.org", "server")


@given(st.one_of(st.text(max_size=80), st.from_regex(r"[A-Za-z0-9._-]{0,70}", fullmatch=True)))
def test_every_accepted_name_is_a_plain_file_name_and_a_valid_cn(name: str) -> None:
    if pki.name_problem(name) is not None:
        with pytest.raises(PKIError):
            pki.check_name(name)
        return
    base = Path("/srv/pki")
    assert (base / f"{name}.crt").parent == base
    assert os.path.normpath(base / f"{name}.key") == str(base / f"{name}.key")
    assert name[0] not in ".-" and "/" not in name and "\x00" not in name
    x509.NameAttribute(NameOID.COMMON_NAME, name)


@given(st.from_regex(r"[A-Za-z0-9._-]{1,70}", fullmatch=True))
def test_every_node_name_issue_accepts_the_hub_accepts(name: str) -> None:
    from llmgw.link import authz

    if pki.name_problem(name) is None and "." not in name and len(name) <= pki.MAX_LABEL:
        assert authz.session_refusal("node", name) is None


@pytest.mark.parametrize("san", ["bad name", "a..b", "", "nodé.example", "x" * 64 + ".org"])
def test_an_unusable_san_is_refused(ca_dir: Path, san: str) -> None:
    with pytest.raises(PKIError, match="neither an IP address nor a DNS name"):
        pki.issue(ca_dir, "hub", "server", sans=[san])
    assert not (ca_dir / "hub.crt").exists()


@pytest.mark.parametrize("role", ["agent", "control", "", "Node"])
def test_issue_refuses_an_unknown_role(ca_dir: Path, role: str) -> None:
    with pytest.raises(PKIError, match="none of server, node, operator, router"):
        pki.issue(ca_dir, "x", role)


@pytest.mark.parametrize("days", [0, -1, pki.MAX_DAYS + 1, True, 1.5])
def test_issue_refuses_an_unusable_validity(ca_dir: Path, days) -> None:
    with pytest.raises(PKIError, match="validity"):
        pki.issue(ca_dir, "x", "node", days=days)


def test_a_certificate_never_outlives_its_ca(tmp_path: Path) -> None:
    pki.init_ca(tmp_path, days=30)
    cert_path, _ = pki.issue(tmp_path, "node05", "node")
    assert _cert(cert_path).not_valid_after_utc == _cert(tmp_path / "ca.crt").not_valid_after_utc


def test_issue_without_a_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(PKIError) as refused:
        pki.issue(tmp_path, "node05", "node")
    assert f"{tmp_path}/ca.crt not found" in str(refused.value)
    assert f"llmgw pki init {tmp_path}" in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_issue_refuses_a_ca_key_that_is_not_the_ca_certificates(tmp_path: Path) -> None:
    pki.init_ca(tmp_path / "a")
    pki.init_ca(tmp_path / "b")
    os.replace(tmp_path / "b" / "ca.key", tmp_path / "a" / "ca.key")
    with pytest.raises(PKIError, match=r"ca\.key is not the key of .*ca\.crt"):
        pki.issue(tmp_path / "a", "node05", "node")


def test_issue_refuses_an_expired_ca(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=20))
        .not_valid_after(now - datetime.timedelta(days=10))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))

    with pytest.raises(PKIError, match=r"ca\.crt expired on .*new CA and reissue"):
        pki.issue(tmp_path, "node05", "node")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name a descriptor")
@pytest.mark.parametrize("force", [False, True])
def test_a_write_that_fails_halfway_leaves_nothing_half_written(
    ca_dir: Path, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    if force:
        pki.issue(ca_dir, "node05", "node")
    before = _snapshot(ca_dir)
    failing = ".node05.key." if force else ".node05.crt."
    real_write = os.write

    def disk_full(fd: int, data) -> int:
        if failing in os.readlink(f"/proc/self/fd/{fd}"):
            real_write(fd, bytes(data[:10]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(PKIError, match=r"cannot write .*node05\.(key|crt): No space left"):
        pki.issue(ca_dir, "node05", "node", force=force)
    monkeypatch.undo()

    # Without --force the key already in place is taken back; with it, the
    # old pair is untouched because the new key never made it.
    assert _snapshot(ca_dir) == before
