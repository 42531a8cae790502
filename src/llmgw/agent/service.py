"""The node agent, one per node: what it knows and does, and its session with the hub.

`llmgw.process.agent` composes `twistd llmgw-agent` from these.

The node's id is its host name, which is also its certificate's CN; the agent
checks the two agree before dialling, because the hub would refuse it forever
otherwise and the reason would be on the server, not here.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer, task, threads
from twisted.logger import Logger

from llmgw import PROTOCOL_VERSION, __version__
from llmgw.agent.discovery.host import route_address
from llmgw.agent.enginelist import NodeEngines, describe, news
from llmgw.agent.fence import Fence, register
from llmgw.agent.lifecycle import ShardInput
from llmgw.agent.logbuffer import LogBuffer
from llmgw.agent.nodeid import node_id_for  # noqa: F401  (llmgw.process.agent imports it from here)
from llmgw.agent.shard import ShardFetch
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.weights import Fetcher, InventoryWatch
from llmgw.agent.weights.inventory import local_files
from llmgw.huburl import HubAddress
from llmgw.link import answers, uris
from llmgw.link.hubs import HubList
from llmgw.records import EngineInfo, EnginePlan, ShardSpec, ShardStatus
from llmgw.states import EngineState
from llmgw.wire import WireError, from_wire, to_wire

log = Logger()


class Agent:
    """What the agent knows and does, apart from any one link session."""

    def __init__(self, reactor, config, node_id: str, hub: HubAddress, *, platform=None, installer=None, hubs=None):
        """*installer* is the Installer class (tests give a stand-in); *platform* what it installs for; *hubs* all it dials."""
        self.reactor = reactor
        self.config = config
        self.node_id = node_id
        self.hub = hub
        self.hubs: HubList = hubs or HubList([hub])
        self.registered_once = False
        self.session: AgentSession | None = None
        self.state_dir = Path(config.state_dir)
        self.fence = Fence(self.state_dir)  # the newest leader's epoch: older ones are refused
        # Engines listen on the address this node reaches the hub from: the
        # router, beside the hub, reaches them the same way.
        self.host = route_address(hub.host, hub.port) or "127.0.0.1"
        # What this node reports; None until agent.yaml's engines were probed.
        self.engines: list[EngineInfo] | None = None
        self._engines_sent: list[EngineInfo] | None = None
        self.engine_root = self.state_dir / "engines"
        self.installer = self._installer(installer, platform)
        self.node_engines = NodeEngines(config, self.installer, node_id)
        self.supervisor = Supervisor(reactor, self.state_dir, self.plan, self.report, host=self.host,
                                     engine_ports=config.engine_port_range)
        self.log_buffer = LogBuffer()
        # Fetched weights land in the first weights directory, under cache names
        # (agent.yaml's weights_dirs is never empty: [] reads as the default).
        self.cache_dir = Path(config.weights_dirs[0])
        self.fetcher = Fetcher(reactor, self.cache_dir, progress=self.report_progress, node_id=node_id,
                               pace=config.weights)
        self.weights_watch = InventoryWatch(self.cache_dir)
        # Shards waiting for their weights, by shard id.
        self.fetching: dict[str, ShardFetch] = {}

    # -- engines --

    async def probe_engines(self) -> bool:
        """Probe agent.yaml's engines again (in a thread); True when what the node reports changed."""
        await self.node_engines.probe_overrides()
        return self.refresh_engines()

    def refresh_engines(self) -> bool:
        """Recompute what the node reports; log it when it changed.  True when it did."""
        found = self.node_engines.entries()
        changed = found != self.engines
        if changed and found is not None:
            for line in describe(news(self.engines or [], found)):
                log.info("engine: {line}", line=line)
        self.engines = found
        return changed

    def set_engine_plan(self, plan: EnginePlan) -> defer.Deferred:
        """Converge on the control plane's *plan*: install what it names, remove what it no longer does.

        Fires once every build is installed or broken (never with an error).
        """
        from llmgw.agent.enginelist import in_use

        self.node_engines.plan = plan
        self.node_engines.old_control_plane = False
        wanted = self.node_engines.installable(plan)
        for build in plan.builds:
            if build not in wanted.builds:
                log.info("the catalog names {name} {version}; agent.yaml's engines.{name}.path runs it here instead",
                         name=build.name, version=build.version or "")
        log.info("engines the catalog names: {builds}; installed under {root}",
                 builds=", ".join(" ".join(filter(None, (b.name, b.version, b.pip and f"(pip {b.pip})")))
                                  for b in wanted.builds) or "none",
                 root=self.engine_root)

        def used():
            return in_use(self.statuses(), lambda name: [
                e.version for e in self.installer.entries()
                if e.name == name and e.version and e.state == EngineState.INSTALLED
            ])

        d = self.installer.converge(wanted, used)
        d.addErrback(lambda f: log.failure("installing the catalog's engines failed", f))
        self.refresh_engines()
        return d

    def plan(self, spec: ShardSpec, port: int):
        """The launch plan for *spec*, or an exception in this node's own words."""
        from llmgw.engines import adapter_for

        adapter = adapter_for(spec.engine)
        problems = adapter.validate(spec.args, gpus=len(spec.gpus), ranks=spec.ranks, source=spec.source,
                                    launcher=spec.launcher)
        if problems:
            raise ValueError("; ".join(problems))
        binary = self.node_engines.binary(spec)
        model_path = spec.source
        # sim needs no weights, but fetches them like any engine when given a
        # source: it is how the weights path is shown without a real engine.
        if spec.source is not None:
            from llmgw.agent.weights import local_path_for

            try:
                model_path = str(local_path_for(spec.source, self.cache_dir, spec.files))
            except ValueError as e:
                raise ValueError(f"source {spec.source!r}: {e}") from None
            if not os.path.exists(model_path):
                raise ValueError(f"the model file {model_path} does not exist on {self.node_id}")
        if spec.ranks > 1 and spec.rank == 0:
            return adapter.plan(spec, binary=binary, host=self.host, port=port, model_path=model_path,
                                rendezvous_port=self.supervisor.rendezvous_port(adapter.default_rendezvous(spec)))
        return adapter.plan(spec, binary=binary, host=self.host, port=port, model_path=model_path)

    def _installer(self, installer, platform):
        if installer is None:
            from llmgw.agent.engines.install import Installer as installer
        if platform is None:
            from llmgw.agent.engines.assets import this_platform

            platform = this_platform()
        return installer(
            self.reactor,
            self.engine_root,
            platform=platform,
            progress=self.report_progress,
            changed=self.refresh_engines,
            limits=self.config.installs,
        )

    def report(self, status: ShardStatus) -> None:
        """A shard changed state: tell the control plane now if we can, else at the next register."""
        session = self.session
        if session is None or not session.is_attached():
            return
        d = session.call(uris.AGENT_SHARD_STATUS, to_wire(status))
        d.addErrback(lambda f: log.warn("could not report {shard} {state}: {e}", shard=status.spec.shard_id,
                                        state=status.state, e=f.getErrorMessage()))

    # -- cordon, kept here because the control plane keeps no database --

    @property
    def _cordon_file(self) -> Path:
        return self.state_dir / "cordoned"

    @property
    def cordoned(self) -> bool:
        return self._cordon_file.exists()

    def set_cordoned(self, cordoned: bool) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if cordoned:
            self._cordon_file.write_text("cordoned by the control plane\n")
        else:
            self._cordon_file.unlink(missing_ok=True)
        log.info("this node is now {what}", what="cordoned" if cordoned else "uncordoned")

    def engines_to_send(self) -> list[EngineInfo] | None:
        """The engine list for a heartbeat: only when it changed since last sent."""
        if self.engines is None or self.engines == self._engines_sent:
            return None
        self._engines_sent = self.engines
        return self.engines

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
            # A recorded /sys tree for demos and tests of multi-node replicas on
            # a machine without InfiniBand, as $LLMGW_FAKE_NVML is for GPUs.
            sysfs_root=os.environ.get("LLMGW_FAKE_SYSFS") or "/sys",
            agent_version=__version__,
            protocol=PROTOCOL_VERSION,
        )

    def sample(self):
        from llmgw.agent.discovery import sample

        return threads.deferToThread(sample, weights_dirs=list(self.config.weights_dirs))

    async def weights_report(self, force: bool = False):
        """The weights this node holds, when they changed since last said (or *force*)."""
        from llmgw.agent.weights import scan

        files = await threads.deferToThread(scan, list(self.config.weights_dirs))
        files += await threads.deferToThread(local_files, self.local_sources(), {f.path for f in files})
        if force:
            self.weights_watch.reset()
        return self.weights_watch.report(files)

    def local_sources(self) -> list[str]:
        """The operator's paths this node's shards run from: held here, in a weights dir or not."""
        from llmgw.agent.weights import parse

        paths = []
        for status in self.supervisor.statuses():
            try:
                if status.spec.source is not None and not parse(status.spec.source).fetched:
                    paths.append(status.spec.source)
            except ValueError:
                continue  # the plan refused it in words
        return paths

    def statuses(self) -> list[ShardStatus]:
        """Every shard this node runs, adopted, or is fetching weights for."""
        return [*self.supervisor.statuses(), *(fetch.status() for fetch in self.fetching.values())]

    # -- weights --

    def needs_fetch(self, spec: ShardSpec) -> bool:
        from llmgw.agent.weights import local_path_for, parse

        if spec.source is None:
            return False
        try:
            return parse(spec.source).fetched and not local_path_for(spec.source, self.cache_dir, spec.files).exists()
        except ValueError:
            return False  # the plan refuses it in words

    def start(self, spec: ShardSpec) -> ShardStatus:
        """Start *spec*, fetching its weights first when this node lacks them."""
        waiting = self.fetching.get(spec.shard_id)
        if waiting is not None:
            return waiting.status()
        if not self.needs_fetch(spec):
            return self.supervisor.start(spec)
        fetch = ShardFetch(spec, self.reactor, self.fetcher.fetch(spec.source, sha256=spec.sha256, files=spec.files))
        self.fetching[spec.shard_id] = fetch
        log.info("shard {shard}: fetching {source}", shard=spec.shard_id, source=spec.source)
        fetch.download.addCallbacks(lambda _: self._fetched(fetch), lambda f: self._fetch_failed(fetch, f))
        return fetch.status()

    def _fetched(self, fetch: ShardFetch) -> None:
        if self.fetching.get(fetch.spec.shard_id) is not fetch:
            return
        del self.fetching[fetch.spec.shard_id]
        fetch.fire(ShardInput.FETCHED)
        self.supervisor.start(fetch.spec, fetch.life)  # which reports its own transitions

    def _fetch_failed(self, fetch: ShardFetch, f) -> None:
        if f.check(defer.CancelledError) or self.fetching.get(fetch.spec.shard_id) is not fetch:
            return
        del self.fetching[fetch.spec.shard_id]
        reason = f"fetching {fetch.spec.source} failed: {f.getErrorMessage()}"
        log.error("shard {shard}: {reason}", shard=fetch.spec.shard_id, reason=reason)
        fetch.fire(ShardInput.FETCH_FAILED, reason)
        self.report(fetch.status())

    def stop_fetching(self, shard_id: str) -> ShardStatus | None:
        fetch = self.fetching.pop(shard_id, None)
        if fetch is None:
            return None
        fetch.download.cancel()  # this shard stops waiting; a download other shards wait on goes on
        fetch.fire(ShardInput.STOP)
        return fetch.status()

    def report_progress(self, progress) -> None:
        """A download's progress: its own call, never a transition (it must not reset a start deadline)."""
        session = self.session
        if session is None or not session.is_attached():
            return
        session.call(uris.AGENT_PROGRESS, to_wire(progress)).addErrback(lambda f: None)


class AgentSession(ApplicationSession):
    def __init__(self, config, agent: Agent):
        super().__init__(config)
        self.agent = agent
        self._beat: task.LoopingCall | None = None
        # What the control plane (and an operator it relays to) hears when
        # this node fails answering: llmgw's sentence, no exception text.
        answers.worded_errors(self, fault=(
            f"{agent.node_id}'s agent failed while answering this call (its fault, not the caller's); "
            f"its log has the details: `llmgw ctl logs {agent.node_id}`"))
        answers.worded_unsendable(self, f"{agent.node_id}'s agent")

    def onConnect(self):
        self.join(self.config.realm, authid=self.agent.node_id)

    def onUserError(self, fail, msg):
        # A refusal is the caller's answer (a log of a shard not here, an id
        # that is not one), not this node's trouble: autobahn's line per call
        # let any operator polling a log write the node's log at will.
        value = getattr(fail, "value", None)
        if isinstance(value, ApplicationError) and value.error in (uris.ERROR_REFUSED, uris.ERROR_INVALID_ARGUMENT):
            return
        super().onUserError(fail, msg)

    async def onJoin(self, details):
        node = self.agent.node_id
        self.agent.session = self
        advice = f"check that {node}'s agent and the server run the same llmgw version"
        for verb, fn in ((uris.NODE_PING, self.ping), (uris.NODE_START_SHARD, self.start_shard),
                         (uris.NODE_STOP_SHARD, self.stop_shard), (uris.NODE_DRAIN_SHARD, self.drain_shard),
                         (uris.NODE_CORDON, self.cordon), (uris.NODE_LOGS, self.logs),
                         (uris.NODE_COLLECT_WEIGHTS, self.collect_weights), (uris.NODE_SET_ENGINES, self.set_engines)):
            uri = uris.node_uri(node, verb)
            await self.register(self.agent.fence.guarded(verb, uri, answers.checked(uri, fn, advice)), uri)
        if not await self._register():
            return  # a standby, or a leader no longer: the session leaves and the dialler goes on
        self._beat = task.LoopingCall(self._heartbeat)
        self._beat.clock = self.agent.reactor
        self._beat.start(self.agent.config.heartbeat_interval_s, now=False).addErrback(
            lambda f: log.failure("heartbeat loop stopped", f)
        )

    async def _register(self):
        if self.agent.engines is None:
            await self.agent.probe_engines()
        inventory = await self.agent.discover()
        for warning in inventory.warnings:
            log.warn("{warning}", warning=warning)
        inventory = attrs.evolve(
            inventory,
            engines=self.agent.engines,
            shards=self.agent.statuses(),
            cordoned=self.agent.cordoned, fencing=True,
            weights=await self.agent.weights_report(force=True),
        )
        self.agent._engines_sent = self.agent.engines
        answer = await register(self, self.agent.hubs, self.agent.fence, to_wire(inventory))
        if answer is None:
            return False
        self._plan_from(answer)
        verb = "registered again" if self.agent.registered_once else "registered"
        self.agent.registered_once = True
        log.info("{verb} with the hub at {hub} as {id}", verb=verb, hub=self.agent.hubs.current.url, id=self.agent.node_id)
        return True

    def _plan_from(self, answer) -> None:
        """The engine plan in a register answer; a control plane older than installs sends none."""
        if not isinstance(answer, dict) or "engines" not in answer:
            log.info("the control plane sent no engine plan: this node installs nothing and runs "
                     "what agent.yaml names, and sim")
            self.agent.node_engines.old_control_plane = True
            self.agent.refresh_engines()
            return
        try:
            plan = from_wire(EnginePlan, answer["engines"])
        except WireError as e:
            log.error("the control plane's engine plan is not one this agent reads ({e}); installing nothing", e=e)
            return
        self.agent.set_engine_plan(plan)

    async def _heartbeat(self):
        try:
            beat = await self.agent.sample()
            beat = attrs.evolve(beat, engines=self.agent.engines_to_send(),
                                weights=await self.agent.weights_report())
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

    # -- what the control plane asks of this node --

    def ping(self):
        return {"node_id": self.agent.node_id, "version": __version__}

    def start_shard(self, spec):
        try:
            decoded = from_wire(ShardSpec, spec)
        except WireError as e:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None
        return to_wire(self.agent.start(decoded))

    async def stop_shard(self, shard_id):
        if not isinstance(shard_id, str):
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, "stop_shard takes a shard id")
        stopped = self.agent.stop_fetching(shard_id)
        if stopped is not None:
            return to_wire(stopped)
        status = await self.agent.supervisor.stop(shard_id)
        return to_wire(status) if status is not None else None

    def drain_shard(self, shard_id):
        from llmgw.agent.supervisor import UnknownShard

        if not isinstance(shard_id, str):
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, "drain_shard takes a shard id")
        try:
            return to_wire(self.agent.supervisor.drain(shard_id))
        except UnknownShard as e:
            raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None

    def logs(self, source=None, n=200):
        """The last *n* lines of the agent's own log or of one shard's engine."""
        from llmgw.agent.logbuffer import AGENT_SOURCE
        from llmgw.agent.supervisor import UnknownShard

        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, "n is a number of lines, 0 or more")
        n = min(n, 10_000)
        sources = [AGENT_SOURCE, *self.agent.supervisor.sources()]
        source = source or AGENT_SOURCE
        if source == AGENT_SOURCE:
            lines = self.agent.log_buffer.last(n)
        elif isinstance(source, str):
            try:
                lines = self.agent.supervisor.tail(source, n)
            except UnknownShard as e:
                raise ApplicationError(uris.ERROR_REFUSED, str(e)) from None
        else:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, "source is a name from the node's sources")
        # A line may hold what no UTF-8 encodes (a file name read with surrogate escapes): shown replaced.
        lines = [line.encode("utf-8", "replace").decode("utf-8") if not line.isascii() else line for line in lines]
        return {"node": self.agent.node_id, "source": source, "sources": sources, "lines": lines}

    def collect_weights(self, paths):
        """Delete fetched weights the control plane says nobody wants — after checking every path here.

        The control plane knows the catalog; the node knows its disk.  Only
        cache-named files inside this node's own cache directory go; anything
        else is refused and said why, however the request was phrased.
        """
        from llmgw.agent.weights import collect

        result = collect(self.agent.cache_dir, paths)
        for path, why in result.refused.items():
            log.warn("refused to delete {path}: {why}", path=path, why=why)
        for path in result.removed:
            log.info("deleted unwanted weights {path}", path=path)
        return to_wire(result)

    def set_engines(self, plan):
        """A reload changed the catalog's engines: converge on the new plan."""
        try:
            decoded = from_wire(EnginePlan, plan)
        except WireError as e:
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, str(e)) from None
        self.agent.set_engine_plan(decoded)

    def cordon(self, cordoned):
        if not isinstance(cordoned, bool):
            raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, "cordon takes true or false")
        self.agent.set_cordoned(cordoned)
        return cordoned

    def onLeave(self, details):
        if self.agent.session is self:
            self.agent.session = None
        if self._beat is not None and self._beat.running:
            self._beat.stop()
        if details.reason not in ("wamp.close.normal", "wamp.close.goodbye_and_out"):
            log.warn("the hub ended the session: {reason} {message}", reason=details.reason, message=details.message or "")
        self.disconnect()
