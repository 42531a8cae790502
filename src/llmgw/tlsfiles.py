"""The files a process shows on the link: the cluster CA, its own certificate, its key (and the hub's revocation list).

The configuration files name them (``tls:`` in server.yaml, agent.yaml and
router.yaml; ctl.yaml, flags or ``LLMGW_*`` for an operator) and the link
opens them, so the record lives here, where both import it.
"""

from __future__ import annotations

import os

import attrs

# The revocation list's name when server.yaml does not give one: beside the CA
# certificate, where `llmgw pki revoke` writes it in the CA's own directory.
CRL_BESIDE_CA = "crl.pem"


@attrs.frozen
class TLSFiles:
    """The cluster CA, this process's certificate and its key, as absolute paths.

    ``crl`` is the hub's revocation list (server.yaml's ``tls.crl``); only
    the hub reads one.
    """

    ca: str
    cert: str
    key: str
    crl: str | None = None

    def revocation_list(self) -> str | None:
        """The revocation list the hub reads: ``crl``, else crl.pem beside the CA when there is one."""
        if self.crl is not None:
            return self.crl
        beside = os.path.join(os.path.dirname(self.ca), CRL_BESIDE_CA)
        return beside if os.path.lexists(beside) else None
