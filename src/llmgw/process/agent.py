"""`twistd llmgw-agent`: one per node, dialling out to the hub and describing the node.

What the tree holds: the link session to the hub (reconnecting forever), the
Installer that keeps the catalog's engines installed under the state
directory, a timer that probes agent.yaml's engines again, and, on
shutdown, a goodbye to the engines that leaves them serving for the next
agent to adopt.
Before any of it, the node's id is checked against its certificate and the
state directory is locked for this agent alone (``agent/statelock.py``).
"""

from __future__ import annotations

import os

from twisted.application import internet, service
from twisted.internet import defer
from twisted.logger import Logger, globalLogPublisher

from llmgw.agent import directories
from llmgw.agent.service import Agent, AgentSession, node_id_for
from llmgw.agent.statelock import StateLock
from llmgw.config.agent import DEFAULT_STATE_DIR, DEFAULT_WEIGHTS_DIRS, AgentConfig, load_agent_config
from llmgw.link.hubs import HubList
from llmgw.link.client import client_service
from llmgw.process.common import compose, config_options

ENGINE_PROBE_INTERVAL_S = 60.0

log = Logger()

Options = config_options("/etc/llmgw/agent.yaml", "The agent's configuration file.")


def makeService(options) -> service.MultiService:
    return compose("llmgw-agent", options, load_agent_config, build)


def build(reactor, config: AgentConfig) -> service.MultiService:
    hubs = HubList.of(config.hub, config.hub_handshake_timeout_s)
    node_id = node_id_for(config)
    # Before the first record is read: a second agent here would adopt this one's engines.
    lock = StateLock.acquire(config.state_dir, node_id)
    try:
        return _build_holding(reactor, config, hubs, node_id, lock)
    except BaseException:
        lock.release()  # a build that failed holds nothing, in a test process or a twistd alike
        raise


def _build_holding(reactor, config: AgentConfig, hubs: HubList, node_id: str, lock: StateLock) -> service.MultiService:
    top = service.MultiService()
    _HoldStateDir(lock).setServiceParent(top)
    agent = Agent(reactor, config, node_id, hubs.current, platform=_platform(), hubs=hubs)
    tls = config.tls
    globalLogPublisher.addObserver(agent.log_buffer)
    for status in agent.supervisor.adopt_all():
        log.info("adopted {shard} (pid {pid}), {state}", shard=status.spec.shard_id, pid=status.pid, state=status.state)
    _Installs(agent).setServiceParent(top)
    client_service(reactor, hubs, tls, lambda cfg: AgentSession(cfg, agent)).setServiceParent(top)
    internet.TimerService(ENGINE_PROBE_INTERVAL_S, _reprobe, agent).setServiceParent(top)
    _LeaveEnginesRunning(agent).setServiceParent(top)
    top.agent = agent
    log.info("llmgw agent {id}: dialling {hub}; {where}", id=node_id, hub=", then ".join(config.hub), where=where_it_keeps(config))
    # The node registers with the same sentences (discovery), so its disk is never missing without a word.
    for sentence in directories.make_weights_dirs(config.weights_dirs):
        log.warn("{sentence}", sentence=sentence)
    return top


def _platform():
    """What this node installs builds for: its OS and CPU, and the CUDA its NVIDIA driver supports."""
    from llmgw.agent.discovery.gpus import cuda_version
    from llmgw.agent.engines.assets import this_platform

    platform = this_platform(cuda=cuda_version())
    log.info("engines are installed for {system} {machine}, {cuda}", system=platform.system,
             machine=platform.machine,
             cuda=f"CUDA {platform.cuda}" if platform.cuda else "CPU builds (no NVIDIA driver loaded)")
    return platform


class _Installs(service.Service):
    """The Installer: what is on disk is reported at once, and checked again while the agent runs."""

    def __init__(self, agent: Agent):
        self.agent = agent

    def startService(self):
        super().startService()
        self.agent.installer.start()

    def stopService(self):
        super().stopService()
        self.agent.installer.stop()


class _HoldStateDir(service.Service):
    """The state directory's lock, held from makeService to the process's end."""

    def __init__(self, lock: StateLock):
        self.lock = lock

    def startService(self):
        super().startService()
        # twistd may have forked into the background since the lock was taken.
        self.lock.name_holder()


class _LeaveEnginesRunning(service.Service):
    """On shutdown, stop watching the engines and leave them serving for the next agent."""

    def __init__(self, agent: Agent):
        self.agent = agent

    def stopService(self):
        super().stopService()
        self.agent.supervisor.close()


def _reprobe(agent: Agent):
    if agent.engines is None:
        return None  # the first probe belongs to the first register
    # An engine agent.yaml names can lose a library to an unrelated upgrade,
    # or be fixed, without anyone restarting the agent.  The Installer checks
    # its own installs again by itself.
    return defer.ensureDeferred(agent.probe_engines()).addErrback(
        lambda f: log.warn("probing engines failed: {e}", e=f.getErrorMessage())
    )


def where_it_keeps(config: AgentConfig) -> str:
    """The start line's account of the directories it writes, saying which are defaults.

    Run as root without ``state_dir``, the agent made /var/lib/llmgw without a
    word, and a newcomer trying it in a checkout found its state nowhere near it.
    """
    state, weights = config.state_dir, ", ".join(config.weights_dirs)
    engines = os.path.join(config.state_dir, "engines")
    if config.state_dir == DEFAULT_STATE_DIR:
        state += " (the default; state_dir in agent.yaml moves it)"
    if config.weights_dirs == DEFAULT_WEIGHTS_DIRS:
        weights += " (the default; weights_dirs in agent.yaml moves it)"
    return f"state in {state}, weights in {weights}, engines the catalog names installed in {engines}"
