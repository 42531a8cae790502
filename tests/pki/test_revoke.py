"""``llmgw pki revoke``: the CA's revocation list, written whole and signed, by name or by serial.

Before, a certificate could not be taken back: re-issuing a name with
``--force`` left the old certificate valid until it expired.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509

from llmgw import pki
from llmgw.cli import main as llmgw
from llmgw.errors import PKIError


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    directory = tmp_path / "ca"
    pki.init_ca(directory, name="prod")
    pki.issue(directory, "node05", "node")
    return directory


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def listed(directory: Path) -> x509.CertificateRevocationList:
    crl = x509.load_pem_x509_crl((directory / "crl.pem").read_bytes())
    ca_cert = cert(directory / "ca.crt")
    assert crl.issuer == ca_cert.subject and crl.is_signature_valid(ca_cert.public_key())
    return crl


def test_revoke_by_name_writes_a_crl_signed_by_the_ca(ca: Path, capsys) -> None:
    serial = cert(ca / "node05.crt").serial_number

    assert llmgw(["pki", "revoke", str(ca), "node05"]) == 0

    crl = listed(ca)
    assert [r.serial_number for r in crl] == [serial]
    assert crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number == 1
    assert (ca / "crl.pem").stat().st_mode & 0o777 == 0o644
    out = capsys.readouterr().out
    assert out.startswith(f"revoked CN=node05,OU=node,O=prod (serial {serial:x}, valid until ")
    assert f"{ca}/crl.pem now lists 1 certificate\n" in out
    assert "llmgw ctl reload" in out
    revoked = pki.read_revocations(ca / "crl.pem", cert(ca / "ca.crt")).revoked(serial)
    today = datetime.datetime.now(datetime.timezone.utc)
    assert revoked.reason == f"revoked on {today:%Y-%m-%d} (serial {serial:x})"


def test_revoking_again_adds_to_the_list_and_an_entry_twice_is_left_alone(ca: Path, capsys) -> None:
    pki.issue(ca, "node06", "node")
    pki.revoke(ca, "node05")
    first = listed(ca)
    pki.revoke(ca, "node06")
    second = listed(ca)
    assert {r.serial_number for r in second} == {
        cert(ca / "node05.crt").serial_number, cert(ca / "node06.crt").serial_number
    }
    assert second.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number == 2
    assert second.get_revoked_certificate_by_serial_number(cert(ca / "node05.crt").serial_number).revocation_date_utc \
        == list(first)[0].revocation_date_utc
    before = (ca / "crl.pem").read_bytes()

    assert llmgw(["pki", "revoke", str(ca), "node05"]) == 0
    assert "was already revoked on" in capsys.readouterr().out
    assert (ca / "crl.pem").read_bytes() == before


def test_a_certificate_re_issued_with_force_names_its_old_serial_and_is_revoked_by_it(ca: Path, capsys) -> None:
    old = cert(ca / "node05.crt").serial_number
    assert llmgw(["pki", "issue", str(ca), "--role", "node", "node05", "--force"]) == 0
    out = capsys.readouterr().out
    assert f"the certificate it replaces (serial {old:x}) stays valid until" in out
    assert f"llmgw pki revoke {ca} --serial {old:x}" in out

    # As `openssl x509 -noout -serial` prints it: upper-case hex.
    assert llmgw(["pki", "revoke", str(ca), "--serial", f"{old:X}"]) == 0
    assert [r.serial_number for r in listed(ca)] == [old]
    assert "serial" in capsys.readouterr().out


def test_revoke_refuses_a_name_without_a_certificate(ca: Path, capsys) -> None:
    assert llmgw(["pki", "revoke", str(ca), "node99"]) == 1
    err = capsys.readouterr().err
    assert f"no certificate named 'node99' in {ca} (no node99.crt); give the name of one of its *.crt files" in err
    assert not (ca / "crl.pem").exists()


@pytest.mark.parametrize("typo", ["beef", "BEEF", "0xbeef", "de:ad", "1", "ca", "CA", "node05.crt", "../ca/node05"])
def test_a_name_is_never_read_as_a_serial(ca: Path, capsys, typo: str) -> None:
    # Before, a NAME with no NAME.crt that looked like hex (a typo, or `ca`) revoked that serial, quietly.
    assert llmgw(["pki", "revoke", str(ca), typo]) == 1
    err = capsys.readouterr().err
    if typo.lower() == "ca":
        assert "is the CA's own certificate, which a revocation list cannot end" in err
    else:
        assert f"no certificate named {typo!r} in {ca}" in err
    if typo in ("beef", "0xbeef"):
        assert f"to revoke the certificate with serial {typo}, say so: --serial {typo}" in err
    assert not (ca / "crl.pem").exists()


def test_revoking_by_serial_is_explicit_and_says_which_certificate_it_is(ca: Path, capsys) -> None:
    serial = cert(ca / "node05.crt").serial_number
    assert llmgw(["pki", "revoke", str(ca), "--serial", "beef"]) == 0
    assert capsys.readouterr().out.startswith("revoked serial beef: ")
    assert llmgw(["pki", "revoke", str(ca), "--serial", f"{serial:x}"]) == 0
    assert capsys.readouterr().out.startswith(f"revoked CN=node05,OU=node,O=prod (serial {serial:x}, valid until ")
    assert {r.serial_number for r in listed(ca)} == {0xBEEF, serial}


@pytest.mark.parametrize("argv,said", [
    (["--serial", "node05"], "--serial 'node05' is not a serial number"),
    (["--serial", "0"], "serial 0 is no certificate's"),
    (["--serial", "f" * 41], "a serial is a positive number of at most 20 bytes"),
    (["node05", "--serial", "beef"], "not allowed with argument"),
    ([], "one of the arguments NAME --serial is required"),
])
def test_revoke_refuses_a_serial_no_certificate_can_have_and_both_or_neither(ca: Path, capsys, argv, said) -> None:
    with pytest.raises(SystemExit) as refused:
        llmgw(["pki", "revoke", str(ca), *argv])
    assert refused.value.code == 2
    assert said in capsys.readouterr().err
    assert not (ca / "crl.pem").exists()


def test_revoke_refuses_a_certificate_of_another_ca(ca: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    pki.init_ca(other)
    pki.issue(other, "node07", "node")
    (ca / "node07.crt").write_bytes((other / "node07.crt").read_bytes())
    with pytest.raises(PKIError, match="node07.crt was not issued by .*ca.crt; a CA revokes only its own"):
        pki.revoke(ca, "node07")


def test_revoke_refuses_an_existing_list_of_another_ca(ca: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    pki.init_ca(other)
    pki.issue(other, "node07", "node")
    pki.revoke(other, "node07")
    (ca / "crl.pem").write_bytes((other / "crl.pem").read_bytes())
    with pytest.raises(PKIError, match="crl.pem is not signed by the cluster CA"):
        pki.revoke(ca, "node05")


def test_revoke_without_a_ca_says_how_to_make_one(tmp_path: Path, capsys) -> None:
    assert llmgw(["pki", "revoke", str(tmp_path), "node05"]) == 1
    assert "llmgw pki init" in capsys.readouterr().err
