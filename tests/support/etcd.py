"""A real etcd on 127.0.0.1 (Debian's ``etcd-server``), one member or three, each stopped by its pid.

A conftest that wants them imports the fixtures: ``from tests.support.etcd import etcd, etcd_cluster``.
Each member has free client and peer ports and a data directory under the
test's tmp_path; ``client_url`` is what ``ha.etcd`` names.  ``pause()`` and
``resume()`` send SIGSTOP and SIGCONT, for an etcd that hangs rather than
goes away.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.request

import pytest

from tests.support.net import free_port
from tests.support.procs import alive
from tests.support.wait import wait_for

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class EtcdMember:
    """One etcd process; *cluster* is the ``--initial-cluster`` it starts in, its own name included."""

    def __init__(self, data_dir, name: str = "default"):
        self.name = name
        self.data_dir = str(data_dir)
        self.client_port, self.peer_port = free_port(), free_port()
        self.client_url = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.proc: subprocess.Popen | None = None
        os.makedirs(os.path.dirname(self.data_dir), exist_ok=True)
        self.log_path = os.path.join(os.path.dirname(self.data_dir), f"{name}.log")

    def start(self, cluster: str | None = None, wait: bool = True) -> None:
        args = [
            ETCD, "--name", self.name, "--data-dir", self.data_dir,
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new", "--initial-cluster-token", "llmgw-test",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if wait:
            self.wait_healthy()

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return "(no log)"

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"etcd {self.name} exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=1) as answer:
                return json.loads(answer.read()).get("health") == "true"
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 30) -> None:
        wait_for(self.healthy, timeout, f"etcd {self.name} at {self.client_url} to be healthy", detail=self.log)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pid = self.proc.pid
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        assert not alive(pid)


def start_etcd(tmp_path) -> EtcdMember:
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (Debian's etcd-server; .ci/run installs it)")
    member = EtcdMember(tmp_path / "etcd" / "data")
    member.start()
    return member


@pytest.fixture
def etcd(tmp_path):
    """A one-member etcd; ``etcd.client_url`` is its URL."""
    member = start_etcd(tmp_path)
    yield member
    member.stop()


@pytest.fixture
def etcd_cluster(tmp_path):
    """Three etcd members in one cluster (for the slow suite): a list of ``EtcdMember``."""
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (Debian's etcd-server; .ci/run installs it)")
    members = [EtcdMember(tmp_path / "etcd" / f"m{i}", name=f"m{i}") for i in range(3)]
    cluster = ",".join(f"{m.name}={m.peer_url}" for m in members)
    try:
        for member in members:
            member.start(cluster, wait=False)
        for member in members:
            member.wait_healthy()
        yield members
    finally:
        for member in members:
            member.stop()
