"""agent.yaml's engines key: the agent runs the llama-server the operator built, or says why it cannot.

The agent and its probe are real; the engine is a script that answers
``--version`` as llama-server does, and PATH holds another one that must
never be taken.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from llmgw.agent.service import Agent
from llmgw.config import load_agent_config
from llmgw.huburl import HubAddress
from llmgw.records import EngineInfo, ShardSpec
from llmgw.states import EngineState

from .installs import StandInInstaller

VERSION = '#!/bin/sh\necho "version: 0.6.0 (build 6000, commit abc1234)" >&2\n'


def executable(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def make_agent(tmp_path, monkeypatch):
    """An agent whose agent.yaml ends with *extra*, with a PATH holding another llama-server."""
    for name in ("ca.crt", "node.crt", "node.key"):
        (tmp_path / name).write_text("")
    executable(tmp_path / "path" / "llama-server", VERSION.replace("6000", "5000"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'path'}:/usr/bin:/bin")

    def make(extra: str) -> Agent:
        config_file = tmp_path / "agent.yaml"
        config_file.write_text(
            'hub: "wss://127.0.0.1:1/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
            f"state_dir: {tmp_path / 'state'}\nweights_dirs: [{tmp_path / 'weights'}]\n{extra}"
        )
        return Agent(Clock(), load_agent_config(config_file), "node01", HubAddress("wss://127.0.0.1:1/", "127.0.0.1", 1),
                     platform=object(), installer=StandInInstaller)

    return make


def llama(agent):
    return [e for e in agent.engines if e.name == "llama.cpp"]


def gemma(tmp_path) -> ShardSpec:
    model = tmp_path / "gemma.gguf"
    model.write_bytes(b"GGUF")
    return ShardSpec(shard_id="gemma/0/0", replica_id="gemma/0", model="gemma", engine="llama.cpp",
                     source=str(model), engine_version="b6000")


@pytest_twisted.ensureDeferred
async def test_without_the_key_or_a_plan_llama_server_on_path_is_not_taken(make_agent, tmp_path):
    agent = make_agent("")
    await agent.probe_engines()
    assert llama(agent) == [EngineInfo("llama.cpp", state=EngineState.ABSENT,
                                       reason="no engine plan from the control plane yet, nor in agent.yaml")]
    with pytest.raises(ValueError, match="^node01 has no llama.cpp b6000: no engine plan from the control plane yet"):
        agent.plan(gemma(tmp_path), 8100)


@pytest_twisted.ensureDeferred
async def test_the_configured_llama_server_is_reported_as_agent_yamls_and_runs_the_shard(make_agent, tmp_path):
    built = executable(tmp_path / "opt" / "llama.cpp" / "build" / "bin" / "llama-server", VERSION)
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {built}}}\n")
    await agent.probe_engines()
    assert llama(agent) == [EngineInfo("llama.cpp", "b6000", built, EngineState.INSTALLED, None, "agent.yaml")]
    assert agent.plan(gemma(tmp_path), 8100).argv[0] == built


@pytest_twisted.ensureDeferred
async def test_a_configured_path_that_does_not_exist_is_reported_broken_and_path_is_not_tried(make_agent, tmp_path):
    missing = tmp_path / "opt" / "llama-server"
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {missing}}}\n")
    await agent.probe_engines()
    reason = (
        f"{missing} does not exist; it is engines.llama.cpp.path in {tmp_path / 'agent.yaml'}: "
        "fix the path, or remove it to let the node install the catalog's build"
    )
    assert llama(agent) == [EngineInfo("llama.cpp", None, str(missing), EngineState.BROKEN, reason, "agent.yaml")]
    with pytest.raises(ValueError) as refused:
        agent.plan(gemma(tmp_path), 8100)
    assert str(refused.value) == f"node01 cannot run llama.cpp: {reason}"


@pytest_twisted.ensureDeferred
async def test_a_configured_binary_that_does_not_run_is_reported_in_its_own_words(make_agent, tmp_path):
    broken = executable(tmp_path / "opt" / "llama-server", '#!/bin/sh\necho "Illegal instruction" >&2\nexit 132\n')
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {broken}}}\n")
    await agent.probe_engines()
    [entry] = llama(agent)
    assert entry.state == EngineState.BROKEN
    assert entry.reason.startswith(f"{broken} --version exited with status 132: Illegal instruction; "
                                   "it is engines.llama.cpp.path in ")


@pytest_twisted.ensureDeferred
async def test_a_fixed_binary_is_seen_at_the_next_probe(make_agent, tmp_path):
    path = tmp_path / "opt" / "llama-server"
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {path}}}\n")
    await agent.probe_engines()
    assert llama(agent)[0].state == EngineState.BROKEN
    executable(path, VERSION)
    assert await agent.probe_engines() is True
    assert llama(agent)[0].state == EngineState.INSTALLED
    assert await agent.probe_engines() is False


@pytest_twisted.ensureDeferred
async def test_an_sglang_the_agents_own_python_imports_is_never_run(make_agent, tmp_path, monkeypatch):
    # An sglang importable here, in the agent's interpreter: the node still has none.
    (tmp_path / "site" / "sglang").mkdir(parents=True)
    (tmp_path / "site" / "sglang" / "__init__.py").write_text('__version__ = "0.5.2"\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    __import__("sglang")
    agent = make_agent("")
    await agent.probe_engines()
    assert [e for e in agent.engines if e.name == "sglang"] == [EngineInfo(
        "sglang", state=EngineState.ABSENT, reason="no engine plan from the control plane yet, nor in agent.yaml")]
    (tmp_path / "qwen").mkdir()
    spec = ShardSpec(shard_id="qwen/0/0", replica_id="qwen/0", model="qwen", engine="sglang",
                     source=str(tmp_path / "qwen"))
    with pytest.raises(ValueError, match="^node01 has no sglang: no engine plan from the control plane yet"):
        agent.plan(spec, 8100)


@pytest_twisted.ensureDeferred
async def test_the_sglang_agent_yaml_names_is_what_runs(make_agent, tmp_path):
    python = executable(tmp_path / "sglang-env" / "bin" / "python", '#!/bin/sh\necho "0.5.2"\n')
    agent = make_agent(f"engines:\n  sglang: {{path: {python}}}\n")
    await agent.probe_engines()
    assert [(e.path, e.state) for e in agent.engines if e.name == "sglang"] == [(python, EngineState.INSTALLED)]
    (tmp_path / "qwen").mkdir()
    spec = ShardSpec(shard_id="qwen/0/0", replica_id="qwen/0", model="qwen", engine="sglang",
                     source=str(tmp_path / "qwen"))
    assert agent.plan(spec, 8100).argv[:3] == [python, "-m", "sglang.launch_server"]
