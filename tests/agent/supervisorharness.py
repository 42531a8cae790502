"""What the supervisor's tests share: real engine stand-ins on 127.0.0.1, and a harness that cleans up after them.

A test module takes the ``harness`` fixture by importing it by name.

Every engine a test starts carries the state directory in its environment;
teardown finds them that way (with psutil, not with the code under test) and
kills their groups, so a failing test leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest_twisted
from twisted.internet import reactor

from llmgw.agent.supervisor import Supervisor
from llmgw.engines.base import HealthProbe, LaunchPlan
from llmgw.records import ShardSpec
from tests.support.procs import alive
from tests.support.wait import until

STANDIN = Path(__file__).with_name("standin_engine.py")
WORKER = "--worker"  # in a spec's args: plan the rank with no health probe


def plan_standin(spec: ShardSpec, port: int) -> LaunchPlan:
    args = [a for a in spec.args if a != WORKER]
    health = None if WORKER in spec.args else HealthProbe("/health")
    return LaunchPlan(argv=[sys.executable, str(STANDIN), "--port", str(port), *args],
                      env={"STANDIN_SHARD": spec.shard_id}, health=health)


def make_spec(shard_id: str = "tiny/0/0", *args: str, start_timeout_s: float = 20.0, **kw) -> ShardSpec:
    model, replica = shard_id.split("/")[0], "/".join(shard_id.split("/")[:2])
    return ShardSpec(shard_id=shard_id, replica_id=replica, model=model, engine="standin",
                     args=list(args), start_timeout_s=start_timeout_s, **kw)


def engines_of(state_dir: Path) -> list[psutil.Process]:
    """Live processes started by a supervisor on *state_dir*."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("LLMGW_AGENT_STATE_DIR") == str(state_dir.resolve()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


class Reports(list):
    """Every ShardStatus a supervisor reported, in order."""

    def states(self, shard_id: str | None = None) -> list[str]:
        return [s.state for s in self if shard_id is None or s.spec.shard_id == shard_id]

    async def reach(self, state: str, shard_id: str | None = None, timeout: float = 15.0):
        def last():
            for s in self:
                if s.state == state and (shard_id is None or s.spec.shard_id == shard_id):
                    return s
            return None

        return await until(last, f"a report of {state!r}", timeout,
                           detail=lambda: f"reported so far: {self.states(shard_id)}")


class Harness:
    def __init__(self, root: Path):
        self.state_dir = root / "state"
        self.reports = Reports()
        self.supervisors: list[Supervisor] = []
        self.strays: list[int] = []

    def supervisor(self, reports: Reports | None = None, **kw) -> Supervisor:
        planner = kw.pop("planner", plan_standin)
        options = dict(poll_interval=0.05, health_interval=0.05, stop_grace_s=2, probe_timeout_s=1.0)
        options.update(kw)
        sup = Supervisor(reactor, self.state_dir, planner,
                         (self.reports if reports is None else reports).append, **options)
        self.supervisors.append(sup)
        return sup

    def engines(self) -> list[psutil.Process]:
        return engines_of(self.state_dir)

    async def teardown(self) -> None:
        for sup in self.supervisors:
            sup.close()
        for proc in self.engines():
            for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
                try:
                    kill()
                except OSError:
                    pass
        for pid in self.strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        await until(lambda: not self.engines() and not any(alive(p) for p in self.strays),
                    "every process the test started is gone", timeout=10)


@pytest_twisted.async_yield_fixture
async def harness(tmp_path):
    """A Harness that kills whatever the test started."""
    h = Harness(tmp_path)
    yield h
    await h.teardown()
