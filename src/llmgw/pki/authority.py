"""The cluster CA: :func:`init_ca` creates it, :func:`issue` signs a certificate with it.

One CA signs every certificate on the link.  Each certificate it issues
carries its holder's name as CN and role as OU (see :mod:`.subject`), never
outlives the CA, and lands on disk beside it with its key, both written
whole or not at all (:mod:`llmgw.durable`).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import typing
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    CertificatePublicKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.durable import write_file
from llmgw.errors import PKIError
from llmgw.roles import CERT_ROLES, ROLE_NODE, ROLE_SERVER

from .held import check_same_holder
from .keys import ACCEPTED, key_problem
from .subject import MAX_NAME, check_name, node_name_problem

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_DAYS = 3650
CERT_DAYS = 825
MAX_DAYS = 36500
# The CA's CN is "<cluster> CA", and must fit in the same 64.
MAX_CLUSTER_NAME = MAX_NAME - len(" CA")

_DNS_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# Certificates start an hour in the past, so that a node whose clock runs a
# little behind accepts a certificate issued a minute ago.
_BACKDATE = datetime.timedelta(hours=1)

PathLike = str | os.PathLike[str]


def init_ca(directory: PathLike, name: str = "llmgw", days: int = CA_DAYS) -> Path:
    """Create the cluster CA in `directory` and return the path of its ca.crt.

    Refuses when a CA is already there: a cluster has one CA, and replacing it
    would strand every certificate it signed.
    """
    directory = Path(directory)
    _check_cluster_name(name)
    _check_days(days)
    _make_private_dir(directory)
    key_path, cert_path = directory / CA_KEY, directory / CA_CERT

    def exists(path: Path) -> str:
        return (
            f"{path} already exists; a cluster has one CA. "
            f"To start over, move {directory} away first."
        )

    for path in (key_path, cert_path):
        if os.path.lexists(path):
            raise PKIError(exists(path))

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, name),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        # path_length=0: the CA signs certificates, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _write_pair(
        (key_path, _key_pem(key)),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM)),
        replace=False,
        exists=exists,
    )
    return cert_path


def issue(
    directory: PathLike,
    name: str,
    role: str,
    sans: Iterable[str] = (),
    days: int = CERT_DAYS,
    force: bool = False,
) -> tuple[Path, Path]:
    """Sign a new key for `name` in `role` with the CA in `directory`.

    Writes NAME.crt and NAME.key beside the CA and returns their paths, in that
    order.  Without `force` an existing NAME.crt or NAME.key is left alone and
    PKIError says so; with it, each is replaced by a rename.  The certificate
    never outlives the CA: its validity is cut to the CA's own.
    """
    directory = Path(directory)
    _check_holder(name, role)
    _check_days(days)
    alt_names = _alt_names(name, sans)
    ca_cert, ca_key = _load_ca(directory)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    if not force:
        for path in (cert_path, key_path):
            if os.path.lexists(path):
                raise PKIError(_exists_message(path))
    else:
        check_same_holder(cert_path, name, role)

    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(ca_cert, ca_key, name, role, key.public_key(), alt_names, days)
    _write_pair(
        (key_path, _key_pem(key)),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM)),
        replace=force,
        exists=_exists_message,
    )
    return cert_path, key_path


# A request is a few hundred bytes; anything much larger is not one.
MAX_REQUEST_BYTES = 16 * 1024


def sign_request(
    directory: PathLike,
    request_pem: bytes,
    role: str,
    name: str | None = None,
    days: int = CERT_DAYS,
    force: bool = False,
) -> Path:
    """Sign the certificate request *request_pem* for *role* with the CA in *directory*; return NAME.crt's path.

    The holder made its key and keeps it: only the request's public key and
    CN are read from it.  The role is the signer's to say, never the
    request's; the CN must be *name* when one is given.  Without *force* an
    existing NAME.crt is left alone and PKIError says so.
    """
    directory = Path(directory)
    request = read_request(request_pem)
    cns = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = cns[0].value if len(cns) == 1 and isinstance(cns[0].value, str) else None
    if cn is None:
        raise PKIError("the certificate request has no single CN; make it with CN = the holder's name")
    if name is not None and cn != name:
        raise PKIError(f"the certificate request is for {cn!r}, not {name!r}; make the request with CN={name}")
    _check_holder(cn, role)
    _check_days(days)
    ca_cert, ca_key = _load_ca(directory)
    cert_path = directory / f"{cn}.crt"
    if not force and os.path.lexists(cert_path):
        raise PKIError(_exists_message(cert_path))
    if force:
        check_same_holder(cert_path, cn, role)
    cert = _certificate(ca_cert, ca_key, cn, role, request.public_key(), _alt_names(cn, ()), days)
    try:
        write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False, replace=force)
    except FileExistsError:
        raise PKIError(_exists_message(cert_path)) from None
    except OSError as e:
        raise PKIError(f"cannot write {cert_path}: {e.strerror}") from None
    return cert_path


def read_request(data: bytes) -> x509.CertificateSigningRequest:
    """*data* as a PEM certificate request whose signature holds, or PKIError saying what it is not."""
    if len(data) > MAX_REQUEST_BYTES:
        raise PKIError(f"a certificate request of {len(data)} bytes is not one (at most {MAX_REQUEST_BYTES})")
    try:
        request = x509.load_pem_x509_csr(data)
    except ValueError:
        raise PKIError("not a PEM certificate request (-----BEGIN CERTIFICATE REQUEST-----)") from None
    try:
        valid, key = request.is_signature_valid, request.public_key()
    except (UnsupportedAlgorithm, ValueError):
        raise PKIError(
            f"the certificate request's key or signature is of a kind llmgw cannot read; make one with {ACCEPTED}"
        ) from None
    if not valid:
        raise PKIError("the certificate request's signature does not hold; make it again with the holder's key")
    problem = key_problem(key)
    if problem is not None:
        raise PKIError(
            f"the certificate request's key is {problem}. Make a new key and request, for example "
            "`openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout NAME.key "
            "-subj /CN=NAME -out NAME.csr` "
            "(`llmgw ctl onboard` makes a P-256 key on the node)"
        )
    return request


def _check_holder(name: str, role: str) -> None:
    if role == ROLE_NODE:
        # The hub refuses any other node (llmgw.link.authz): its id is one URI
        # component, or node "a" could answer for node "a.b".
        problem = node_name_problem(name)
        if problem is not None:
            raise PKIError(problem)
    check_name(name)
    if role not in CERT_ROLES:
        raise PKIError(f"role {role!r} is none of {', '.join(CERT_ROLES)}")


def _certificate(
    ca_cert: x509.Certificate,
    ca_key: CertificateIssuerPrivateKeyTypes,
    name: str,
    role: str,
    public_key: CertificatePublicKeyTypes,
    alt_names: list[x509.GeneralName],
    days: int,
) -> x509.Certificate:
    now = _now()
    subject = x509.Name(
        [
            *ca_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == ROLE_SERVER:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - _BACKDATE, ca_cert.not_valid_before_utc))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
        .sign(ca_key, _signature_hash(ca_key))
    )


def _now() -> datetime.datetime:
    # Whole seconds: a certificate's times carry no fraction, and comparing the
    # clamped expiry with the CA's must be exact.
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def _check_cluster_name(name: str) -> None:
    if not name or name != name.strip() or not name.isprintable() or len(name) > MAX_CLUSTER_NAME:
        raise PKIError(
            f"cluster name {name!r} will not do: use 1 to {MAX_CLUSTER_NAME} printable characters "
            "without leading or trailing spaces, for example --name prod"
        )


def _check_days(days: int) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise PKIError(f"validity of {days!r} days: use a whole number from 1 to {MAX_DAYS}")


def _alt_names(name: str, sans: Iterable[str]) -> list[x509.GeneralName]:
    """DNS:NAME first, then each extra name: an IP literal as IP, the rest as DNS."""
    if isinstance(sans, str):
        sans = [sans]
    result: list[x509.GeneralName] = [x509.DNSName(name)]
    for san in sans:
        try:
            general: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(san))
        except ValueError:
            if not _is_dns_name(san):
                raise PKIError(
                    f"--san {san!r} is neither an IP address nor a DNS name "
                    "(ASCII letters, digits, '-' and '_', dot-separated; "
                    "write an international name in its xn-- form)"
                ) from None
            general = x509.DNSName(san)
        if general not in result:
            result.append(general)
    return result


def _is_dns_name(text: str) -> bool:
    return 0 < len(text) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in text.split("."))


def _key_usage(**granted: bool) -> x509.KeyUsage:
    usage = dict.fromkeys(
        ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
         "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"),
        False,
    )
    usage.update(granted)
    return x509.KeyUsage(**usage)


def _authority_key_id(
    ca_cert: x509.Certificate, ca_key: CertificateIssuerPrivateKeyTypes
) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _signature_hash(key: CertificateIssuerPrivateKeyTypes) -> hashes.SHA256 | None:
    # Ed25519, Ed448 and ML-DSA sign without a separate hash; a CA made
    # elsewhere may use them.
    if isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, dsa.DSAPrivateKey)):
        return hashes.SHA256()
    return None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _public_der(public_key: CertificatePublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read_ca_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise PKIError(_no_ca_message(path)) from None
    except OSError as e:
        raise PKIError(f"cannot read {path}: {e.strerror}") from None


def read_ca_certificate(path: Path) -> x509.Certificate:
    """The CA's PEM certificate in *path*, or PKIError saying how to make one."""
    data = _read_ca_file(path)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise PKIError(f"{path} is not a PEM certificate") from None


def _load_ca(directory: Path) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    cert = read_ca_certificate(cert_path)
    data = _read_ca_file(key_path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise PKIError(
            f"{key_path} is encrypted; llmgw pki reads an unencrypted PKCS8 key "
            "(decrypt a copy with `openssl pkey`, issue, then remove the copy)"
        ) from None
    except ValueError:
        raise PKIError(f"{key_path} is not a PEM private key") from None
    if not isinstance(key, typing.get_args(CertificateIssuerPrivateKeyTypes)):
        raise PKIError(f"{key_path} holds a key that cannot sign certificates")
    problem = key_problem(key.public_key())
    if problem is not None:
        raise PKIError(
            f"the CA's key {key_path} is {problem}, so no certificate it signs would be accepted. Create a new CA "
            f"with `llmgw pki init` (an EC P-256 key) and reissue every certificate (see docs/security.rst)"
        )
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        raise PKIError(
            f"{key_path} is not the key of {cert_path}; the two must come from one `llmgw pki init`"
        )
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise PKIError(f"{cert_path} is not a CA certificate (no BasicConstraints ca=True)")
    if cert.not_valid_after_utc <= _now():
        raise PKIError(
            f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; certificates it signs would "
            "be refused. Create a new CA and reissue every certificate (see docs/security.rst)"
        )
    return cert, key


def _no_ca_message(path: Path) -> str:
    return (
        f"{path} not found; create the cluster CA with `llmgw pki init {path.parent}`, "
        "or issue on the host that keeps ca.key"
    )


def _exists_message(path: Path) -> str:
    return (
        f"{path} already exists; to replace it, run again with --force "
        "(the old certificate stays valid until it expires, or until `llmgw pki revoke` ends it)"
    )


def _make_private_dir(directory: Path) -> None:
    if directory.exists():
        if not directory.is_dir():
            raise PKIError(
                f"{directory} exists and is not a directory; choose another place for the CA"
            )
        return
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise PKIError(f"cannot create {directory}: {e.strerror}") from None


def _write_pair(
    key: tuple[Path, bytes],
    cert: tuple[Path, bytes],
    *,
    replace: bool,
    exists: typing.Callable[[Path], str],
) -> None:
    """Put a key (0600) and its certificate (0644) in place, the key first.

    Without `replace`, a file that appeared since the caller's check stops the
    write and takes back whatever this call already put in place; `exists`
    words the refusal.
    """
    published: list[Path] = []
    for (path, data), private in ((key, True), (cert, False)):
        try:
            write_file(path, data, private=private, replace=replace)
        except OSError as e:
            if not replace:
                for done in published:
                    with contextlib.suppress(OSError):
                        os.unlink(done)
            if isinstance(e, FileExistsError):
                raise PKIError(exists(path)) from None
            raise PKIError(f"cannot write {path}: {e.strerror}") from None
        published.append(path)
