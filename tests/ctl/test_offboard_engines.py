"""Offboarding a node whose agent is stopped but whose engines run (the unit's KillMode=process): they are killed."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from llmgw.ctl import nodehost, nodeside
from tests.support.wait import wait_for

# An engine as the agent starts one: a group leader in its own session, with a child of its own.
ENGINE = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"


@pytest.fixture
def started():
    procs = []

    def start(code: str = ENGINE) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if nodehost._group_alive(proc.pid):
            subprocess.run(["kill", "-KILL", "--", f"-{proc.pid}"], timeout=10)
        proc.wait(timeout=10)


def record(state, shard: str, **fields) -> None:
    (state / "shards").mkdir(parents=True, exist_ok=True)
    (state / "shards" / f"{shard}.json").write_text(json.dumps(fields))


def layout(tmp_path) -> dict:
    return {"prefix": str(tmp_path / "opt"), "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state"),
            "unit_dir": str(tmp_path / "units"), "owner": "root"}


def test_remove_kills_the_engine_groups_the_state_directory_records(tmp_path, started):
    engine = started()
    wait_for(lambda: len(psutil.Process(engine.pid).children()) == 1, timeout=20, what="the engine's child")
    child = psutil.Process(engine.pid).children()[0]
    record(tmp_path / "state", "echo-0-0", pid=engine.pid, pgid=engine.pid,
           create_time=psutil.Process(engine.pid).create_time())
    answer = nodeside.remove(layout(tmp_path))
    assert answer["changed"] == [f"engine process group {engine.pid} (shard echo-0-0)"]
    assert engine.wait(timeout=10) is not None
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert (tmp_path / "state" / "shards" / "echo-0-0.json").exists()  # the state directory stays


def test_remove_kills_no_group_a_record_does_not_prove_is_the_agents(tmp_path, started):
    other = started()
    # A recycled pid: the process under it started at another time than the record says.
    record(tmp_path / "state", "recycled", pid=other.pid, pgid=other.pid,
           create_time=psutil.Process(other.pid).create_time() - 100)
    record(tmp_path / "state", "ours", pid=1, pgid=1, create_time=0.0)  # init, never
    (tmp_path / "state" / "shards" / "nonsense.json").write_text("[not json")
    record(tmp_path / "state", "strings", pid="12", pgid="12", create_time="x")
    assert nodeside.remove(layout(tmp_path))["changed"] == []
    assert other.poll() is None


def test_an_engine_that_outlives_sigkill_is_a_failure_naming_it(tmp_path, started, monkeypatch):
    engine = started()
    record(tmp_path / "state", "stuck", pid=engine.pid, pgid=engine.pid,
           create_time=psutil.Process(engine.pid).create_time())
    monkeypatch.setattr(nodeside.os, "killpg", lambda pgid, sig: None)  # signals that do nothing
    with pytest.raises(SystemExit, match=rf"engine process groups {engine.pid} \(shard stuck\) still run 0 s"):
        nodehost.stop_engines(str(tmp_path / "state"), stop_s=0.0)


def test_remove_kills_no_group_with_a_process_of_another_user_whatever_the_record_says(tmp_path, started):
    # The agent's user writes the shard records and offboarding runs as root: a
    # record naming a group of root's (pid and start time read from /proc, as
    # anyone may) must not have root kill it.  The agent here is "nobody".
    engine = started()
    record(tmp_path / "state", "forged", pid=engine.pid, pgid=engine.pid,
           create_time=psutil.Process(engine.pid).create_time())
    assert nodeside.remove({**layout(tmp_path), "owner": "nobody"})["changed"] == []
    assert engine.poll() is None
