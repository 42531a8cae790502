"""The control plane's engine plan, as the agent takes it and reports back what its node has.

The agent is real and so is its session object (no hub: its procedures are
called as the hub would call them); the Installer is a stand-in showing the
entries the test gives it.  Its own tests are in tests/agent/engines.
"""

from __future__ import annotations

import sys

import llmgw
import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import ComponentConfig
from twisted.internet.task import Clock

from llmgw.agent.service import Agent, AgentSession
from llmgw.config import load_agent_config
from llmgw.huburl import HubAddress
from llmgw.link import uris
from llmgw.records import EngineBuild, EngineInfo, EnginePlan, ShardSpec, ShardStatus
from llmgw.states import EngineState, ShardState
from llmgw.wire import to_wire

from .installs import StandInInstaller

LLAMA = EngineBuild("llama.cpp", "b6000", "http://127.0.0.1:1/", {"llama-b6000-bin-ubuntu-x64.zip": "ab" * 32})
VLLM = EngineBuild("vllm", pip="vllm==0.11.0")
SIM = EngineInfo("sim", llmgw.__version__, sys.executable, EngineState.INSTALLED, None, "builtin")
NOT_NAMED = "not in the catalog's engines, nor in agent.yaml"


@pytest.fixture
def make_agent(tmp_path):
    for name in ("ca.crt", "node.crt", "node.key"):
        (tmp_path / name).write_text("")

    def make(extra: str = "") -> Agent:
        (tmp_path / "agent.yaml").write_text(
            'hub: "wss://127.0.0.1:1/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
            f"state_dir: {tmp_path / 'state'}\nweights_dirs: [{tmp_path / 'weights'}]\n{extra}"
        )
        config = load_agent_config(tmp_path / "agent.yaml")
        return Agent(Clock(), config, "node01", HubAddress("wss://127.0.0.1:1/", "127.0.0.1", 1),
                     platform="linux x86_64", installer=StandInInstaller)

    return make


def session(agent: Agent) -> AgentSession:
    return AgentSession(ComponentConfig("llmgw"), agent)


def installing(version="b6000", reason="downloading llama-b6000-bin-ubuntu-x64.zip 12/16 MB"):
    return EngineInfo("llama.cpp", version, None, EngineState.INSTALLING, reason, "server.yaml")


def installed(version="b6000", path="/state/engines/llama.cpp/b6000/llama-server"):
    return EngineInfo("llama.cpp", version, path, EngineState.INSTALLED, None, "server.yaml")


def gemma(tmp_path, version="b6000") -> ShardSpec:
    model = tmp_path / "gemma.gguf"
    model.write_bytes(b"GGUF")
    return ShardSpec(shard_id="gemma/0/0", replica_id="gemma/0", model="gemma", engine="llama.cpp",
                     source=str(model), engine_version=version)


def test_the_installer_lives_under_the_state_dir_for_this_nodes_platform(make_agent, tmp_path):
    agent = make_agent()
    assert agent.installer.root == tmp_path / "state" / "engines"
    assert agent.installer.platform == "linux x86_64"
    # Engine downloads travel the weights' progress path.
    assert agent.installer.progress == agent.report_progress


@pytest_twisted.ensureDeferred
async def test_the_register_answers_plan_is_installed_and_the_node_says_what_it_has(make_agent):
    agent = make_agent()
    await agent.probe_engines()
    session(agent)._plan_from({"node_id": "node01", "engines": to_wire(EnginePlan([LLAMA, VLLM]))})
    [(plan, _)] = agent.installer.converged
    assert plan == EnginePlan([LLAMA, VLLM])
    agent.installer.show(installing())
    assert agent.engines == [
        installing(),
        SIM,
        EngineInfo("vllm", state=EngineState.ABSENT, reason=NOT_NAMED),
        EngineInfo("sglang", state=EngineState.ABSENT, reason=NOT_NAMED),
    ]


@pytest_twisted.ensureDeferred
async def test_a_control_plane_older_than_installs_means_no_plan(make_agent):
    agent = make_agent()
    await agent.probe_engines()
    session(agent)._plan_from({"node_id": "node01"})
    assert agent.installer.converged == []
    assert agent.engines[0] == SIM
    assert {e.name: e.reason for e in agent.engines[1:]} == dict.fromkeys(
        ("llama.cpp", "vllm", "sglang"),
        "the control plane sends no engine plan (it is older than this agent), nor is it in agent.yaml",
    )


@pytest_twisted.ensureDeferred
async def test_an_engine_agent_yaml_names_is_not_installed_from_the_plan(make_agent, tmp_path):
    python = tmp_path / "opt" / "vllm" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "0.10.2"\n')
    python.chmod(0o755)
    agent = make_agent(f"engines:\n  vllm: {{path: {python}}}\n")
    await agent.probe_engines()
    agent.set_engine_plan(EnginePlan([LLAMA, VLLM], install_os_packages=True))
    [(plan, _)] = agent.installer.converged
    assert plan == EnginePlan([LLAMA], install_os_packages=True)
    assert EngineInfo("vllm", "0.10.2", str(python), EngineState.INSTALLED, None, "agent.yaml") in agent.engines


@pytest_twisted.ensureDeferred
async def test_a_shard_runs_on_the_build_its_spec_names_or_is_refused_in_the_nodes_words(make_agent, tmp_path):
    agent = make_agent()
    await agent.probe_engines()
    agent.set_engine_plan(EnginePlan([LLAMA]))
    agent.installer.show(installing())
    with pytest.raises(ValueError) as refused:
        agent.plan(gemma(tmp_path), 8100)
    assert str(refused.value) == (
        "node01 has no llama.cpp b6000 to run yet: installing: downloading llama-b6000-bin-ubuntu-x64.zip 12/16 MB"
    )
    broken = EngineInfo("llama.cpp", "b6000", None, EngineState.BROKEN,
                        "needs libgomp.so.1, which this node does not have: apt-get install libgomp1", "server.yaml")
    agent.installer.show(broken)
    with pytest.raises(ValueError, match="to run yet: broken: needs libgomp.so.1, which this node does not have"):
        agent.plan(gemma(tmp_path), 8100)
    # The new build installs beside the old; each shard runs the one its spec names.
    agent.installer.show(installed("b5000", "/e/b5000/llama-server"), installing("b6000"),
                         binaries={("llama.cpp", "b5000"): "/e/b5000/llama-server"})
    assert agent.plan(gemma(tmp_path, "b5000"), 8100).argv[0] == "/e/b5000/llama-server"
    with pytest.raises(ValueError, match="installing: downloading"):
        agent.plan(gemma(tmp_path, "b6000"), 8100)


@pytest_twisted.ensureDeferred
async def test_what_changed_goes_in_the_next_heartbeat_once(make_agent):
    agent = make_agent()
    await agent.probe_engines()
    assert agent.engines_to_send() == agent.engines
    assert agent.engines_to_send() is None
    agent.set_engine_plan(EnginePlan([LLAMA]))
    agent.installer.show(installing())
    assert agent.engines_to_send()[0] == installing()
    agent.installer.show(installing())
    assert agent.engines_to_send() is None
    agent.installer.show(installing(reason="downloading llama-b6000-bin-ubuntu-x64.zip 14/16 MB"))
    assert agent.engines_to_send()[0].reason.endswith("14/16 MB")
    agent.installer.show(installed())
    assert agent.engines_to_send()[0] == installed()


@pytest_twisted.ensureDeferred
async def test_builds_running_shards_use_are_in_use(make_agent, tmp_path):
    agent = make_agent()
    await agent.probe_engines()
    running = [gemma(tmp_path, "b5000"), ShardSpec(shard_id="old/0/0", replica_id="old/0", model="old",
                                                 engine="llama.cpp", source="/m")]
    agent.supervisor.statuses = lambda: [ShardStatus(spec=s, state=ShardState.READY) for s in running]
    agent.installer.show(installed("b4000"), installed("b5000"), installing("b6000"))
    agent.set_engine_plan(EnginePlan([LLAMA]))
    [(_, in_use)] = agent.installer.converged
    # The shard from an older control plane named no version: every installed one stays.
    assert in_use() == {("llama.cpp", "b4000"), ("llama.cpp", "b5000")}


def test_set_engines_converges_on_the_reloaded_plan(make_agent):
    agent = make_agent()
    session(agent).set_engines(to_wire(EnginePlan([LLAMA])))
    assert [plan for plan, _ in agent.installer.converged] == [EnginePlan([LLAMA])]


@pytest.mark.parametrize("payload", [None, "b6000", {"builds": "llama.cpp"}, {"builds": [{"version": "b6000"}]}])
def test_set_engines_refuses_what_is_not_a_plan(make_agent, payload):
    agent = make_agent()
    with pytest.raises(ApplicationError) as refused:
        session(agent).set_engines(payload)
    assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
    assert agent.installer.converged == []


def test_the_log_says_each_change_once_and_not_every_tick_of_a_download():
    from llmgw.agent.enginelist import describe, news

    ticking = [installing(reason="downloading llama-b6000-bin-ubuntu-x64.zip 1/16 MB")]
    assert news(ticking, [installing()]) == []
    assert describe(news(ticking, [installed()])) == [
        "llama.cpp b6000 installed at /state/engines/llama.cpp/b6000/llama-server (server.yaml)"
    ]
    assert describe(news([], ticking)) == [
        "llama.cpp b6000 installing: downloading llama-b6000-bin-ubuntu-x64.zip 1/16 MB (server.yaml)"
    ]
