"""The cluster's certificates: what one says, the CA that signs them, and ``llmgw pki``.

* :mod:`.subject` — what a certificate says about its holder
  (:class:`CertificateSubject`: name and role) and :func:`identity_of`, the
  one place that reads it;
* :mod:`.authority` — the CA: :func:`init_ca` creates it, :func:`issue` signs
  with it, :func:`sign_request` signs a request whose key stays with its holder;
* :mod:`.revocation` — :func:`revoke` writes the CA's revocation list,
  :func:`read_revocations` reads and checks it;
* :mod:`.keys` — :func:`~.keys.key_problem`, the keys the CA signs (those the link's TLS accepts);
* :mod:`.held` — what NAME.crt beside the CA already is, and whose place a new certificate may take;
* :mod:`.nodes` — signing and revoking a node's certificate for ``ctl onboard`` and ``ctl offboard``;
* :mod:`.commands` — ``llmgw pki init``, ``issue``, ``sign`` and ``revoke`` (imported by the
  command line only, so the hub does not load argparse code).

Key and certificate files are written by :mod:`llmgw.durable`.
"""

from __future__ import annotations

from .authority import CA_CERT, CA_DAYS, CA_KEY, CERT_DAYS, MAX_CLUSTER_NAME, MAX_DAYS, init_ca, issue, read_request, sign_request
from .revocation import CRL_FILE, Revocation, RevocationList, read_revocations, revoke
from .subject import (
    MAX_LABEL, MAX_NAME, CertificateSubject, check_name, describe_subject, identity_of, name_problem, node_name_problem,
    printable,
)

__all__ = [
    "CA_CERT", "CA_DAYS", "CA_KEY", "CERT_DAYS", "MAX_CLUSTER_NAME", "MAX_DAYS", "MAX_LABEL", "MAX_NAME",
    "CRL_FILE", "CertificateSubject", "Revocation", "RevocationList", "check_name", "describe_subject",
    "identity_of", "init_ca", "issue", "name_problem", "node_name_problem", "printable", "read_request",
    "read_revocations", "revoke", "sign_request",
]
