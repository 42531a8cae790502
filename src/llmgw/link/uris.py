"""Every URI on the link, in one place.

The realm is ``llmgw``.  Who may do what with these is decided in
``llmgw.link.authz``; keep the two in step.  The roles a session is opened
with are ``llmgw.roles``' (the CA writes them into certificates).
"""

from __future__ import annotations

REALM = "llmgw"

# agent -> control plane
CP_AGENT = "llmgw.cp.agent."
AGENT_REGISTER = CP_AGENT + "register"
AGENT_HEARTBEAT = CP_AGENT + "heartbeat"
AGENT_SHARD_STATUS = CP_AGENT + "shard_status"
AGENT_PROGRESS = CP_AGENT + "progress"

# operator -> control plane
CP = "llmgw.cp."
CP_NODES = CP + "nodes"
# One node's view by its id, or None: what onboarding waits on, without reading the fleet.
CP_NODE = CP + "node"
CP_REPLICAS = CP + "replicas"
CP_STATUS = CP + "status"
CP_DRAIN = CP + "drain"
CP_CORDON = CP + "cordon"
CP_UNCORDON = CP + "uncordon"
CP_RELOAD = CP + "reload"
CP_LOGS = CP + "logs"
CP_WEIGHTS = CP + "weights"
# Elastic replicas: pin a model's replica count, or give it back to its policy (llmgw.answers.ScaleAnswer).
CP_SCALE = CP + "scale"
# The journal (llmgw.history.JournalPage) and the rolling figures (llmgw.history.Figures).
CP_EVENTS = CP + "events"
CP_FIGURES = CP + "figures"
# Onboarding (llmgw.control.identity): what a node is to install, and its certificate.
CP_ONBOARDING = CP + "onboarding"
CP_SIGN_NODE = CP + "sign_node"
CP_REVOKE_NODE = CP + "revoke_node"

# router workers -> control plane
CP_ROUTER = CP + "router."
ROUTER_ENDPOINTS = CP_ROUTER + "endpoints"
# A router's traffic (llmgw.traffic.RouterLoad), every second.
ROUTER_LOAD = CP_ROUTER + "load"

# control plane -> agent: llmgw.node.<id>.<verb>
NODE_PREFIX = "llmgw.node."


def node_uri(node_id: str, verb: str) -> str:
    return f"{NODE_PREFIX}{node_id}.{verb}"


NODE_PING = "ping"
NODE_START_SHARD = "start_shard"
NODE_STOP_SHARD = "stop_shard"
NODE_DRAIN_SHARD = "drain_shard"
NODE_CORDON = "cordon"
NODE_LOGS = "logs"
NODE_COLLECT_WEIGHTS = "collect_weights"
# The EnginePlan changed (a reload): converge on it.  At register the plan
# comes back in the answer: {"node_id": ..., "engines": EnginePlan}.
NODE_SET_ENGINES = "set_engines"
# The keyword a mutating command carries when the server runs with ha: the leader's epoch
# (llmgw.ha.fence); an agent refuses an epoch older than the newest it has seen (llmgw.agent.fence).
EPOCH = "epoch"

# events
EVENT_PREFIX = "llmgw.event."
EVENT_NODE = EVENT_PREFIX + "node"
EVENT_SHARD = EVENT_PREFIX + "shard"
EVENT_PROGRESS = EVENT_PREFIX + "progress"
EVENT_JOURNAL = EVENT_PREFIX + "journal"
# Every few seconds, the nodes heard from since the last (llmgw.control.heard).
EVENT_HEARD = EVENT_PREFIX + "heard"
# The whole endpoint table, published whenever it changes.
EVENT_ENDPOINTS = EVENT_PREFIX + "endpoints"

# application errors
ERROR_NOT_AUTHORIZED = "wamp.error.not_authorized"
ERROR_INVALID_ARGUMENT = "wamp.error.invalid_argument"
# What autobahn answers when a procedure raised something other than an
# ApplicationError: from an older server, a keyword it does not take.
ERROR_RUNTIME = "wamp.error.runtime_error"
ERROR_NO_SUCH_NODE = "llmgw.error.no_such_node"
ERROR_NOT_REGISTERED = "llmgw.error.not_registered"
ERROR_REFUSED = "llmgw.error.refused"  # a node or the control plane said no, in its own words
ERROR_CONFIG = "llmgw.error.config"
ERROR_NOT_ANSWERING = "llmgw.error.not_answering"
# A second session for a node whose first one still answers.
ERROR_ALREADY_CONNECTED = "llmgw.error.already_connected"
# A per-session limit of the hub (link: in server.yaml) was reached.
ERROR_LIMIT = "llmgw.error.limit"
# A standby server refuses an agent's registration: args[0] names the leader in words, and the
# keyword LEADER_URL its hub URL, which an agent dials only if its own agent.yaml lists it.
ERROR_STANDBY = "llmgw.error.standby"
LEADER_URL = "leader_url"
