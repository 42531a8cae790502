"""What a name in the CA's directory already holds, and whose place a new certificate may take.

NAME.crt beside the CA may be the server's own certificate, an operator's
or a router worker's as well as a node's.  Whatever replaces or revokes it
reads it here first: :func:`node_certificate` lets the onboarding paths act
on a node's certificate only, :func:`check_same_holder` keeps ``--force``
from turning one role's file into another's.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from llmgw.errors import PKIError
from llmgw.roles import ROLE_NODE

from .subject import CertificateSubject, identity_of, printable


def held(path: Path) -> x509.Certificate | None:
    """The certificate in *path*, None when there is none, PKIError when it cannot be read as one."""
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PKIError(f"{path} cannot be read as a certificate ({e}); move it away") from None


def node_certificate(path: Path, node_id: str) -> x509.Certificate | None:
    """The certificate in *path* when it is node *node_id*'s, None when there is none; PKIError when it is anyone else's.

    The control plane and ``ctl onboard --ca-dir`` sign and revoke nodes'
    certificates, never the server's, an operator's or a router worker's.
    """
    cert = held(path)
    if cert is None:
        return None
    subject = _subject(cert)
    if subject is None:
        raise PKIError(
            f"{path} is not a node's certificate (it has no single CN and role OU); onboarding signs and revokes "
            f"nodes' certificates only: choose another node name, or move {path.name} away on the CA's host"
        )
    if subject.role != ROLE_NODE:
        raise PKIError(
            f"{path} is the {subject.role} certificate of {printable(subject.name)}, not a node's; onboarding signs "
            f"and revokes nodes' certificates only: give the node another name (its short host name), or, to end "
            f"that {subject.role}'s certificate, run `llmgw pki revoke {path.parent} {printable(subject.name)}` "
            "on the CA's host"
        )
    if subject.name != node_id:
        raise PKIError(
            f"{path} is the certificate of node {printable(subject.name)}, not of {node_id}; "
            "move it away on the CA's host"
        )
    return cert


def check_same_holder(path: Path, name: str, role: str) -> None:
    """Refuse replacing *path* with a certificate for *role* *name* when what it holds says another role or name.

    A file that cannot be read as an identity may be replaced: it was of no use on the link.
    """
    try:
        cert = held(path)
    except PKIError:
        return
    subject = None if cert is None else _subject(cert)
    if subject is None or (subject.role, subject.name) == (role, name):
        return
    raise PKIError(
        f"{path} is the {subject.role} certificate of {printable(subject.name)}; --force replaces a certificate "
        f"with one for the same holder and role, not with the {role} certificate of {name}. Choose another name, "
        f"or move {path.name} and its key away first"
    )


def _subject(cert: x509.Certificate) -> CertificateSubject | None:
    try:
        return identity_of(cert)
    except PKIError:
        return None
