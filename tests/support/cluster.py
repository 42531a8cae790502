"""Real processes on 127.0.0.1: `twistd -n llmgw-server`, `twistd -n llmgw-agent`, `llmgw ctl`.

Everything waits for a condition with a deadline and says what it was
waiting for; nothing sleeps in the hope that something has happened.
A conftest that wants the ``cluster`` fixture imports it from here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import pki as pkimod
from tests.support.net import free_port, listening
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
# `python -m twisted` is the newer `twist` runner; twistd is this.
TWISTD = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


def environment(**extra) -> dict[str, str]:
    env = dict(os.environ)
    # The working tree's code and its twisted/plugins, whether or not llmgw is installed.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env.pop("LLMGW_HUB", None)
    env.update(extra)
    return env


class Process:
    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]):
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        self.handle = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=self.handle, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True, cwd=self.log.parent,
        )
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.running():
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def twistd(plugin: str, config: Path) -> list[str]:
    return [*TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", plugin, "--config", str(config)]


def stop_engines(state_dirs) -> None:
    """Kill the engines agents on *state_dirs* started (they carry its marker)."""
    from llmgw.agent.procs import marked_processes

    for state_dir in state_dirs:
        for engine in marked_processes(Path(state_dir)):
            try:
                os.killpg(engine.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Cluster:
    """A server and agents in one temporary directory, with certificates from `llmgw pki`."""

    def __init__(self, base: Path, pki: Path):
        self.base = base
        self.pki = base / "pki"
        shutil.copytree(pki, self.pki)
        self.link_port = free_port()
        self.api_port = free_port()
        self.admin_port = free_port()
        self.hub = f"wss://127.0.0.1:{self.link_port}/"
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        self.server: Process | None = None
        self.agents: dict[str, Process] = {}
        self.processes: list[Process] = []

    def write_server_config(self, extra: str = "") -> Path:
        path = self.base / "server.yaml"
        path.write_text(
            f"""listen:
  link: "ssl:{self.link_port}:interface=127.0.0.1"
  api: "tcp:{self.api_port}:interface=127.0.0.1"
  admin: "tcp:{self.admin_port}:interface=127.0.0.1"
tls: {{ca: pki/ca.crt, cert: pki/llmgw-server.crt, key: pki/llmgw-server.key}}
fleet: {{unreachable_after_s: 3, lost_after_s: 6, settle_s: 4, settle_quiet_s: 5}}
{extra}"""
        )
        return path

    def start_server(self, wait: bool = True) -> Process:
        config = self.base / "server.yaml"
        if not config.exists():
            self.write_server_config()
        proc = Process("server", twistd("llmgw-server", config), self.base / "server.log", environment()).start()
        self.server = proc
        self.processes.append(proc)
        if wait:
            # Every listener the config names, not just the hub's: the services start
            # one after another, so the link can listen a moment before the API does.
            text = config.read_text()
            ports = [self.link_port, *(port for port in (self.api_port, self.admin_port) if f"tcp:{port}:" in text)]
            wait_for(lambda: all(listening(port) for port in ports) or not proc.running(), 20,
                     "the server's listeners to listen")
            assert proc.running(), f"the server exited:\n{proc.output()}"
        return proc

    def agent_config(self, node: str, extra: str = "", state_dir: Path | None = None) -> Path:
        """*node*'s agent.yaml in its own directory; *state_dir*, when given, replaces its own state directory."""
        if not (self.pki / f"{node}.crt").exists():
            pkimod.issue(self.pki, node, "node")
        home = self.base / node
        (home / "weights").mkdir(parents=True, exist_ok=True)
        path = home / "agent.yaml"
        path.write_text(
            f"""hub: "{self.hub}"
tls: {{ca: ../pki/ca.crt, cert: ../pki/{node}.crt, key: ../pki/{node}.key}}
node_id: {node}
weights_dirs: [{home / 'weights'}]
state_dir: {state_dir or home / 'state'}
heartbeat_interval_s: 1
{extra}"""
        )
        return path

    def start_agent(self, node: str, extra: str = "", env: dict[str, str] | None = None,
                    state_dir: Path | None = None) -> Process:
        config = self.agent_config(node, extra, state_dir)
        proc = Process(node, twistd("llmgw-agent", config), config.parent / "agent.log", environment(**(env or {}))).start()
        self.agents[node] = proc
        self.processes.append(proc)
        return proc

    def ctl_argv(self, cert: str = "alice", hub: str | None = None) -> list[str]:
        return [
            sys.executable, "-m", "llmgw", "ctl", "--hub", hub or self.hub, "--ca", str(self.pki / "ca.crt"),
            "--cert", str(self.pki / f"{cert}.crt"), "--key", str(self.pki / f"{cert}.key"),
        ]

    def ctl(self, *args: str, cert: str = "alice", timeout: float = 30, hub: str | None = None) -> subprocess.CompletedProcess:
        argv = [*self.ctl_argv(cert, hub), *args]
        return subprocess.run(argv, capture_output=True, text=True, env=environment(), timeout=timeout)

    def nodes(self) -> dict[str, dict]:
        out = self.ctl("nodes", "--json")
        assert out.returncode == 0, out.stderr
        return {n["id"]: n for n in json.loads(out.stdout)}

    def wait_node(self, node: str, state: str, timeout: float = 20) -> dict:
        def check():
            found = self.nodes().get(node)
            return found if found and found["state"] == state else None

        return wait_for(check, timeout, f"node {node} to be {state}", interval=0.3, detail=self.logs)

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} ({p.log}) -----\n{p.output()[-4000:]}" for p in self.processes)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        # Engines outlive their agents by design; a test's must not outlive the test.
        stop_engines(self.base.glob("*/state"))


@pytest.fixture
def cluster(tmp_path, pki):
    """A Cluster in the test's temporary directory, every process it started stopped afterwards."""
    c = Cluster(tmp_path, pki)
    yield c
    c.stop()
