"""Certificates taken back before they expire: :func:`revoke` writes the CA's revocation list, :func:`read_revocations` reads it.

The list is an X.509 CRL signed by the cluster CA, ``crl.pem`` beside
``ca.crt``.  The hub reads it at start and on every reload and refuses, at
the handshake, any certificate whose serial it lists (:mod:`llmgw.link.tls`).
The hub reads the file it is given rather than fetching it from a
distribution point, so the list's ``nextUpdate`` is only the CA's own expiry
and is not enforced.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from llmgw.durable import write_file
from llmgw.errors import PKIError

from .authority import _BACKDATE, CA_CERT, PathLike, _authority_key_id, _load_ca, _now, _signature_hash, read_ca_certificate
from .subject import name_problem, printable

CRL_FILE = "crl.pem"

# RFC 5280: a serial is a positive integer of at most 20 octets.
MAX_SERIAL_BYTES = 20

_SERIAL = re.compile(r"(?:0x)?([0-9A-Fa-f]{2}(?::?[0-9A-Fa-f]{2})*|[0-9A-Fa-f]+)")


@attrs.frozen
class Revocation:
    """One certificate the CA has taken back: its serial and when."""

    serial: int
    revoked_at: datetime.datetime

    @property
    def reason(self) -> str:
        """``revoked on 2026-12-01 (serial 3f2a...)``, as refusals in the hub's log say it."""
        return f"revoked on {self.revoked_at:%Y-%m-%d} (serial {self.serial:x})"


@attrs.frozen
class RevocationList:
    """The serials the CA has revoked, as read from one list (``path``; None when there is none)."""

    path: str | None = None
    entries: Mapping[int, Revocation] = attrs.field(factory=lambda: MappingProxyType({}))
    number: int = 0
    # The signed list itself, for OpenSSL to check handshakes against.
    crl: x509.CertificateRevocationList | None = attrs.field(default=None, eq=False, repr=False)

    def revoked(self, serial: int) -> Revocation | None:
        return self.entries.get(serial)

    def __len__(self) -> int:
        return len(self.entries)


@attrs.frozen
class Revoked:
    """What :func:`revoke` did: the entry, the list it is in, and whether it was there already."""

    revocation: Revocation
    path: Path
    count: int
    already: bool
    certificate: x509.Certificate | None = None


def read_revocations(path: PathLike, ca: x509.Certificate) -> RevocationList:
    """The revocation list in *path*, which must be a CRL signed by *ca*, or PKIError saying why not."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PKIError(
            f"{path} not found; it is the cluster's revocation list, written by `llmgw pki revoke` "
            "in the CA's directory: copy it here"
        ) from None
    except OSError as e:
        raise PKIError(f"cannot read the revocation list {path}: {e.strerror}") from None
    try:
        crl = x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data)
    except ValueError:
        raise PKIError(f"{path} is not a certificate revocation list (PEM or DER)") from None
    if crl.issuer != ca.subject or not crl.is_signature_valid(ca.public_key()):
        raise PKIError(
            f"{path} is not signed by the cluster CA '{printable(ca.subject.rfc4514_string())}'; "
            "write it with `llmgw pki revoke` in that CA's directory"
        )
    try:
        number = crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        number = 0
    entries = {r.serial_number: Revocation(r.serial_number, r.revocation_date_utc) for r in crl}
    return RevocationList(os.fspath(path), MappingProxyType(entries), number, crl)


def revoke(directory: PathLike, name: str | None = None, *, serial: int | None = None) -> Revoked:
    """Add a certificate to DIR/crl.pem: DIR/NAME.crt by *name*, or, said so explicitly, by *serial*.

    A name is only ever a certificate's file: one that is not there is an
    error, never read as a serial (``beef`` or ``ca`` mistyped would otherwise
    revoke whatever certificate has that serial).  The list is rewritten
    whole, signed by the CA, and renamed into place, so the hub reading it
    meanwhile sees the old list or the new one.  A serial already listed is
    left as it was.
    """
    directory = Path(directory)
    ca_cert, ca_key = _load_ca(directory)
    if (name is None) == (serial is None):
        raise PKIError("revoke a certificate by its name or by --serial HEX, one of the two")
    if name is not None:
        serial, cert = _named(directory, name, ca_cert)
    else:
        cert = _with_serial(directory, check_serial(serial), ca_cert)
    path = directory / CRL_FILE
    current = read_revocations(path, ca_cert) if os.path.lexists(path) else RevocationList()
    existing = current.revoked(serial)
    if existing is not None:
        return Revoked(existing, path, len(current), already=True, certificate=cert)
    now = _now()
    revocation = Revocation(serial, now)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        # Backdated as certificates are: a hub whose clock runs a little behind
        # would otherwise find the list not yet valid and refuse everyone.
        .last_update(now - _BACKDATE)
        # Nothing fetches this list, so nothing waits for its next update;
        # the field is required, and the CA's expiry is the one honest date.
        .next_update(max(ca_cert.not_valid_after_utc, now + datetime.timedelta(days=1)))
        .add_extension(x509.CRLNumber(current.number + 1), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
    )
    for entry in [*current.entries.values(), revocation]:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(entry.serial).revocation_date(entry.revoked_at).build()
        )
    crl = builder.sign(ca_key, _signature_hash(ca_key))
    try:
        write_file(path, crl.public_bytes(serialization.Encoding.PEM), private=False, replace=True)
    except OSError as e:
        raise PKIError(f"cannot write {path}: {e.strerror}") from None
    return Revoked(revocation, path, len(current) + 1, already=False, certificate=cert)


def _named(directory: Path, name: str, ca: x509.Certificate) -> tuple[int, x509.Certificate]:
    """The serial of DIR/NAME.crt, a certificate this CA issued; PKIError naming what to do when there is none."""
    if name.lower() == "ca":
        raise PKIError(
            f"{directory / CA_CERT} is the CA's own certificate, which a revocation list cannot end; "
            "if ca.key has leaked, make a new CA (see 'If ca.key leaks' in docs/security.rst)"
        )
    cert_path = directory / f"{name}.crt"
    if name_problem(name) is not None or not cert_path.is_file():
        hint = ""
        if _SERIAL.fullmatch(name.strip()):
            hint = f"; to revoke the certificate with serial {printable(name.strip())}, say so: --serial {printable(name.strip())}"
        raise PKIError(
            f"no certificate named {printable(name)!r} in {directory} (no {printable(cert_path.name)}){hint}; "
            f"give the name of one of its *.crt files, or a serial with --serial HEX, as "
            "`openssl x509 -noout -serial` prints it"
        )
    cert = read_ca_certificate(cert_path)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise PKIError(
            f"{cert_path} was not issued by {directory / CA_CERT}; a CA revokes only its own certificates"
        ) from None
    return cert.serial_number, cert


def parse_serial(text: str) -> int:
    """A serial as ``openssl x509 -noout -serial`` prints it (hex, ``:`` between bytes allowed); PKIError when not one."""
    match = _SERIAL.fullmatch(text.strip())
    if match is None:
        raise PKIError(
            f"{printable(text)!r} is not a serial number; give it in hex, as `openssl x509 -noout -serial` prints it"
        )
    return check_serial(int(match.group(1).replace(":", ""), 16))


def check_serial(serial: int) -> int:
    """*serial* when a certificate can have it (1 to 20 bytes, RFC 5280); PKIError otherwise."""
    if not 0 < serial < 1 << (8 * MAX_SERIAL_BYTES - 1):
        raise PKIError(
            f"serial {serial:x} is no certificate's: a serial is a positive number of at most {MAX_SERIAL_BYTES} "
            "bytes; give it in hex, as `openssl x509 -noout -serial` prints it"
        )
    return serial


def _with_serial(directory: Path, serial: int, ca: x509.Certificate) -> x509.Certificate | None:
    """The certificate in *directory* with *serial* that this CA issued, to say what is revoked; None when none is there."""
    for path in sorted(directory.glob("*.crt")):
        if path.name == CA_CERT:
            continue
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError):
            continue
        if cert.serial_number != serial:
            continue
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return cert
    return None
