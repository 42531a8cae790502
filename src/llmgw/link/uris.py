"""Every URI on the link, in one place.

The realm is ``llmgw``.  Who may do what with these is decided in
``llmgw.link.authz``; keep the two in step.
"""

from __future__ import annotations

REALM = "llmgw"

# Roles, as carried in a certificate's OU.
ROLE_SERVER = "server"
ROLE_NODE = "node"
ROLE_OPERATOR = "operator"
ROLE_ROUTER = "router"
CERT_ROLES = (ROLE_SERVER, ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER)
# The control plane's own session, attached inside the server process.
ROLE_CONTROL = "control"

# agent -> control plane
CP_AGENT = "llmgw.cp.agent."
AGENT_REGISTER = CP_AGENT + "register"
AGENT_HEARTBEAT = CP_AGENT + "heartbeat"

# operator -> control plane
CP = "llmgw.cp."
CP_NODES = CP + "nodes"

# control plane -> agent: llmgw.node.<id>.<verb>
NODE_PREFIX = "llmgw.node."


def node_uri(node_id: str, verb: str) -> str:
    return f"{NODE_PREFIX}{node_id}.{verb}"


NODE_PING = "ping"

# events
EVENT_PREFIX = "llmgw.event."
EVENT_NODE = EVENT_PREFIX + "node"

# application errors
ERROR_NOT_AUTHORIZED = "wamp.error.not_authorized"
ERROR_INVALID_ARGUMENT = "wamp.error.invalid_argument"
ERROR_NO_SUCH_NODE = "llmgw.error.no_such_node"
ERROR_NOT_REGISTERED = "llmgw.error.not_registered"
