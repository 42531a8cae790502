"""A node's certificate signed for onboarding, one rule for the control plane and ``ctl onboard --ca-dir``.

NODE.crt in the CA's directory is replaced when it holds the same key (a
re-run renews).  One for another key is another machine: refused unless
*replace*, which revokes it first — or unless it is revoked already (an
offboarded node's name, onboarded again), when nothing is left to take.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
from cryptography import x509

from llmgw.errors import PKIError
from llmgw.link.uris import ROLE_NODE

from .authority import CA_CERT, PathLike, _public_der, read_ca_certificate, read_request, sign_request
from .revocation import CRL_FILE, Revoked, read_revocations, revoke


@attrs.frozen
class NodeSigned:
    """What :func:`sign_node` did: the certificate written, and the one it revoked to take its name (or None)."""

    path: Path
    certificate: x509.Certificate
    replaced: Revoked | None = None


def sign_node(directory: PathLike, node_id: str, request: bytes, replace: bool = False) -> NodeSigned:
    """Sign *request* for node *node_id* with the CA in *directory*, by the rule above; PKIError says why not."""
    directory = Path(directory)
    path = directory / f"{node_id}.crt"
    existing = held(path)
    wanted = read_request(request)
    replaced = None
    if existing is not None and _public_der(existing.public_key()) != _public_der(wanted.public_key()):
        if not _revoked(directory, existing):
            if not replace:
                raise PKIError(
                    f"{node_id} already has a certificate (serial {existing.serial_number:x}, valid until "
                    f"{existing.not_valid_after_utc:%Y-%m-%d}) for another key; onboarding another machine "
                    f"as {node_id} takes --replace, which revokes that certificate first")
            replaced = revoke(directory, node_id)
    written = sign_request(directory, request, ROLE_NODE, name=node_id, force=existing is not None)
    return NodeSigned(written, x509.load_pem_x509_certificate(written.read_bytes()), replaced)


def held(path: Path) -> x509.Certificate | None:
    """The certificate in *path*, None when there is none, PKIError when it cannot be read as one."""
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PKIError(f"{path} cannot be read as a certificate ({e}); move it away") from None


def _revoked(directory: Path, cert: x509.Certificate) -> bool:
    crl = directory / CRL_FILE
    if not os.path.lexists(crl):
        return False
    return read_revocations(crl, read_ca_certificate(directory / CA_CERT)).revoked(cert.serial_number) is not None
