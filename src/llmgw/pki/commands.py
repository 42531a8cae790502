"""``llmgw pki init``, ``issue``, ``sign`` and ``revoke``: the CA's command line, and what to copy where next."""

from __future__ import annotations

import argparse
from pathlib import Path

from cryptography import x509

from llmgw.errors import PKIError
from llmgw.roles import CERT_ROLES, ROLE_NODE, ROLE_OPERATOR, ROLE_SERVER

from .authority import (
    CA_CERT, CA_DAYS, CA_KEY, CERT_DAYS, MAX_DAYS, MAX_REQUEST_BYTES, init_ca, issue, read_ca_certificate, read_request,
    sign_request,
)
from .nodes import revoked_key
from .revocation import CRL_FILE, parse_serial, revoke
from .subject import describe_subject


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pki init``, ``pki issue``, ``pki sign`` and ``pki revoke`` to the ``llmgw`` command line."""
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

    sig = actions.add_parser(
        "sign",
        help="sign a certificate request made where its key stays (a node's, by `llmgw ctl onboard`)",
        description="Write DIR/NAME.crt for the request in CSR (a PEM file, or - for stdin), signed by "
        "DIR/ca.key. NAME is the request's CN; the role is the one given here, whatever the request says.",
    )
    sig.add_argument("dir", type=Path, metavar="DIR", help="the directory of ca.crt and ca.key")
    sig.add_argument("csr", metavar="CSR", help="the certificate request, PEM (- reads stdin)")
    sig.add_argument("--role", required=True, choices=CERT_ROLES)
    sig.add_argument("--name", metavar="NAME", help="refuse unless the request's CN is NAME")
    sig.add_argument("--days", type=_days_argument, default=CERT_DAYS, metavar="N",
                     help=f"how long the certificate is valid (default: {CERT_DAYS})")
    sig.add_argument("--force", action="store_true", help="replace an existing NAME.crt")
    sig.set_defaults(func=_run_sign)

    rev = actions.add_parser(
        "revoke",
        help="take back a certificate before it expires (DIR/crl.pem)",
        description=f"Add a certificate to DIR/{CRL_FILE}, the revocation list signed by DIR/ca.key. "
        "The server refuses it at the next handshake once it has read the list "
        "(at start, on SIGHUP and on `llmgw ctl reload`), and closes its session if it has one.",
    )
    rev.add_argument("dir", type=Path, metavar="DIR", help="the directory of ca.crt and ca.key")
    which = rev.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?", metavar="NAME", help="the certificate in DIR/NAME.crt")
    which.add_argument("--serial", type=_serial_argument, metavar="HEX",
                       help="the certificate with this serial, in hex as `openssl x509 -noout -serial` prints it "
                            "(one since re-issued under the same name, or signed elsewhere)")
    rev.set_defaults(func=_run_revoke)


def _run_init(args: argparse.Namespace) -> int:
    cert_path = init_ca(args.dir, name=args.name, days=args.days)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    print(f"created the {args.name} cluster CA, valid until {cert.not_valid_after_utc:%Y-%m-%d}:")
    print(f"  {cert_path}  copy it to the server, every node, operator and router worker")
    print(f"  {cert_path.with_name(CA_KEY)}  keep it here alone; never copy it to a node")
    print(f"next: llmgw pki issue {args.dir} --role server HUB-HOSTNAME")
    return 0


def _run_issue(args: argparse.Namespace) -> int:
    ca_cert = read_ca_certificate(args.dir / CA_CERT)
    replaced = _readable_certificate(args.dir / f"{args.name}.crt") if args.force else None
    cert_path, key_path = issue(args.dir, args.name, args.role, sans=args.san,
                                days=args.days, force=args.force)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    until = f"{cert.not_valid_after_utc:%Y-%m-%d}"
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
    if replaced is not None:
        print(
            f"the certificate it replaces (serial {replaced.serial_number:x}) stays valid until "
            f"{replaced.not_valid_after_utc:%Y-%m-%d}; to end it now: "
            f"llmgw pki revoke {args.dir} --serial {replaced.serial_number:x}"
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


def _run_sign(args: argparse.Namespace) -> int:
    data = _read_request(args.csr)
    taken_back = None if args.force else revoked_key(args.dir, read_request(data).public_key())
    if taken_back is not None:
        raise PKIError(f"{taken_back}. Have the holder make a new key and request, or, if you trust this key again, "
                       "run again with --force")
    cert_path = sign_request(args.dir, data, args.role, name=args.name, days=args.days, force=args.force)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    print(f"wrote {cert_path}: {describe_subject(cert)}, serial {cert.serial_number:x}, "
          f"valid until {cert.not_valid_after_utc:%Y-%m-%d}")
    print(f"give it and {args.dir / CA_CERT} to the holder; its key never left it")
    return 0


def _run_revoke(args: argparse.Namespace) -> int:
    done = revoke(args.dir, args.name, serial=args.serial)
    entry = done.revocation
    what = f"serial {entry.serial:x}"
    if done.certificate is not None:
        what = (f"{describe_subject(done.certificate)} ({what}, valid until "
                f"{done.certificate.not_valid_after_utc:%Y-%m-%d})")
    if done.already:
        print(f"{what} was already revoked on {entry.revoked_at:%Y-%m-%d}; {done.path} is unchanged")
        return 0
    print(f"revoked {what}: {done.path} now lists {done.count} certificate{'s' if done.count != 1 else ''}")
    print(
        f"the server reads it from tls.crl in server.yaml, or from {CRL_FILE} beside its tls.ca: "
        f"copy {done.path} there if the server has copies of its own, then run `llmgw ctl reload` "
        "(or send the server SIGHUP): it refuses the certificate from then on and closes its session"
    )
    return 0


def _read_request(where: str) -> bytes:
    """The request in file *where* (``-``: stdin), read no further than one more byte than a request may have."""
    import sys

    if where == "-":
        return sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    try:
        with open(where, "rb") as f:
            return f.read(MAX_REQUEST_BYTES + 1)
    except OSError as e:
        raise PKIError(f"cannot read the certificate request {where}: {e.strerror}") from None


def _readable_certificate(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def _serial_argument(text: str) -> int:
    try:
        return parse_serial(text)
    except PKIError as e:
        raise argparse.ArgumentTypeError(f"--serial {e}") from None


def _days_argument(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of days") from None
    if not 1 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{days} days: use 1 to {MAX_DAYS}")
    return days
