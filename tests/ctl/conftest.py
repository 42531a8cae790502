"""Onboarding's fixtures: a server whose control plane keeps the CA, nodes that are real sshd instances, one wheelhouse."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmgw.ctl.nodehost import SYSTEMD_DIR_ENV
from tests.support.cluster import ROOT, Cluster, cluster  # noqa: F401 (a fixture)
from tests.support.sshd import Operator, SshNode, engine_groups_under
from tests.support.wait import wait_for

CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 1}
"""


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory):
    """llmgw's wheel built from the working tree, and its dependencies' from the machine's cache, made once."""
    where = tmp_path_factory.mktemp("wheelhouse")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(where), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return where


@pytest.fixture
def fleet(tmp_path, pki):
    """A server whose control plane signs with the cluster CA (pki.ca_dir), running."""
    made = Cluster(tmp_path, pki)
    path = made.write_server_config()
    # Onboarded agents heartbeat at the default 5 s (agent.yaml has only what onboarding was
    # given), so the fleet's usual 3 s to unreachable would have them flap.
    text = path.read_text().replace("fleet: {unreachable_after_s: 3, lost_after_s: 6, settle_s: 4, settle_quiet_s: 5}",
                                    "fleet: {unreachable_after_s: 20, lost_after_s: 40, settle_s: 1, settle_quiet_s: 5}")
    assert "unreachable_after_s: 20" in text
    path.write_text(text + CATALOG + f"pki: {{ca_dir: {made.pki}}}\n")
    made.start_server()
    yield made
    made.stop()


@pytest.fixture
def nodes(tmp_path, sshd):
    """Make nodes with ``nodes.add(alias)``; each is stopped, with the agent it runs, afterwards."""

    class Nodes:
        def __init__(self):
            self.base = tmp_path / "nodes"
            self.operator = Operator(tmp_path / "operator")
            self.made: list[SshNode] = []

        def add(self, alias: str, known: bool = True, env: dict[str, str] | None = None, systemd: bool = True,
                path: str | None = None) -> SshNode:
            # This machine's PID 1 is not systemd: a node stands for one that systemd booted only through
            # nodehost's explicit override, a directory standing for /run/systemd/system (unless *systemd* is False).
            booted = self.base / alias / "run-systemd-system"
            if systemd:
                booted.mkdir(parents=True, exist_ok=True)
                env = {SYSTEMD_DIR_ENV: str(booted), **(env or {})}
            node = SshNode(sshd, self.base / alias, alias, path=path, env=env).start()
            self.made.append(node)
            self.operator.add(node, known=known)
            return node

    made = Nodes()
    yield made
    for node in made.made:
        node.stop()
    # Nothing a node ran outlives the test (its engines included).
    def left():
        return {n.alias: groups for n in made.made if (groups := engine_groups_under(n.base))}

    wait_for(lambda: not left(), 10, "every engine the nodes ran to end", detail=lambda: str(left()))
