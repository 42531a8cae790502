"""vLLM by pip:, end to end at the agent: the node builds a venv from a local index and runs vLLM from it.

The agent and its Installer are real; the index is a directory of wheels
made at test time (tests/support/engine_archives.py), holding a stand-in
``vllm`` package whose ``__version__`` is all it has.  The real vLLM comes
with the multi-node work.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from llmgw.agent.service import Agent
from llmgw.config import load_agent_config
from llmgw.huburl import HubAddress
from llmgw.records import EngineBuild, EnginePlan, ShardSpec
from llmgw.states import EngineState
from tests.support.engine_archives import simple_index, stand_in_wheel


@pytest.fixture
def agent(tmp_path):
    for name in ("ca.crt", "node.crt", "node.key"):
        (tmp_path / name).write_text("")
    (tmp_path / "agent.yaml").write_text(
        'hub: "wss://127.0.0.1:1/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
        f"state_dir: {tmp_path / 'state'}\nweights_dirs: [{tmp_path / 'weights'}]\n"
    )
    made = Agent(reactor, load_agent_config(tmp_path / "agent.yaml"), "node01",
                 HubAddress("wss://127.0.0.1:1/", "127.0.0.1", 1))
    made.installer.start()
    yield made
    made.installer.stop()


@pytest_twisted.ensureDeferred
async def test_a_pip_engine_is_installed_into_the_state_dir_and_runs_shards_from_its_venv(agent, tmp_path):
    index = simple_index(tmp_path / "index", [stand_in_wheel(tmp_path / "wheels", "vllm", "0.11.0")])
    await agent.probe_engines()
    await agent.set_engine_plan(EnginePlan([EngineBuild("vllm", pip="vllm==0.11.0", index_url=index)]))

    [vllm] = [e for e in agent.engines if e.name == "vllm"]
    assert (vllm.version, vllm.state, vllm.origin) == ("0.11.0", EngineState.INSTALLED, "server.yaml"), vllm
    assert vllm.path.startswith(str(tmp_path / "state" / "engines" / "vllm" / ""))
    model = tmp_path / "weights" / "qwen"
    model.mkdir(parents=True)
    # server.yaml gave no version: the spec names none, and the installed build runs it.
    spec = ShardSpec(shard_id="qwen/0/0", replica_id="qwen/0", model="qwen", engine="vllm", source=str(model))
    assert agent.plan(spec, 8200).argv[:5] == [vllm.path, "-m", "vllm.entrypoints.openai.api_server",
                                               "--model", str(model)]
