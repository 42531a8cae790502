"""A shard's download given up: the shard says why, and a download no shard waits for stops.

A mirror that trickles is held to agent.yaml's ``weights:`` limits
(tests/agent/weights/test_fetch_pace.py); here the shard waiting on it fails with
the node's own sentence: the URL, the rate measured, the key to change.

A catalog change stops the shards waiting on a download; the download
itself stops once none waits.

The control plane's answer to a model leaving the catalog (or its source
changing) is ``stop_shard`` for every shard of it, fetching or not.  Each
stop cancels that shard's wait; the agent here is real, with its real
Fetcher, downloading from a hub mirror on 127.0.0.1 that holds the file
part-way.  Before, the last stop left the download running for nobody,
holding its connection and its partial file's lock until the mirror let go.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from llmgw.agent.ports import DEFAULT_RANGE
from llmgw.agent.service import Agent
from llmgw.agent.weights import Fetcher, partial_name
from llmgw.config.agent import InstallLimits, WeightsLimits
from llmgw.huburl import HubAddress
from llmgw.records import ShardSpec
from llmgw.states import ShardState
from tests.agent.engines.test_install_pace import trickle
from tests.agent.test_fetching import Supervisor
from tests.support.wait import until
from tests.agent.weights.test_repository import WEIGHTS, hub  # noqa: F401 - the fixture, by name

HELD = "acme/tiny-llama/model.safetensors"


def node(tmp_path) -> Agent:
    config = SimpleNamespace(state_dir=str(tmp_path / "state"), weights_dirs=[str(tmp_path / "weights")], labels={},
                             fabrics={}, installs=InstallLimits(), engine_port_range=DEFAULT_RANGE, weights=WeightsLimits())
    agent = Agent(reactor, config, "node01", HubAddress("wss://127.0.0.1:1/ws", "127.0.0.1", 1))
    agent.supervisor = Supervisor()
    agent.reports = []
    agent.report = agent.reports.append
    return agent


def spec(shard_id: str, source: str) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id=shard_id.rsplit("/", 1)[0], model="tiny", engine="sim",
                     source=source)


@pytest_twisted.ensureDeferred
async def test_a_download_no_shard_waits_for_any_more_is_given_up_and_the_next_shard_resumes_it(tmp_path, hub):
    hub.hold(HELD, 100_000)
    weights = tmp_path / "weights"
    agent = node(tmp_path)
    source = f"{hub.url}/acme/tiny-llama/resolve/main/model.safetensors"
    partial = weights / partial_name(source)
    for shard in ("tiny/0/0", "tiny/1/0"):
        assert agent.start(spec(shard, source)).state == ShardState.FETCHING
    await until(lambda: partial.exists() and partial.stat().st_size > 0, "the download to write its first bytes")
    agent.stop_fetching("tiny/0/0")
    assert agent.fetcher.in_flight() == {source}  # the other shard still waits
    agent.stop_fetching("tiny/1/0")
    assert agent.fetcher.in_flight() == frozenset()
    kept = partial.stat().st_size
    # A shard of the next catalog wanting the same file resumes where that one stopped.
    hub.release(HELD)
    agent.start(spec("tiny/2/0", source))
    await until(lambda: agent.supervisor.started, "the shard's weights to arrive")
    ((started, _, _),) = agent.supervisor.started
    assert started.shard_id == "tiny/2/0"
    assert hub.seen(HELD)[-1]["range"] == f"bytes={kept}-"
    assert (weights / partial_name(source).removesuffix(".partial")).read_bytes() == WEIGHTS


@pytest_twisted.ensureDeferred
async def test_a_shard_waiting_on_a_trickle_fails_saying_the_url_the_rate_and_the_key(tmp_path, hub):
    hub.hold(HELD, 100_000)
    agent = node(tmp_path)
    clock, seen = Clock(), []

    def progress(report):
        seen.append(report)
        agent.report_progress(report)

    # The agent's own fetcher, on a clock the test drives, held to a floor a byte every 20 s is under.
    agent.fetcher = Fetcher(reactor, agent.cache_dir, clock=clock, progress=progress,
                            pace=WeightsLimits(min_rate_bytes_per_s=100, rate_window_s=60))
    source = f"{hub.url}/acme/tiny-llama/resolve/main/model.safetensors"
    agent.start(spec("tiny/0/0", source))
    await until(lambda: hub.reached(HELD), "the download to reach the stop")
    gate = SimpleNamespace(let=lambda n: hub.let(HELD, n))
    fetching = agent.fetching["tiny/0/0"].download
    await trickle(SimpleNamespace(reports=seen, entries=lambda: seen[-2:]), gate, clock, fetching, size=1,
                  every_s=20, steps=30)
    ((failed,),) = [agent.reports]
    assert failed.state == ShardState.FAILED and failed.spec.shard_id == "tiny/0/0"
    assert failed.reason.startswith(f"fetching {source} failed: {source}: ")
    assert " bytes/s over the last 6" in failed.reason
    assert "under the minimum of 100.0 bytes/s (min_rate_bytes_per_s of agent.yaml's weights)" in failed.reason
    assert (tmp_path / "weights" / partial_name(source)).stat().st_size > 100_000
