"""Deadlines follow the injected clock, to the tick: a real process, a fake clock.

The process is real (signals must really land), started in a session of its
own as the launcher would; time is ``twisted.internet.task.Clock``, so a test
of a ten-second grace period takes no ten seconds and cannot be early or late.
"""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
from twisted.internet import task

from llmgw.agent.logtail import LogFollower
from llmgw.agent.shard import ChildProtocol, Context, ShardRunner
from llmgw.agent.statefiles import Record, StateDir, safe_name
from tests.support.wait import wait_for

from .supervisorharness import make_spec


class NeverHealthy:
    async def ok(self, url):
        return False


@pytest.fixture
def process():
    """A process leading its own group that ignores SIGTERM, as a stubborn engine would."""
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
                             "time.sleep(60)"], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    yield proc
    proc.kill()
    proc.wait()


def shard_for(tmp_path, proc, *, adopted: bool, health: str | None = "/health", timeout: float = 5.0):
    clock = task.Clock()
    files = StateDir(tmp_path / "state")
    reports = []
    spec = make_spec("tiny/0/0", start_timeout_s=timeout)
    record = Record(pid=proc.pid, pgid=proc.pid, create_time=psutil.Process(proc.pid).create_time(), spec=spec,
                    endpoint="http://127.0.0.1:1", host="127.0.0.1", port=1, health=health, started_at=0.0,
                    log=safe_name(spec.shard_id) + ".log", run="feedfacefeedface")
    files.write(record)
    ctx = Context(clock=clock, files=files, probe=NeverHealthy(), report=reports.append, poll_interval=1.0,
                  health_interval=1.0, stop_grace_s=10.0, kill_wait_s=5.0, failure_tail_lines=50)
    follower = LogFollower(files.log_path(spec.shard_id), keep=10)
    shard = ShardRunner(ctx, record, follower, child=None if adopted else ChildProtocol())
    return shard, clock, reports, files


def wait_dead(proc):
    proc.wait(timeout=5)


def test_the_start_timeout_fires_at_the_deadline_and_not_before(tmp_path, process):
    shard, clock, reports, files = shard_for(tmp_path, process, adopted=False)
    shard.begin()
    clock.pump([1.0] * 4 + [0.5])
    assert [r.state for r in reports] == ["starting"]
    clock.advance(0.5)
    assert [r.state for r in reports] == ["starting", "failed"]
    assert reports[-1].reason == "did not become healthy within 5 s" and reports[-1].since == 5.0
    wait_dead(process)
    assert process.returncode == -9
    assert not files.record_path("tiny/0/0").exists()


def test_a_worker_rank_is_ready_after_one_poll_interval(tmp_path, process):
    shard, clock, reports, _ = shard_for(tmp_path, process, adopted=True, health=None)
    shard.begin()
    clock.advance(0.5)
    assert [r.state for r in reports] == ["starting"]
    clock.advance(0.5)
    assert [r.state for r in reports] == ["starting", "ready"] and reports[-1].adopted is True
    # Ready is final for the timer: the start timeout no longer applies.
    clock.pump([1.0] * 10)
    assert [r.state for r in reports] == ["starting", "ready"]
    shard.close()


def test_stop_waits_the_grace_period_then_kills_the_group(tmp_path, process):
    shard, clock, reports, files = shard_for(tmp_path, process, adopted=True, health=None)
    shard.begin()
    clock.advance(1.0)
    stopped = shard.stop()
    results = []
    stopped.addCallback(results.append)
    clock.advance(9.0)
    assert process.poll() is None and results == []
    assert [r.state for r in reports] == ["starting", "ready", "draining"]
    clock.advance(1.0)  # 10 s after SIGTERM: SIGKILL
    wait_for(lambda: psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE, 5, "SIGKILL to land",
             interval=0.01)
    clock.advance(0.1)
    assert [r.state for r in reports] == ["starting", "ready", "draining", "stopped"]
    assert results[0].reason == "stopped; SIGKILL after 10 s"
    assert not files.record_path("tiny/0/0").exists()
