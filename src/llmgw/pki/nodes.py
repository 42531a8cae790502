"""A node's certificate signed for onboarding or revoked for offboarding, one rule for the control plane and ``ctl onboard --ca-dir``.

Both act on NODE.crt in the CA's directory only when it is node NODE's
certificate (:func:`llmgw.pki.held.node_certificate`): the server's, an
operator's or a router worker's under that name is refused.  NODE.crt is
replaced when it holds the same key (a re-run renews).  One for another key
is another machine: refused unless *replace*, which revokes it first — or
unless it is revoked already (an offboarded node's name, onboarded again),
when nothing is left to take.  A key whose certificate was revoked is not
signed again without *replace*, whatever name it comes under.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
from cryptography import x509

from llmgw.errors import PKIError
from llmgw.roles import ROLE_NODE

from .authority import CA_CERT, PathLike, _public_der, read_ca_certificate, read_request, sign_request
from .held import held, node_certificate
from .revocation import CRL_FILE, Revocation, Revoked, RevocationList, read_revocations, revoke
from .subject import node_name_problem

__all__ = ["NodeSigned", "held", "node_name_free", "node_to_revoke", "revoke_node", "revoked_key", "sign_node"]


@attrs.frozen
class NodeSigned:
    """What :func:`sign_node` did: the certificate written, and the one it revoked to take its name (or None)."""

    path: Path
    certificate: x509.Certificate
    replaced: Revoked | None = None


def sign_node(directory: PathLike, node_id: str, request: bytes, replace: bool = False) -> NodeSigned:
    """Sign *request* for node *node_id* with the CA in *directory*, by the rule above; PKIError says why not."""
    directory = Path(directory)
    _check_node_id(node_id)
    existing = node_certificate(directory / f"{node_id}.crt", node_id)
    wanted = read_request(request)
    revocations = _revocations(directory)
    taken_back = None if replace else revoked_key(directory, wanted.public_key())
    if taken_back is not None:
        raise PKIError(
            f"{taken_back}. Onboard {node_id} with a new key: remove node.key from the node's configuration "
            "directory (`llmgw ctl onboard` then makes one), or, if you trust this key again, run again with --replace"
        )
    replaced = None
    if existing is not None and _public_der(existing.public_key()) != _public_der(wanted.public_key()):
        if revocations.revoked(existing.serial_number) is None:
            if not replace:
                raise PKIError(
                    f"{node_id} already has a certificate (serial {existing.serial_number:x}, valid until "
                    f"{existing.not_valid_after_utc:%Y-%m-%d}) for another key; onboarding another machine "
                    f"as {node_id} takes --replace, which revokes that certificate first")
            replaced = revoke(directory, node_id)
    written = sign_request(directory, request, ROLE_NODE, name=node_id, force=existing is not None)
    return NodeSigned(written, x509.load_pem_x509_certificate(written.read_bytes()), replaced)


def revoke_node(directory: PathLike, node_id: str) -> Revoked:
    """Revoke node *node_id*'s certificate, NODE.crt in *directory*; PKIError when there is none or it is not a node's."""
    node_to_revoke(directory, node_id)
    return revoke(Path(directory), node_id)


def node_to_revoke(directory: PathLike, node_id: str) -> x509.Certificate:
    """What :func:`revoke_node` would revoke, changing nothing: node *node_id*'s certificate, or PKIError saying why none.

    ``ctl offboard`` asks this before it drains or removes anything, so a name
    whose certificate is the server's, an operator's or no one's is refused
    while the machine under that name is still as it was.
    """
    directory = Path(directory)
    _check_node_id(node_id)
    path = directory / f"{node_id}.crt"
    cert = node_certificate(path, node_id)
    if cert is None:
        raise PKIError(
            f"{directory} has no certificate {node_id}.crt to revoke; if the node's certificate was signed "
            f"elsewhere, revoke it there by its serial with `llmgw pki revoke DIR --serial HEX`")
    return cert


def node_name_free(directory: PathLike, node_id: str) -> x509.Certificate | None:
    """Whether :func:`sign_node` may sign for *node_id* at all, asked before onboarding changes the node.

    The certificate NODE.crt holds when it is node *node_id*'s, None when
    there is none; PKIError when the name is not a node's or its file is
    someone else's.  Which key may take it is known only once the node has
    made its request.
    """
    directory = Path(directory)
    _check_node_id(node_id)
    return node_certificate(directory / f"{node_id}.crt", node_id)


def _check_node_id(node_id: str) -> None:
    problem = node_name_problem(node_id)
    if problem is not None:
        raise PKIError(problem)


def _revocations(directory: Path) -> RevocationList:
    crl = directory / CRL_FILE
    if not os.path.lexists(crl):
        return RevocationList()
    return read_revocations(crl, read_ca_certificate(directory / CA_CERT))


def revoked_key(directory: PathLike, key) -> str | None:
    """Why *key* is not to be signed again: a certificate in *directory* for it, under any name, is revoked; else None."""
    directory = Path(directory)
    revocations = _revocations(directory)
    if not len(revocations):
        return None
    wanted = _public_der(key)
    for path in sorted(directory.glob("*.crt")):
        if path.name == CA_CERT:
            continue
        try:
            cert = held(path)
        except PKIError:
            continue
        if cert is None or _public_der(cert.public_key()) != wanted:
            continue
        entry: Revocation | None = revocations.revoked(cert.serial_number)
        if entry is not None:
            return f"the request's key is the key of {path.name}, {entry.reason}; a revoked key is not signed again"
    return None
