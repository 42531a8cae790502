"""twistd plugins: `twistd llmgw-server` and `twistd llmgw-agent`."""

from twisted.application.service import ServiceMaker

llmgw_server = ServiceMaker(
    "llmgw server",
    "llmgw.control.server",
    "The llmgw hub, control plane, router and metrics in one process.",
    "llmgw-server",
)
llmgw_agent = ServiceMaker(
    "llmgw agent",
    "llmgw.agent.service",
    "The llmgw node agent: discovery, engines, weights, logs.",
    "llmgw-agent",
)
