"""Who a link peer is: the roles a certificate names, and what a node's id may be.

``llmgw.pki`` writes these into certificates and ``llmgw.link`` reads them
back from the peer's; neither owns them, so the CA's tools need nothing of
the transport, and the hub never takes a name the CA would not sign.
"""

from __future__ import annotations

import re

# Roles, as carried in a certificate's OU.
ROLE_SERVER = "server"
ROLE_NODE = "node"
ROLE_OPERATOR = "operator"
ROLE_ROUTER = "router"
CERT_ROLES = (ROLE_SERVER, ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER)
# The control plane's own session, attached inside the server process.
ROLE_CONTROL = "control"

# A node's id is one URI component: no dots, or node "a" could register under
# "llmgw.node.a.b." and answer for node "a.b".  \Z, not $: "a\n" is no id.
NODE_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,62}\Z")


def is_node_id(name: object) -> bool:
    """Whether *name* can be a node's id on the link: the one rule the hub, ``llmgw pki`` and the agent share."""
    return isinstance(name, str) and NODE_ID.match(name) is not None
