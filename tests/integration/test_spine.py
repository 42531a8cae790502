"""The spine end to end: a server and agents as real processes, queried with `llmgw ctl`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.cluster import ROOT, TWISTD, environment
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def test_two_agents_register_and_describe_their_nodes(cluster):
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.start_agent("node02")
    one = cluster.wait_node("node01", "ready")
    two = cluster.wait_node("node02", "ready")

    for node in (one, two):
        assert node["address"] == "127.0.0.1"  # the route to a hub on loopback
        assert node["memory_total_bytes"] > 0
        assert 0 < node["memory_available_bytes"] <= node["memory_total_bytes"]
        assert node["cpu"]["logical_cores"] >= 1
        assert node["gpus"] == []  # probed: no NVIDIA driver here, which is not an error
        (fs,) = node["filesystems"]
        assert fs["weights_dirs"] == [str(cluster.base / node["id"] / "weights")]
        assert 0 < fs["free_bytes"] <= fs["total_bytes"]
        assert node["protocol"] == 1

    table = cluster.ctl("nodes")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["NODE", "STATE", "ADDRESS"]
    assert any(line.startswith("node01") and " ready " in line for line in lines)
    assert any(line.startswith("node02") and " ready " in line for line in lines)


def test_heartbeats_refresh_live_figures(cluster):
    cluster.start_server()
    cluster.start_agent("node01")
    first = cluster.wait_node("node01", "ready")
    later = wait_for(
        lambda: (n := cluster.nodes()["node01"])["last_seen"] > first["last_seen"] and n,
        10, "a heartbeat after registration",
    )
    assert later["state"] == "ready"
    assert later["memory_available_bytes"] is not None


def test_a_killed_agent_goes_unreachable_then_lost(cluster):
    cluster.start_server()
    agent = cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    agent.kill()
    unreachable = cluster.wait_node("node01", "unreachable", timeout=10)
    assert unreachable["reason"]
    lost = cluster.wait_node("node01", "lost", timeout=15)
    assert lost["reason"].startswith("no heartbeat for")
    out = cluster.ctl("nodes")
    assert "node01: lost: no heartbeat for" in out.stdout


def test_agents_come_back_by_themselves_after_a_server_restart(cluster):
    server = cluster.start_server()
    one = cluster.start_agent("node01")
    two = cluster.start_agent("node02")
    cluster.wait_node("node01", "ready")
    cluster.wait_node("node02", "ready")
    server.stop()
    cluster.start_server()
    cluster.wait_node("node01", "ready", timeout=40)
    cluster.wait_node("node02", "ready", timeout=40)
    assert one.running() and two.running()  # not restarted, not touched
    assert "registered again" in one.output()


def test_ctl_says_when_the_hub_cannot_be_reached(cluster):
    started = time.monotonic()
    out = cluster.ctl("nodes", hub="wss://127.0.0.1:1/")
    assert out.returncode != 0
    assert time.monotonic() - started < 15
    assert "cannot reach the hub at wss://127.0.0.1:1/" in out.stderr
    assert "Traceback" not in out.stderr


def test_ctl_with_a_node_certificate_is_refused_for_that_reason(cluster):
    cluster.start_server()
    out = cluster.ctl("nodes", cert="node01")
    assert out.returncode != 0
    assert "node node01 may register only under llmgw.node.node01." in out.stderr
    assert "Traceback" not in out.stderr


def test_an_agent_whose_certificate_is_for_another_node_refuses_to_start(cluster):
    config = cluster.agent_config("node01")
    text = config.read_text().replace("node_id: node01", "node_id: node07")
    config.write_text(text)
    out = subprocess.run(
        [*TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", "llmgw-agent", "--config", str(config)],
        capture_output=True, text=True, env=environment(), timeout=60, cwd=config.parent,
    )
    assert out.returncode != 0
    assert "node_id in the agent configuration is 'node07'" in out.stderr + out.stdout
    assert "certificate for 'node01'" in out.stderr + out.stdout


def test_a_broken_server_config_is_refused_at_start_naming_file_key_and_line(cluster):
    config = cluster.write_server_config("modles: {}\n")
    out = subprocess.run(
        [*TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", "llmgw-server", "--config", str(config)],
        capture_output=True, text=True, env=environment(), timeout=60, cwd=config.parent,
    )
    assert out.returncode != 0
    text = out.stderr + out.stdout
    assert f"{config}:7: modles" in text
    assert "models" in text  # the suggestion


def test_fake_gpus_from_a_recorded_h100_node_show_in_ctl(cluster):
    fixture = ROOT / "tests" / "fixtures" / "nvml" / "h100x8.json"
    cluster.start_server()
    cluster.start_agent("node01", env={"LLMGW_FAKE_NVML": str(fixture)})
    node = cluster.wait_node("node01", "ready")
    assert len(node["gpus"]) == 8
    assert {g["name"] for g in node["gpus"]} == {json.loads(fixture.read_text())["gpus"][0]["name"]}
    assert node["nvidia_driver"]
    table = cluster.ctl("nodes").stdout
    assert "8x H100" in table


def test_twistd_lists_the_plugins_from_an_installed_llmgw():
    """`pip install .` must put the plugins where twistd finds them (make test installs it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    probe = subprocess.run([sys.executable, "-c", "import llmgw, sys; print(llmgw.__file__)"],
                           capture_output=True, text=True, env=env, cwd="/")
    if probe.returncode != 0 or "site-packages" not in probe.stdout:
        pytest.skip("llmgw is not installed in this environment; `make test` installs it")
    out = subprocess.run([twistd, "--help"], capture_output=True, text=True, env=env, cwd="/")
    assert "llmgw-server" in out.stdout and "llmgw-agent" in out.stdout
