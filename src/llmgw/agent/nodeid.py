"""A node's id: node_id in agent.yaml, or this host's short name, and the name its certificate is for.

The id is the short host name (``hostname -s``: node05 of node05.example.org)
everywhere: it is one component of the node's URIs, and the hub refuses a
node certificate for anything else.  :func:`llmgw.pki.subject.node_name_problem`
is the rule, the one ``llmgw pki`` signs by and the hub admits by, so an agent
whose id the hub would refuse says so at start, not at every reconnection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from llmgw.errors import ConfigError
from llmgw.link.tls import certificate_common_name
from llmgw.pki.subject import node_name_problem


def short_host_name(hostname: str) -> str:
    """The first label of *hostname*, as ``hostname -s`` prints it: node05 for node05.example.org."""
    return hostname.split(".")[0]


def node_id_for(config, hostname: Callable[[], str] = socket.gethostname) -> str:
    """The configured node id, or this host's short name, checked as the hub checks it and against the certificate."""
    if config.node_id:
        node_id = config.node_id
        problem = node_name_problem(node_id)
        if problem is not None:
            raise ConfigError(f"node_id in the agent configuration: {problem}")
    else:
        host = hostname()
        node_id = short_host_name(host)
        problem = node_name_problem(node_id)
        if problem is not None:
            raise ConfigError(
                f"this host's name {host!r} gives no usable node id: {problem}. Set node_id in the agent "
                "configuration, and issue the node's certificate for that name"
            )
    cn = certificate_common_name(config.tls.cert)
    if cn != node_id:
        source = "node_id in the agent configuration" if config.node_id else "this host's name"
        raise ConfigError(
            f"{source} is {node_id!r} but {config.tls.cert} is a certificate for {cn!r}: "
            f"issue one for this node (llmgw pki issue DIR --role node {node_id}) "
            f"or set node_id: {cn} in the agent configuration"
        )
    return node_id
