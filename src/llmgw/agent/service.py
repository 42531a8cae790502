"""`twistd llmgw-agent`: one per node, dialling out to the hub and describing the node.

The node's id is its host name, which is also its certificate's CN; the agent
checks the two agree before dialling, because the hub would refuse it forever
otherwise and the reason would be on the server, not here.
"""

from __future__ import annotations

import socket

from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from twisted.application import service
from twisted.internet import task, threads
from twisted.logger import Logger
from twisted.python import usage

from llmgw import PROTOCOL_VERSION, __version__
from llmgw.errors import ConfigError, LlmgwError
from llmgw.link import uris
from llmgw.link.client import HubAddress, client_service, parse_hub_url
from llmgw.link.tls import TLSFiles, certificate_common_name
from llmgw.wire import to_wire

log = Logger()


class Options(usage.Options):
    optParameters = [["config", "c", "/etc/llmgw/agent.yaml", "The agent's configuration file."]]


class Agent:
    """What the agent knows and does, apart from any one link session."""

    def __init__(self, reactor, config, node_id: str, hub: HubAddress):
        self.reactor = reactor
        self.config = config
        self.node_id = node_id
        self.hub = hub
        self.registered_once = False

    def discover(self):
        from llmgw.agent.discovery import discover

        return threads.deferToThread(
            discover,
            node_id=self.node_id,
            hub_host=self.hub.host,
            hub_port=self.hub.port,
            weights_dirs=list(self.config.weights_dirs),
            labels=dict(self.config.labels),
            fabrics=dict(self.config.fabrics),
            agent_version=__version__,
            protocol=PROTOCOL_VERSION,
        )

    def sample(self):
        from llmgw.agent.discovery import sample

        return threads.deferToThread(sample, weights_dirs=list(self.config.weights_dirs))


class AgentSession(ApplicationSession):
    def __init__(self, config, agent: Agent):
        super().__init__(config)
        self.agent = agent
        self._beat: task.LoopingCall | None = None

    def onConnect(self):
        self.join(self.config.realm, authid=self.agent.node_id)

    async def onJoin(self, details):
        node = self.agent.node_id
        await self.register(lambda: {"node_id": node, "version": __version__}, uris.node_uri(node, uris.NODE_PING))
        await self._register()
        self._beat = task.LoopingCall(self._heartbeat)
        self._beat.clock = self.agent.reactor
        self._beat.start(self.agent.config.heartbeat_interval_s, now=False).addErrback(
            lambda f: log.failure("heartbeat loop stopped", f)
        )

    async def _register(self):
        inventory = await self.agent.discover()
        for warning in inventory.warnings:
            log.warn("{warning}", warning=warning)
        await self.call(uris.AGENT_REGISTER, to_wire(inventory))
        verb = "registered again" if self.agent.registered_once else "registered"
        self.agent.registered_once = True
        log.info("{verb} with the hub at {hub} as {id}", verb=verb, hub=self.agent.hub.url, id=self.agent.node_id)

    async def _heartbeat(self):
        try:
            beat = await self.agent.sample()
            await self.call(uris.AGENT_HEARTBEAT, to_wire(beat))
        except ApplicationError as e:
            if e.error == uris.ERROR_NOT_REGISTERED:
                # The control plane restarted behind the same hub: tell it everything again.
                await self._register()
            else:
                log.warn("heartbeat refused: {e}", e=e)
        except Exception as e:
            if self.is_attached():
                log.warn("heartbeat failed: {e}", e=e)

    def onLeave(self, details):
        if self._beat is not None and self._beat.running:
            self._beat.stop()
        if details.reason not in ("wamp.close.normal", "wamp.close.goodbye_and_out"):
            log.warn("the hub ended the session: {reason} {message}", reason=details.reason, message=details.message or "")
        self.disconnect()


def node_id_for(config) -> str:
    """The configured node id, or this host's short name, checked against the certificate."""
    node_id = config.node_id or socket.gethostname().split(".")[0]
    cn = certificate_common_name(config.tls.cert)
    if cn != node_id:
        source = "node_id in the agent configuration" if config.node_id else "this host's name"
        raise ConfigError(
            f"{source} is {node_id!r} but {config.tls.cert} is a certificate for {cn!r}: "
            f"issue one for this node (llmgw pki issue DIR --role node {node_id}) "
            f"or set node_id: {cn} in the agent configuration"
        )
    return node_id


def build(reactor, config) -> service.MultiService:
    hub = parse_hub_url(config.hub)
    node_id = node_id_for(config)
    agent = Agent(reactor, config, node_id, hub)
    tls = TLSFiles(config.tls.ca, config.tls.cert, config.tls.key)
    top = service.MultiService()
    client_service(reactor, hub, tls, lambda cfg: AgentSession(cfg, agent)).setServiceParent(top)
    top.agent = agent
    return top


def makeService(options) -> service.MultiService:
    from twisted.internet import reactor

    from llmgw.config.agent import load_agent_config

    try:
        config = load_agent_config(options["config"])
        svc = build(reactor, config)
    except LlmgwError as e:
        raise SystemExit(f"llmgw-agent: {e}")
    log.info("llmgw agent {id}: dialling {hub}", id=svc.agent.node_id, hub=config.hub)
    return svc
