"""The engines a node reports, in its own words, and the binary each shard runs on.

Three sources, and nothing else: what the node installed because the
control plane's plan names it (origin ``server.yaml``, the Installer's
entries), what agent.yaml's ``engines.NAME.path`` names (origin
``agent.yaml``, probed as given), and llmgw's own ``sim`` (origin
``builtin``).  Every other engine gets an ``absent`` entry saying why, so an
empty list never has to be read as "did not look".  Nothing is taken from
PATH or from the agent's own interpreter.
"""

from __future__ import annotations

from typing import Callable, Protocol

import attrs
from twisted.internet import threads
from twisted.logger import Logger

from llmgw.records import EngineInfo, EnginePlan, ShardSpec
from llmgw.states import EngineState

log = Logger()

SERVER_YAML = "server.yaml"
AGENT_YAML = "agent.yaml"
BUILTIN = "builtin"

# The engines a node can have from a plan or agent.yaml; sim is always there.
OPERATED = ("llama.cpp", "vllm", "sglang")


class Installs(Protocol):
    """What this module asks of ``llmgw.agent.engines.install.Installer``."""

    def entries(self) -> list[EngineInfo]: ...

    def binary(self, name: str, version: str | None) -> str | None: ...


class NodeEngines:
    """The node's engine list, recomputed whenever the plan, an install or a probe changes."""

    def __init__(self, config, installs: Installs, node_id: str):
        self.config = config
        self.installs = installs
        self.node_id = node_id
        # None: no plan yet, or (old_control_plane) none coming.
        self.plan: EnginePlan | None = None
        self.old_control_plane = False
        # agent.yaml's engines, probed; None until the first probe.
        self.overrides: dict[str, EngineInfo] | None = None

    def installable(self, plan: EnginePlan) -> EnginePlan:
        """*plan* without the engines agent.yaml names: the operator said which one to run."""
        return attrs.evolve(plan, builds=[b for b in plan.builds if self.config.engine_path(b.name) is None])

    async def probe_overrides(self) -> None:
        """Probe every engine agent.yaml names (in a thread)."""
        from llmgw.engines import adapter_for

        paths = {name: override.path for name, override in self.config.engines.items()}

        def probe_all():
            return {name: adapter_for(name).probe_detail(path) for name, path in paths.items()}

        results = await threads.deferToThread(probe_all)
        self.overrides = {name: self._override(name, paths[name], r) for name, r in sorted(results.items())}

    def _override(self, name: str, path: str, result) -> EngineInfo:
        if result.info is None:
            reason = (
                f"{result.reason}; it is engines.{name}.path in {self.config.path}: fix the path, "
                "or remove it to let the node install the catalog's build"
            )
            return EngineInfo(name, None, path, EngineState.BROKEN, reason, AGENT_YAML)
        return attrs.evolve(result.info, state=EngineState.INSTALLED, reason=result.reason, origin=AGENT_YAML)

    def entries(self) -> list[EngineInfo] | None:
        """Every engine build this node knows of; None until agent.yaml's engines were probed."""
        if self.overrides is None:
            return None
        from llmgw.engines import adapter_for

        named = list(self.overrides.values())
        named += [e for e in self.installs.entries() if e.name not in self.overrides]
        sim = adapter_for("sim").probe_detail(None).info
        found = [*named, attrs.evolve(sim, state=EngineState.INSTALLED, origin=BUILTIN)]
        have = {e.name for e in named}
        return found + [EngineInfo(n, state=EngineState.ABSENT, reason=self._absent(n)) for n in OPERATED if n not in have]

    def _absent(self, name: str) -> str:
        if self.old_control_plane:
            return "the control plane sends no engine plan (it is older than this agent), nor is it in agent.yaml"
        if self.plan is None:
            return "no engine plan from the control plane yet, nor in agent.yaml"
        return "not in the catalog's engines, nor in agent.yaml"

    def binary(self, spec: ShardSpec) -> str | None:
        """What runs *spec*: agent.yaml's engine first, else the installed build it names.

        None for sim, which runs in the agent's own Python; ``ValueError`` in
        the node's words when there is nothing to run.
        """
        if spec.engine == "sim":
            return None
        override = (self.overrides or {}).get(spec.engine)
        if override is not None:
            if override.state != EngineState.INSTALLED:
                raise ValueError(f"{self.node_id} cannot run {spec.engine}: {override.reason}")
            return override.path
        binary = self.installs.binary(spec.engine, spec.engine_version)
        if binary is not None:
            return binary
        build = " ".join(filter(None, (spec.engine, spec.engine_version)))
        entry = next((e for e in self.installs.entries() if e.name == spec.engine
                      and spec.engine_version in (None, e.version)), None)
        if entry is None:
            raise ValueError(f"{self.node_id} has no {build}: {self._absent(spec.engine)}")
        raise ValueError(f"{self.node_id} has no {build} to run yet: {in_words(entry)}")


def in_words(entry: EngineInfo) -> str:
    """``installing: downloading …`` / ``broken: needs libgomp.so.1 …``: the state, then the node's reason."""
    state = str(entry.state or EngineState.INSTALLED)
    return f"{state}: {entry.reason}" if entry.reason else state


def describe(entries: list[EngineInfo]) -> list[str]:
    """One line per entry for the agent's log: ``llama.cpp b6000 installed at /…/llama-server (server.yaml)``."""
    lines = []
    for e in entries:
        head = " ".join(filter(None, (e.name, e.version, in_words(e), e.path and f"at {e.path}")))
        lines.append(f"{head} ({e.origin})" if e.origin else head)
    return lines


def news(before: list[EngineInfo], after: list[EngineInfo]) -> list[EngineInfo]:
    """The entries of *after* worth a log line: new, or changed other than a download's progress."""

    def key(e: EngineInfo):
        return e.name, e.version, e.path, e.state, None if e.state == EngineState.INSTALLING else e.reason

    seen = {key(e) for e in before}
    return [e for e in after if key(e) not in seen]


def in_use(statuses, installed: Callable[[str], list[str]]) -> set[tuple[str, str]]:
    """(engine, version) of every build a shard here runs on.

    A shard started without an engine_version (by an older control plane)
    ran the newest build then; which one that was is not recorded, so every
    installed version of its engine is kept.
    """
    used: set[tuple[str, str]] = set()
    for status in statuses:
        spec = status.spec
        if spec.engine_version is not None:
            used.add((spec.engine, spec.engine_version))
        else:
            used.update((spec.engine, v) for v in installed(spec.engine))
    return used
