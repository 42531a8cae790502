"""agent.yaml's engines key: the agent runs the llama-server the operator built, or says why it cannot.

The agent and its probe are real; the engine is a script that answers
``--version`` as llama-server does.
"""

from __future__ import annotations

import pytest_twisted
import pytest
from twisted.internet.task import Clock

from llmgw.agent.service import Agent
from llmgw.config import load_agent_config
from llmgw.huburl import HubAddress
from llmgw.records import EngineInfo

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
    on_path = executable(tmp_path / "path" / "llama-server", VERSION.replace("6000", "5000"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'path'}:/usr/bin:/bin")

    def make(extra: str) -> Agent:
        config_file = tmp_path / "agent.yaml"
        config_file.write_text(
            'hub: "wss://127.0.0.1:1/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
            f"state_dir: {tmp_path / 'state'}\nweights_dirs: [{tmp_path / 'weights'}]\n{extra}"
        )
        agent = Agent(Clock(), load_agent_config(config_file), "node01", HubAddress("wss://127.0.0.1:1/", "127.0.0.1", 1))
        agent.on_path = on_path
        return agent

    return make


def llama(agent):
    return [e for e in agent.engines if e.name == "llama.cpp"]


@pytest_twisted.ensureDeferred
async def test_without_the_key_llama_server_is_found_on_path(make_agent):
    agent = make_agent("")
    await agent.probe_engines()
    assert llama(agent) == [EngineInfo("llama.cpp", "b5000", agent.on_path)]


@pytest_twisted.ensureDeferred
async def test_the_configured_llama_server_wins_over_the_one_on_path(make_agent, tmp_path):
    built = executable(tmp_path / "opt" / "llama.cpp" / "build" / "bin" / "llama-server", VERSION)
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {built}}}\n")
    await agent.probe_engines()
    assert llama(agent) == [EngineInfo("llama.cpp", "b6000", built)]
    assert "llama.cpp" not in agent.engine_reasons


@pytest_twisted.ensureDeferred
async def test_a_configured_path_that_does_not_exist_is_reported_and_path_is_not_tried(make_agent, tmp_path):
    missing = tmp_path / "opt" / "llama-server"
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {missing}}}\n")
    await agent.probe_engines()
    assert llama(agent) == []
    assert agent.engine_reasons["llama.cpp"] == (
        f"{missing} does not exist; it is engines.llama.cpp.path in {tmp_path / 'agent.yaml'}: "
        "fix the path, or remove it to look on PATH"
    )


@pytest_twisted.ensureDeferred
async def test_a_configured_binary_that_does_not_run_is_reported_in_its_own_words(make_agent, tmp_path):
    broken = executable(tmp_path / "opt" / "llama-server", '#!/bin/sh\necho "Illegal instruction" >&2\nexit 132\n')
    agent = make_agent(f"engines:\n  llama.cpp: {{path: {broken}}}\n")
    await agent.probe_engines()
    assert llama(agent) == []
    reason = agent.engine_reasons["llama.cpp"]
    assert reason.startswith(f"{broken} --version exited with status 132: Illegal instruction; "
                             "it is engines.llama.cpp.path in ")
