"""A restarted agent takes over the engines its predecessor left, and only those."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest_twisted
from twisted.internet import defer, protocol, reactor

import llmgw
from llmgw.agent.statefiles import safe_name
from tests.support.procs import alive
from tests.support.wait import until

from .supervisorharness import WORKER, Reports, harness, make_spec  # noqa: F401 - the fixture, by name

HERE = Path(__file__).parent


def engine_running(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid and any("standin_engine" in a for a in psutil.Process(pid).cmdline())
    except (OSError, psutil.Error):
        return False


def record_path(harness, shard_id: str) -> Path:
    return harness.state_dir / "shards" / (safe_name(shard_id) + ".json")


async def started_then_abandoned(harness, *args: str, shard_id: str = "tiny/0/0", wait: str = "ready"):
    """Supervisor A starts an engine and then goes away without stopping it."""
    reports = Reports()
    a = harness.supervisor(reports=reports)
    status = a.start(make_spec(shard_id, *args))
    if wait:
        await reports.reach(wait)
    else:
        # An agent dies long after the launcher's setsid(); a test must wait for it.
        await until(lambda: engine_running(status.pid), "the engine runs in its own group")
    a.close()
    return status


@pytest_twisted.ensureDeferred
async def test_a_restarted_agent_adopts_the_engine_its_predecessor_left_running(harness):
    left = await started_then_abandoned(harness, "--lines", "3")
    assert alive(left.pid)

    b = harness.supervisor()
    adopted = b.adopt_all()

    assert [s.pid for s in adopted] == [left.pid] and adopted[0].adopted is True
    assert adopted[0].spec == make_spec("tiny/0/0", "--lines", "3")
    ready = await harness.reports.reach("ready")
    assert ready.pid == left.pid and ready.endpoint == left.endpoint and ready.adopted is True
    assert harness.reports.states() == ["starting", "ready"]
    assert [p.pid for p in harness.engines()] == [left.pid]
    assert b.start(make_spec("tiny/0/0", "--lines", "3")).pid == left.pid
    assert [s.pid for s in b.statuses()] == [left.pid]

    tail = b.tail("tiny/0/0")
    assert "standin line 2" in tail
    assert "adopted by a restarted agent" in tail[-1]

    final = await b.stop("tiny/0/0")
    assert final.state == "stopped"
    assert not alive(left.pid)
    assert not record_path(harness, "tiny/0/0").exists()


@pytest_twisted.ensureDeferred
async def test_an_adopted_engine_that_ignores_sigterm_is_still_killed(harness):
    left = await started_then_abandoned(harness, "--ignore-term")
    b = harness.supervisor(stop_grace_s=0.5)
    b.adopt_all()
    await harness.reports.reach("ready")
    final = await b.stop("tiny/0/0")
    assert final.state == "stopped" and final.reason == "stopped; SIGKILL after 0.5 s"
    assert not alive(left.pid)


@pytest_twisted.ensureDeferred
async def test_an_adopted_engine_still_loading_is_health_checked_to_ready(harness):
    left = await started_then_abandoned(harness, "--healthy-after", "1.0", wait="")
    b = harness.supervisor()
    b.adopt_all()
    ready = await harness.reports.reach("ready")
    assert ready.pid == left.pid
    assert harness.reports.states() == ["starting", "ready"]


@pytest_twisted.ensureDeferred
async def test_an_adopted_engine_that_dies_is_reported_failed(harness):
    left = await started_then_abandoned(harness, "--lines", "2")
    b = harness.supervisor()
    b.adopt_all()
    await harness.reports.reach("ready")
    os.kill(left.pid, signal.SIGKILL)
    failed = await harness.reports.reach("failed")
    assert failed.reason.startswith("exited")  # its exit status went to its old parent
    assert "standin line 1" in failed.output_tail
    assert not record_path(harness, "tiny/0/0").exists()


@pytest_twisted.ensureDeferred
async def test_a_draining_engine_is_adopted_draining(harness):
    reports = Reports()
    a = harness.supervisor(reports=reports)
    left = a.start(make_spec("tiny/0/0"))
    await reports.reach("ready")
    a.drain("tiny/0/0")
    a.close()

    b = harness.supervisor()
    assert [s.state for s in b.adopt_all()] == ["draining"]
    assert (await b.stop("tiny/0/0")).state == "stopped"
    assert not alive(left.pid)


@pytest_twisted.ensureDeferred
async def test_an_adopted_worker_rank_is_ready_while_it_runs(harness):
    left = await started_then_abandoned(harness, WORKER, shard_id="tiny/0/1")
    b = harness.supervisor()
    b.adopt_all()
    ready = await harness.reports.reach("ready")
    assert ready.pid == left.pid


class AgentProcess(protocol.ProcessProtocol):
    def __init__(self):
        self.reports: list[dict] = []
        self.buffer = b""
        self.errors = b""
        self.ended: defer.Deferred = defer.Deferred()

    def outReceived(self, data):
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        self.reports += [json.loads(line) for line in lines if line.strip()]

    def errReceived(self, data):
        self.errors += data

    def processEnded(self, reason):
        self.ended.callback(reason.value)


@pytest_twisted.ensureDeferred
async def test_an_engine_outlives_its_agent_being_killed_and_the_next_agent_adopts_it(harness):
    agent = AgentProcess()
    src = str(Path(llmgw.__file__).parent.parent)
    transport = reactor.spawnProcess(
        agent, sys.executable, [sys.executable, str(HERE / "standin_agent.py"), str(harness.state_dir), "tiny/0/0",
                                "--chatter", "0.02"],
        env={**os.environ, "PYTHONPATH": src})
    harness.strays.append(transport.pid)
    ready = await until(lambda: [r for r in agent.reports if r["state"] == "ready"],
                        f"the agent's engine is ready ({agent.errors[-2000:]!r})")
    engine = ready[0]["pid"]
    assert psutil.Process(engine).ppid() == transport.pid

    os.kill(transport.pid, signal.SIGKILL)
    await agent.ended
    log = harness.state_dir / "shards" / (safe_name("tiny/0/0") + ".log")
    size = log.stat().st_size
    # Its agent is dead; its stdout was never a pipe to it, so it goes on
    # writing (an engine writing to a dead pipe dies of SIGPIPE).
    await until(lambda: log.stat().st_size > size + 200, "the orphaned engine keeps writing")
    assert alive(engine)

    b = harness.supervisor()
    adopted = b.adopt_all()
    assert [s.pid for s in adopted] == [engine]
    await harness.reports.reach("ready")
    last = b.tail("tiny/0/0")[-1]
    await until(lambda: b.tail("tiny/0/0")[-1] != last and b.tail("tiny/0/0")[-1].startswith("standin tick"),
                "new output of the adopted engine in the tail")

    assert (await b.stop("tiny/0/0")).state == "stopped"
    await until(lambda: not alive(engine), "the adopted engine is gone")


@pytest_twisted.ensureDeferred
async def test_a_record_whose_engine_is_gone_is_removed_and_nothing_is_reported(harness):
    left = await started_then_abandoned(harness)
    os.killpg(left.pid, signal.SIGKILL)
    await until(lambda: not alive(left.pid), "the engine is dead")

    b = harness.supervisor()
    assert b.adopt_all() == []
    assert harness.reports == [] and b.statuses() == []
    assert list((harness.state_dir / "shards").glob("*.json")) == []


@pytest_twisted.ensureDeferred
async def test_a_live_engine_whose_record_does_not_describe_a_shard_is_killed(harness):
    left = await started_then_abandoned(harness)
    path = record_path(harness, "tiny/0/0")
    record = json.loads(path.read_text())
    record["spec"] = {"shard_id": 42}
    path.write_text(json.dumps(record))

    b = harness.supervisor()
    assert b.adopt_all() == []
    await until(lambda: not alive(left.pid), "the engine nothing can describe is killed")
    assert harness.reports == []
    assert not path.exists() and path.with_name(path.name + ".unreadable").exists()


@pytest_twisted.ensureDeferred
async def test_a_live_engine_whose_record_is_not_even_json_is_killed(harness):
    left = await started_then_abandoned(harness)
    record_path(harness, "tiny/0/0").write_text('{"pid": ')

    b = harness.supervisor()
    assert b.adopt_all() == []
    await until(lambda: not alive(left.pid), "the engine nothing can describe is killed")


@pytest_twisted.ensureDeferred
async def test_a_live_engine_with_no_record_at_all_is_killed_with_its_group(harness):
    await started_then_abandoned(harness, "--fork-child")
    log = harness.state_dir / "shards" / (safe_name("tiny/0/0") + ".log")
    await until(lambda: "standin child pid" in log.read_text(), "the engine's child started")
    assert len(harness.engines()) == 2
    record_path(harness, "tiny/0/0").unlink()

    b = harness.supervisor()
    assert b.adopt_all() == []
    await until(lambda: harness.engines() == [], "the engine and its child are killed")


@pytest_twisted.ensureDeferred
async def test_a_recycled_pid_is_neither_adopted_nor_killed(harness):
    await started_then_abandoned(harness)
    path = record_path(harness, "tiny/0/0")
    record = json.loads(path.read_text())
    os.killpg(record["pid"], signal.SIGKILL)
    await until(lambda: not alive(record["pid"]), "the engine is dead")

    # Somebody else's process now has a pid the record names, but began later.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    harness.strays.append(stranger.pid)
    record["pid"] = record["pgid"] = stranger.pid
    record["create_time"] = psutil.Process(stranger.pid).create_time() - 1000
    path.write_text(json.dumps(record))

    b = harness.supervisor()
    assert b.adopt_all() == []
    assert not path.exists()
    assert alive(stranger.pid) and stranger.poll() is None
    assert harness.reports == []
    stranger.kill()
    stranger.wait()


@pytest_twisted.ensureDeferred
async def test_a_record_naming_this_agents_own_group_kills_nothing_of_ours(harness):
    path = record_path(harness, "tiny/0/0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": os.getpid(), "pgid": os.getpgrp(), "spec": "garbage",
                                "create_time": psutil.Process().create_time()}))
    b = harness.supervisor()
    # A live process with the right start time and no usable record is
    # killed, but never one in the agent's own process group: here that is
    # the test itself.
    assert b.adopt_all() == []
    assert alive(os.getpid())
    assert not path.exists()


@pytest_twisted.ensureDeferred
async def test_a_worker_that_left_the_engines_group_is_adopted_with_it_and_stopped_with_it(harness):
    left = await started_then_abandoned(harness, "--fork-escapee")
    log = harness.state_dir / "shards" / (safe_name("tiny/0/0") + ".log")
    line = await until(lambda: [l for l in log.read_text().splitlines() if l.startswith("standin escapee pid")],
                       "the engine's escapee started")
    escapee = int(line[0].split()[-1])
    assert os.getpgid(escapee) != left.pid

    b = harness.supervisor()
    b.adopt_all()
    await harness.reports.reach("ready")
    assert alive(escapee)  # not an engine nothing describes: it belongs to an adopted one

    await b.stop("tiny/0/0")
    await until(lambda: not alive(escapee), "the escapee is killed with its engine", timeout=5)


@pytest_twisted.ensureDeferred
async def test_a_valid_record_naming_the_agent_itself_is_not_adopted(harness):
    from llmgw.agent.statefiles import Record, StateDir

    files = StateDir(harness.state_dir)
    spec = make_spec("tiny/0/0")
    files.write(Record(pid=os.getpid(), pgid=os.getpgrp(), create_time=psutil.Process().create_time(), spec=spec,
                       endpoint="http://127.0.0.1:1", host="127.0.0.1", port=1, health="/health", started_at=0.0,
                       log=safe_name("tiny/0/0") + ".log", run="0" * 16))
    b = harness.supervisor()
    assert b.adopt_all() == []
    assert b.statuses() == [] and alive(os.getpid())
