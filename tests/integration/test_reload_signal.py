"""SIGHUP to a real server process: a broken server.yaml is refused with its reason, and the server keeps serving."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 0}
"""


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_sighup_with_a_broken_server_yaml_logs_why_and_the_server_keeps_serving(cluster):
    cluster.write_server_config(CATALOG)
    server = cluster.start_server()
    wait_for(lambda: "control plane attached to the hub" in server.output(), 20, "the control plane to join the hub")

    cluster.write_server_config(CATALOG.replace("profile: sim-fast", "profile: no-such-profile"))
    os.kill(server.pid, signal.SIGHUP)
    wait_for(lambda: "reload refused, the old catalog stays" in server.output(), 20, "the SIGHUP reload to be refused")
    refusal = next(line for line in server.output().splitlines() if "reload refused" in line)
    assert "no-such-profile" in refusal
    assert server.running()

    status = cluster.ctl("status", "--json")
    assert status.returncode == 0, status.stderr
    assert [m["model"] for m in json.loads(status.stdout)["models"]] == ["echo"]  # the old catalog
    assert answers(cluster.api + "/v1/models")
    assert answers(cluster.admin + "/healthz")

    # Fixed, the next SIGHUP applies it.
    cluster.write_server_config(CATALOG.replace("echo:", "echo2:"))
    os.kill(server.pid, signal.SIGHUP)
    wait_for(lambda: "catalog reloaded: model echo removed; model echo2 added" in server.output(), 20,
             "the fixed file to be reloaded")
