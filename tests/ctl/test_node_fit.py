"""A node the agent cannot run on is refused at ``check``, and ``offboard`` stops the agent before it removes it.

Before, ``check`` only looked for ``systemctl`` on PATH: a node whose PID 1
is not systemd (a container, WSL) passed, and onboarding installed,
made a key, had a certificate signed and wrote the files before ``start``
failed.  ``remove`` stopped the unit quietly (a missing systemctl was a
traceback, a failed stop unsaid) and deleted the venv of an agent that kept
running.  This machine's PID 1 is not systemd: a node here is that case,
unless the tests' explicit override (:data:`llmgw.ctl.nodehost.SYSTEMD_DIR_ENV`)
names a directory standing for ``/run/systemd/system``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.ctl import nodehost, nodeside
from llmgw.ctl.layout import Layout, unit_text
from llmgw.ctl.ssh import Refusal, Ssh
from tests.ctl.test_onboard import left_nothing, onboard, refused
from tests.support.procs import alive
from tests.support.wait import wait_for

# The stand-in agent: it takes the agent's state lock as llmgw.agent.statelock does, says so, and waits for a signal.
STAND_IN = """import fcntl, json, os, signal, sys
state = sys.argv[1]
os.makedirs(state, exist_ok=True)
fd = os.open(os.path.join(state, "agent.lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "node_id": "edge1"}).encode() + b"\\n")
open(os.path.join(state, "ready"), "w").close()
signal.pause()
"""


@pytest.fixture
def running():
    """Start a process standing in for the agent (or one of its engines); each is killed by its pid afterwards."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str], ready: Path | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        started.append(proc)
        if ready is not None:
            wait_for(lambda: ready.exists() or proc.poll() is not None, 20, "the stand-in agent to take its lock")
        else:
            wait_for(lambda: _argv(proc.pid)[:1] == argv[:1] or proc.poll() is not None, 20, "the stand-in to run")
        assert proc.poll() is None, proc.returncode
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def installed(root: Path, unit_dir: Path) -> dict:
    """What onboarding leaves on a node, in small: a venv (pyvenv.cfg, python, a twistd that is the stand-in), files, the unit."""
    prefix, etc = root / "opt", root / "etc"
    (prefix / "bin").mkdir(parents=True)
    real = os.path.realpath(sys.executable)
    (prefix / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\n")
    (prefix / "bin" / "python").symlink_to(real)
    (prefix / "bin" / "twistd").write_text(STAND_IN)
    etc.mkdir()
    for name in ("agent.yaml", "node.key"):
        (etc / name).write_text("llmgw's\n")
    request = {"prefix": str(prefix), "config_dir": str(etc), "state_dir": str(root / "state"),
               "unit_dir": str(unit_dir), "owner": "root"}
    (unit_dir / "llmgw-agent.service").write_text(unit_text(None, Layout(str(prefix), str(etc), str(root / "state"),
                                                                         str(unit_dir), "root")))
    return request


def still_there(request: dict) -> bool:
    return all(os.path.exists(p) for p in (os.path.join(request["prefix"], "bin", "twistd"),
                                           os.path.join(request["config_dir"], "node.key"),
                                           os.path.join(request["unit_dir"], "llmgw-agent.service")))


@pytest.mark.sshd
@pytest.mark.slow
def test_a_node_whose_init_is_not_systemd_is_refused_at_check_and_left_as_it_was(fleet, nodes):
    # The real rule, /run/systemd/system, on this machine; where the suite runs under systemd, a directory not there.
    env = {nodehost.SYSTEMD_DIR_ENV: str(nodes.base / "not-booted")} if os.path.isdir(nodehost.SYSTEMD_DIR) else {}
    node = nodes.add("edge1", systemd=False, env=env)
    assert shutil.which("systemctl", path=node.path)  # systemctl is there: only the init is not systemd
    out = onboard(fleet, nodes, node)
    refused(out, "edge1: check failed")
    assert "this node's init is not systemd (PID 1 is " in out.stdout, out.stdout
    assert "onboard a machine or VM that systemd boots" in out.stdout, out.stdout
    assert not any(f"edge1: {step}" in out.stdout for step in ("name", "install", "key", "configure")), out.stdout
    left_nothing(node)
    assert not (node.base / "weights").exists() and not (node.units / "systemctl.calls").exists()
    assert "edge1" not in fleet.nodes()


def test_each_thing_the_node_lacks_is_one_sentence(tmp_path, monkeypatch):
    booted = tmp_path / "booted"
    booted.mkdir()
    monkeypatch.setenv(nodehost.SYSTEMD_DIR_ENV, str(booted))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # systemd booted it, and systemctl is not on PATH
    monkeypatch.setattr(nodehost.importlib.util, "find_spec", lambda name: None if name == "ensurepip" else object())
    hub = __import__("socket").create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(nodeside.Declined) as declined:
            nodeside.check({"prefix": str(tmp_path / "opt"), "config_dir": str(tmp_path / "etc"),
                            "state_dir": str(tmp_path / "state"), "unit_dir": str(tmp_path / "units"),
                            "owner": "root", "hub_host": "127.0.0.1", "hub_port": hub.getsockname()[1],
                            "min_free_mb": 1 << 40, "min_state_free_mb": 1 << 40})
    finally:
        hub.close()
    said = str(declined.value).split("; ")
    assert "there is no systemctl on PATH, though systemd booted this node" in said[0], said
    assert any("has no ensurepip module, so it cannot make the venv" in s and "python3-venv" in s for s in said), said
    # The venv and the state dir on one filesystem: what they need together.
    [space] = [s for s in said if "MB free" in s]
    assert f"{tmp_path / 'opt'} ({1 << 40} MB) and {tmp_path / 'state'} ({1 << 40} MB)" in space
    assert f"they need {2 << 40} MB" in space


def test_offboarding_keeps_the_venv_of_an_agent_that_still_runs_and_names_it(nodes, running):
    node = nodes.add("edge1")
    request = installed(node.base / "root", node.units)
    state = Path(request["state_dir"])
    # An agent started by hand: the unit's stop (the tests' systemctl) stops nothing.
    agent = running([f"{request['prefix']}/bin/python", f"{request['prefix']}/bin/twistd", str(state)], state / "ready")
    ssh = Ssh(node.alias, str(nodes.operator.config))
    with pytest.raises(Refusal) as refusal:
        ssh.run("remove", request)
    said = str(refusal.value)
    assert f"the agent still runs, pid {agent.pid} (it holds {state}/agent.lock)" in said, said
    assert "and `systemctl stop llmgw-agent.service` succeeded; nothing was removed" in said, said
    assert "kill that pid) and offboard again" in said, said
    assert "stop llmgw-agent.service" in (node.units / "systemctl.calls").read_text()
    assert still_there(request) and alive(agent.pid)

    os.kill(agent.pid, signal.SIGTERM)
    agent.wait(timeout=10)
    answer = ssh.run("remove", request)
    assert answer["stopped"] == "`systemctl stop llmgw-agent.service` succeeded", answer
    assert request["prefix"] in answer["changed"] and not os.path.exists(request["prefix"])
    assert not (node.units / "llmgw-agent.service").exists()


def test_without_systemctl_offboarding_says_so_and_finds_the_agent_by_its_lock_and_what_runs_from_its_venv(nodes, running):
    bare = nodes.base / "bare-bin"  # a PATH with a Python and no systemctl (root's profile puts pyenv's before it)
    bare.mkdir(parents=True)
    (bare / "python3").symlink_to(os.path.realpath(sys.executable))
    node = nodes.add("edge2", path=str(bare))
    request = installed(node.base / "root", node.units)
    state = Path(request["state_dir"])
    # The agent, run by another Python than the venv's: found by the lock it holds.
    agent = running([sys.executable, "-c", STAND_IN, str(state)], state / "ready")
    ssh = Ssh(node.alias, str(nodes.operator.config), python=str(bare / "python3"))
    with pytest.raises(Refusal) as refusal:
        ssh.run("remove", request)
    said = str(refusal.value)
    assert f"pid {agent.pid} (it holds {state}/agent.lock)" in said, said
    assert "there is no systemctl on this node to stop llmgw-agent.service with; nothing was removed" in said, said
    os.kill(agent.pid, signal.SIGTERM)
    agent.wait(timeout=10)
    # Something else from the venv (an engine no record names): the venv stays, and so does the rest.
    engine = running([f"{request['prefix']}/bin/python", "-c", "import signal; signal.pause()"])
    with pytest.raises(Refusal) as refusal:
        ssh.run("remove", request)
    said = str(refusal.value)
    assert f"pid {engine.pid} ({request['prefix']}/bin/python) still run from {request['prefix']}, so it was not " \
           "removed, nor anything else; stop them and offboard again" in said, said
    assert still_there(request) and alive(engine.pid)
    os.kill(engine.pid, signal.SIGTERM)
    engine.wait(timeout=10)
    answer = ssh.run("remove", request)
    assert answer["stopped"] == "there is no systemctl on this node to stop llmgw-agent.service with", answer
    assert not os.path.exists(request["prefix"]) and not (node.units / "llmgw-agent.service").exists()


def test_a_lock_no_process_holds_is_no_running_agent_and_a_link_or_fifo_there_is_not_followed(tmp_path):
    (tmp_path / "agent.lock").write_text('{"pid": 1, "node_id": "edge1"}\n')  # left by an agent that has ended
    assert nodehost.agent_running(str(tmp_path), str(tmp_path / "opt")) == []
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "agent.lock").symlink_to(tmp_path / "agent.lock")  # the agent's user's link
    assert nodehost.agent_running(str(tmp_path / "linked"), str(tmp_path / "opt")) == []
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "agent.lock")  # opened without waiting for a writer
    assert nodehost.agent_running(str(tmp_path / "fifo"), str(tmp_path / "opt")) == []
