"""twistd plugins: `twistd llmgw-server`, `twistd llmgw-agent` and `twistd llmgw-router`."""

from twisted.application.service import ServiceMaker

llmgw_server = ServiceMaker(
    "llmgw server",
    "llmgw.process.server",
    "The llmgw hub, control plane, router and metrics in one process.",
    "llmgw-server",
)
llmgw_agent = ServiceMaker(
    "llmgw agent",
    "llmgw.process.agent",
    "The llmgw node agent: discovery, engines, weights, logs.",
    "llmgw-agent",
)
llmgw_router = ServiceMaker(
    "llmgw router",
    "llmgw.process.router",
    "The llmgw OpenAI router alone, following the hub's endpoint table or a static list.",
    "llmgw-router",
)
