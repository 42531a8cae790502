"""A model the operator put on the node as a path is reported as held, in a weights dir or not."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.task import Clock

from llmgw.agent.ports import DEFAULT_RANGE
from llmgw.agent.service import Agent, local_files
from llmgw.config.agent import InstallLimits, WeightsLimits
from llmgw.huburl import HubAddress
from llmgw.records import ShardSpec, ShardStatus, WeightsFile
from llmgw.states import ShardState


def spec(shard_id: str, source: str | None) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id=shard_id.rsplit("/", 1)[0], model="m", engine="llama.cpp",
                     source=source)


def test_the_local_sources_of_running_shards_are_reported_with_their_sizes(tmp_path):
    local = tmp_path / "elsewhere" / "gemma.gguf"
    local.parent.mkdir()
    local.write_bytes(b"x" * 1234)
    config = SimpleNamespace(state_dir=str(tmp_path / "state"), weights_dirs=[str(tmp_path / "weights")],
                             labels={}, fabrics={}, installs=InstallLimits(), engine_port_range=DEFAULT_RANGE,
                             weights=WeightsLimits())
    agent = Agent(Clock(), config, "node01", HubAddress("wss://127.0.0.1:1/ws", "127.0.0.1", 1))
    running = [spec("a/0/0", str(local)), spec("b/0/0", "https://models.example/b.gguf"), spec("c/0/0", None),
               spec("d/0/0", str(tmp_path / "missing.gguf"))]
    agent.supervisor = SimpleNamespace(statuses=lambda: [ShardStatus(spec=s, state=ShardState.READY) for s in running])

    paths = agent.local_sources()
    assert paths == [str(local), str(tmp_path / "missing.gguf")]
    assert local_files(paths, set()) == [WeightsFile(path=str(local), size_bytes=1234)]
    assert local_files(paths, {str(local)}) == []  # the scan of a weights dir listed it already
