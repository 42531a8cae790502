"""Who may do what on the link, decided by role and URI alone.

The identity is the one the hub read from the client certificate; nothing a
client says about itself enters here.  ``refusal`` returns ``None`` when the
action is allowed and otherwise the sentence the client receives.
"""

from __future__ import annotations

from llmgw.link import uris
from llmgw.roles import ROLE_CONTROL, ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER, ROLE_SERVER, is_node_id

REGISTER = "register"
CALL = "call"
SUBSCRIBE = "subscribe"
PUBLISH = "publish"


def refusal(role: str, authid: str, action: str, uri: str) -> str | None:
    if role == ROLE_CONTROL:
        return None
    if role == ROLE_NODE:
        if action == REGISTER and uri.startswith(uris.node_uri(authid, "")):
            return None
        if action == CALL and uri.startswith(uris.CP_AGENT):
            return None
        return f"node {authid} may register only under {uris.node_uri(authid, '')}* and call only {uris.CP_AGENT}*; not {action} {uri}"
    if role == ROLE_OPERATOR:
        if action == CALL and uri.startswith(uris.CP) and not uri.startswith(uris.CP_AGENT):
            return None
        if action == SUBSCRIBE and uri.startswith(uris.EVENT_PREFIX):
            return None
        return f"operator {authid} may call {uris.CP}* (not {uris.CP_AGENT}*) and subscribe to {uris.EVENT_PREFIX}*; not {action} {uri}"
    if role == ROLE_ROUTER:
        if action == SUBSCRIBE and uri.startswith(uris.EVENT_PREFIX):
            return None
        if action == CALL and uri.startswith(uris.CP_ROUTER):
            return None
        return f"router {authid} may subscribe to {uris.EVENT_PREFIX}* and call {uris.CP_ROUTER}*; not {action} {uri}"
    return f"role {role!r} may not {action} {uri}"


def session_refusal(role: str, authid: str) -> str | None:
    """Why a certificate may not open a session at all, or ``None``."""
    if role == ROLE_SERVER:
        return f"{authid} holds a server certificate, which identifies the hub; clients need a node, operator or router certificate"
    if role == ROLE_NODE and not is_node_id(authid):
        return (
            f"node certificate CN {authid!r} is not a short host name "
            "(letters, digits, '-' and '_', no dots); issue the node's certificate for its short host name"
        )
    if role not in (ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER):
        return f"certificate role {role!r} is not one llmgw knows"
    return None
