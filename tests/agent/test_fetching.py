"""A shard that waits for its weights: the agent's half of the lifecycle, before the supervisor's.

The agent is real; the fetcher hands out Deferreds the test fires, and the
supervisor records what it was asked to start, with the lifecycle it was
handed.  Time is a ``Clock``, so every ``since`` is exact.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock

from llmgw.agent.ports import DEFAULT_RANGE
from llmgw.agent.service import Agent
from llmgw.config.agent import InstallLimits, WeightsLimits
from llmgw.huburl import HubAddress
from llmgw.records import ShardSpec, ShardStatus
from llmgw.states import ShardState

SOURCE = "https://models.example/tiny.gguf"


class Fetcher:
    def __init__(self):
        self.downloads: list[tuple[str, defer.Deferred]] = []

    def fetch(self, source, sha256=None, files=()):
        d = defer.Deferred()
        self.downloads.append((source, d))
        return d


class Supervisor:
    def __init__(self):
        self.started: list[tuple[ShardSpec, object, ShardState]] = []

    def start(self, spec, life=None):
        self.started.append((spec, life, life.state))
        return ShardStatus(spec=spec, state=life.wire_state)

    def statuses(self):
        return []


@pytest.fixture
def agent(tmp_path):
    config = SimpleNamespace(state_dir=str(tmp_path / "state"), weights_dirs=[str(tmp_path / "weights")],
                             labels={}, fabrics={}, installs=InstallLimits(), engine_port_range=DEFAULT_RANGE,
                             weights=WeightsLimits())
    clock = Clock()
    clock.advance(100)
    agent = Agent(clock, config, "node01", HubAddress("wss://127.0.0.1:1/ws", "127.0.0.1", 1))
    agent.fetcher, agent.supervisor = Fetcher(), Supervisor()
    agent.reports = []
    agent.report = agent.reports.append
    return agent


def spec(shard_id="tiny/0/0"):
    return ShardSpec(shard_id=shard_id, replica_id="tiny/0", model="tiny", engine="sim", source=SOURCE)


def test_a_shard_without_its_weights_is_fetching_and_asking_again_starts_no_second_fetch(agent):
    first = agent.start(spec())
    agent.reactor.advance(5)
    again = agent.start(spec())
    assert first == again == ShardStatus(spec=spec(), state=ShardState.FETCHING, since=100.0)
    assert agent.statuses() == [first]
    assert [source for source, _ in agent.fetcher.downloads] == [SOURCE]


def test_fetched_weights_hand_the_same_machine_on_to_the_supervisor_starting(agent):
    agent.start(spec())
    fetch = agent.fetching["tiny/0/0"]
    agent.fetcher.downloads[0][1].callback("/weights/tiny.gguf")
    ((started, life, state),) = agent.supervisor.started
    assert started == spec() and life is fetch.life and state == ShardState.STARTING
    assert agent.statuses() == [] and agent.reports == []


def test_a_failed_fetch_is_reported_failed_in_its_own_words(agent):
    agent.start(spec())
    agent.reactor.advance(7)
    agent.fetcher.downloads[0][1].errback(ValueError("sha256 mismatch"))
    assert agent.reports == [ShardStatus(spec=spec(), state=ShardState.FAILED,
                                         reason=f"fetching {SOURCE} failed: sha256 mismatch", output_tail=[],
                                         since=107.0)]
    assert agent.supervisor.started == [] and agent.statuses() == []


def test_a_shard_stopped_while_fetching_is_stopped_at_once_and_never_started(agent):
    agent.start(spec())
    agent.reactor.advance(3)
    stopped = agent.stop_fetching("tiny/0/0")
    assert stopped == ShardStatus(spec=spec(), state=ShardState.STOPPED, since=103.0)
    download = agent.fetcher.downloads[0][1]
    assert download.called  # cancelled
    assert agent.stop_fetching("tiny/0/0") is None
    assert agent.supervisor.started == [] and agent.reports == [] and agent.statuses() == []


def test_a_fetch_that_finishes_after_its_shard_was_stopped_starts_nothing(agent):
    agent.start(spec())
    download = agent.fetcher.downloads[0][1]
    # A download shared with other shards is not cancelled by this one's stop.
    download.cancel = lambda: None
    agent.stop_fetching("tiny/0/0")
    download.callback("/weights/tiny.gguf")
    assert agent.supervisor.started == [] and agent.reports == []
