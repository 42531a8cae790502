"""The cluster CA: ``llmgw pki init`` creates it, ``llmgw pki issue`` signs with it.

One CA signs every certificate on the link.  A certificate says who its holder
is (CN, the WAMP authid) and what it is (OU, the role); the hub believes
nothing else, so `identity_of` is the one place that reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import errno
import ipaddress
import os
import re
import secrets
import typing
from collections.abc import Iterable
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    CertificatePublicKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.errors import PKIError
from llmgw.link.uris import CERT_ROLES, ROLE_NODE, ROLE_OPERATOR, ROLE_SERVER

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_DAYS = 3650
CERT_DAYS = 825
MAX_DAYS = 36500
# RFC 5280's upper bound on a CN, which cryptography enforces: a longer
# hostname could not be carried as an identity at all.
MAX_NAME = 64
# A node's name is one DNS label.
MAX_LABEL = 63
# The CA's CN is "<cluster> CA", and must fit in the same 64.
MAX_CLUSTER_NAME = MAX_NAME - len(" CA")

_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# Certificates start an hour in the past, so that a node whose clock runs a
# little behind accepts a certificate issued a minute ago.
_BACKDATE = datetime.timedelta(hours=1)

PathLike = str | os.PathLike[str]


@attrs.frozen
class Identity:
    """Who a certificate's holder is on the link: the authid and the authrole."""

    name: str
    role: str


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a certificate's name, or None when it can.

    The name becomes a file name beside the CA and the holder's WAMP authid, so
    it is held to a hostname's letters and may not reach outside the directory.
    """
    if not name:
        return "a certificate name must not be empty; use the holder's hostname, for example node05"
    if len(name) > MAX_NAME:
        return (
            f"{name[:20]!r}... is {len(name)} characters; "
            f"a certificate name is at most {MAX_NAME}"
        )
    if not _NAME.fullmatch(name) or ".." in name:
        return (
            f"{name!r} is not a usable certificate name: use letters, digits, '.', '_' and '-', "
            "starting and ending with a letter or digit, without '..' "
            "(it becomes a file name and the WAMP authid)"
        )
    if name.lower() == "ca":
        return f"{name!r} is the CA's own file name (ca.crt, ca.key); choose another name"
    return None


def check_name(name: str) -> str:
    """Return `name` if it can name a certificate; raise PKIError saying why not."""
    problem = name_problem(name)
    if problem is not None:
        raise PKIError(problem)
    return name


def identity_of(cert: x509.Certificate) -> Identity:
    """The identity a certificate proves: name from its CN, role from its OU.

    This reads, it does not verify: the TLS handshake has already checked that
    the cluster CA signed `cert`.
    """
    name = _only_attribute(cert, NameOID.COMMON_NAME, "CN")
    role = _only_attribute(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "OU")
    if role not in CERT_ROLES:
        raise PKIError(
            f"certificate {_describe(cert)} has role OU={role!r}, which is none of "
            f"{', '.join(CERT_ROLES)}; issue it again with `llmgw pki issue --role ROLE`"
        )
    problem = name_problem(name)
    if problem is not None:
        raise PKIError(f"certificate {_describe(cert)}: {problem}")
    return Identity(name=name, role=role)


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
    check_name(name)
    if role not in CERT_ROLES:
        raise PKIError(f"role {role!r} is none of {', '.join(CERT_ROLES)}")
    if role == ROLE_NODE and ("." in name or len(name) > MAX_LABEL):
        # The hub refuses such a node (llmgw.link.authz): its id is one URI
        # component, or node "a" could answer for node "a.b".
        raise PKIError(
            f"a node's name is its short host name, one DNS label: no dots, at most {MAX_LABEL} "
            f"characters (node05, not node05.example.org), because it becomes one part of "
            f"URIs like llmgw.node.NAME.ping; not {name!r}"
        )
    _check_days(days)
    alt_names = _alt_names(name, sans)
    ca_cert, ca_key = _load_ca(directory)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    if not force:
        for path in (cert_path, key_path):
            if os.path.lexists(path):
                raise PKIError(_exists_message(path))

    key = ec.generate_private_key(ec.SECP256R1())
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
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - _BACKDATE, ca_cert.not_valid_before_utc))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
        .sign(ca_key, _signature_hash(ca_key))
    )
    _write_pair(
        (key_path, _key_pem(key)),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM)),
        replace=force,
        exists=_exists_message,
    )
    return cert_path, key_path


# -- the command line -------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pki init`` and ``pki issue`` to the ``llmgw`` command line."""
    pki = subparsers.add_parser(
        "pki",
        help="create the cluster CA and issue certificates",
        description="Create the cluster CA and issue certificates for the server, "
        "nodes, operators and router workers.",
    )
    actions = pki.add_subparsers(dest="pki_command", required=True, metavar="ACTION")

    init = actions.add_parser(
        "init",
        help="create the cluster CA (DIR/ca.crt, DIR/ca.key)",
        description="Create the cluster CA in DIR. Refuses if DIR already holds one.",
    )
    init.add_argument("dir", type=Path, metavar="DIR", help="where the CA lives (created 0700)")
    init.add_argument("--name", default="llmgw", metavar="CLUSTER",
                      help="the cluster's name, the O= of every certificate (default: llmgw)")
    init.add_argument("--days", type=_days_argument, default=CA_DAYS, metavar="N",
                      help=f"how long the CA is valid (default: {CA_DAYS})")
    init.set_defaults(func=_run_init)

    iss = actions.add_parser(
        "issue",
        help="sign a certificate for the server, a node, an operator or a router worker",
        description="Write DIR/NAME.crt and DIR/NAME.key, signed by DIR/ca.key.",
    )
    iss.add_argument("dir", type=Path, metavar="DIR", help="the directory of ca.crt and ca.key")
    iss.add_argument("name", metavar="NAME",
                     help="the holder's name: a node's hostname, an operator's login")
    iss.add_argument("--role", required=True, choices=CERT_ROLES)
    iss.add_argument("--san", action="append", default=[], metavar="HOST",
                     help="another DNS name or IP address for the certificate (repeatable)")
    iss.add_argument("--days", type=_days_argument, default=CERT_DAYS, metavar="N",
                     help=f"how long the certificate is valid (default: {CERT_DAYS})")
    iss.add_argument("--force", action="store_true",
                     help="replace an existing NAME.crt and NAME.key")
    iss.set_defaults(func=_run_issue)


def _run_init(args: argparse.Namespace) -> int:
    cert_path = init_ca(args.dir, name=args.name, days=args.days)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    print(f"created the {args.name} cluster CA, valid until {_day(cert.not_valid_after_utc)}:")
    print(f"  {cert_path}  copy it to the server, every node, operator and router worker")
    print(f"  {cert_path.with_name(CA_KEY)}  keep it here alone; never copy it to a node")
    print(f"next: llmgw pki issue {args.dir} --role server HUB-HOSTNAME")
    return 0


def _run_issue(args: argparse.Namespace) -> int:
    ca_cert = _read_cert(args.dir / CA_CERT)
    cert_path, key_path = issue(args.dir, args.name, args.role, sans=args.san,
                                days=args.days, force=args.force)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    until = _day(cert.not_valid_after_utc)
    if cert.not_valid_after_utc == ca_cert.not_valid_after_utc:
        until += ", the CA's own expiry"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    shown = ", ".join(
        f"IP:{n.value}" if isinstance(n, x509.IPAddress) else f"DNS:{n.value}" for n in names
    )
    print(
        f"wrote {cert_path} and {key_path}: "
        f"{args.role} {args.name}, valid until {until} ({shown})"
    )
    if args.role == ROLE_NODE:
        print(
            f"on {args.name}: copy {args.dir / CA_CERT}, {cert_path} and {key_path} to /etc/llmgw/ "
            "as ca.crt, node.crt and node.key; agent.yaml says "
            "tls: {ca: /etc/llmgw/ca.crt, cert: /etc/llmgw/node.crt, key: /etc/llmgw/node.key}"
        )
    elif args.role == ROLE_SERVER:
        ca_path = args.dir / CA_CERT
        print(f"server.yaml says tls: {{ca: {ca_path}, cert: {cert_path}, key: {key_path}}}")
    elif args.role == ROLE_OPERATOR:
        print(
            f"for {args.name}'s llmgw ctl and llmgw-tui: copy {args.dir / CA_CERT}, {cert_path} "
            f"and {key_path} to their ~/.config/llmgw/; ctl.yaml says tls: "
            f"{{ca: ca.crt, cert: {cert_path.name}, key: {key_path.name}}}"
        )
    return 0


def _days_argument(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if not 1 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{days} days: use 1 to {MAX_DAYS}")
    return days


# -- helpers ----------------------------------------------------------------


def _now() -> datetime.datetime:
    # Whole seconds: a certificate's times carry no fraction, and comparing the
    # clamped expiry with the CA's must be exact.
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def _day(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%d")


def _describe(cert: x509.Certificate) -> str:
    return f"'{cert.subject.rfc4514_string()}' (serial {cert.serial_number:x})"


def _only_attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier, label: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if not values:
        raise PKIError(
            f"certificate {_describe(cert)} has no {label}; "
            "issue one with `llmgw pki issue`, which sets CN to the name and OU to the role"
        )
    if len(values) > 1:
        raise PKIError(
            f"certificate {_describe(cert)} has {len(values)} {label}s; "
            "an identity needs exactly one. Issue one with `llmgw pki issue`"
        )
    value = values[0].value
    if not isinstance(value, str):
        raise PKIError(f"certificate {_describe(cert)} has a {label} that is not text")
    return value


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


def _read_cert(path: Path) -> x509.Certificate:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PKIError(_no_ca_message(path)) from None
    except OSError as e:
        raise PKIError(f"cannot read {path}: {e.strerror}") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise PKIError(f"{path} is not a PEM certificate") from None


def _load_ca(directory: Path) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    cert = _read_cert(cert_path)
    try:
        data = key_path.read_bytes()
    except FileNotFoundError:
        raise PKIError(_no_ca_message(key_path)) from None
    except OSError as e:
        raise PKIError(f"cannot read {key_path}: {e.strerror}") from None
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
            f"{cert_path} expired on {_day(cert.not_valid_after_utc)}; certificates it signs would "
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
        "(the old certificate stays valid until it expires)"
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
    """Put a key and its certificate in place, the key first.

    Without `replace`, a file that appeared since the caller's check stops the
    write and takes back whatever this call already put in place; `exists`
    words the refusal.
    """
    published: list[Path] = []
    for (path, data), private in ((key, True), (cert, False)):
        try:
            _write_file(path, data, private=private, replace=replace)
        except OSError as e:
            if not replace:
                for done in published:
                    with contextlib.suppress(OSError):
                        os.unlink(done)
            if isinstance(e, FileExistsError):
                raise PKIError(exists(path)) from None
            raise PKIError(f"cannot write {path}: {e.strerror}") from None
        published.append(path)
    _sync_dir(key[0].parent)


def _write_file(path: Path, data: bytes, *, private: bool, replace: bool) -> None:
    """Write `data` to `path` whole or not at all: a temporary file beside it, then a rename.

    A private file is created 0600 by open() itself, so no byte of it is ever
    readable by others; a public one is set to 0644 whatever the umask.
    Without `replace`, an existing `path` raises FileExistsError and stays as it was.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            if not private:
                os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        _publish(tmp, path, replace=replace)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _publish(tmp: Path, path: Path, *, replace: bool) -> None:
    if replace:
        os.replace(tmp, path)
        return
    # link() fails if `path` exists, which makes "never overwrite" hold even
    # against another `llmgw pki` running at the same moment.
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # A filesystem without hard links: the caller's check has to do.
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.rename(tmp, path)


def _sync_dir(directory: Path) -> None:
    # The renames are durable only once the directory is.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
