"""The three files a process shows on the link: the cluster CA, its own certificate, its key.

The configuration files name them (``tls:`` in server.yaml, agent.yaml and
router.yaml; ctl.yaml, flags or ``LLMGW_*`` for an operator) and the link
opens them, so the record lives here, where both import it.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class TLSFiles:
    """The cluster CA, this process's certificate and its key, as absolute paths."""

    ca: str
    cert: str
    key: str
