"""Why an agent cannot reach the hub, in words a person can act on, and a backoff that grows until a session joins."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.cluster import environment
from tests.support.net import free_port
from tests.support.wait import wait_for

RETRY = re.compile(r"retrying in ([0-9.]+) s")


def retry_delays(log: str, reason: str) -> list[float]:
    return [float(m.group(1)) for line in log.splitlines() if reason in line and (m := RETRY.search(line))]


def wait_for_retries(agent, reason: str, n: int = 3) -> list[float]:
    return wait_for(lambda: (d := retry_delays(agent.output(), reason)) and len(d) >= n and d,
                    40, f"{n} retries saying {reason!r}", detail=agent.output)


def grows(delays: list[float]) -> bool:
    # Attempt k waits between 2**(k-1) and 2**k seconds (jittered), up to the ceiling.
    return delays[0] <= 2 <= delays[1] <= 4 <= delays[2]


def test_a_hub_certificate_without_the_address_is_named_and_the_backoff_grows(cluster):
    subprocess.run(
        [sys.executable, "-m", "llmgw", "pki", "issue", str(cluster.pki), "cp", "--role", "server", "--san", "cp.example.org"],
        check=True, capture_output=True, env=environment(),
    )
    config = cluster.write_server_config()
    config.write_text(config.read_text().replace("llmgw-server.", "cp."))
    cluster.start_server()
    agent = cluster.start_agent("node01")
    sentence = "the hub's certificate is for cp, cp.example.org, not 127.0.0.1: re-issue it with llmgw pki issue"
    delays = wait_for_retries(agent, sentence)
    assert grows(delays), delays
    assert "--san cp.example.org --san 127.0.0.1" in agent.output()
    assert "VerificationError" not in agent.output()

    out = cluster.ctl("nodes")
    assert out.returncode == 3
    assert sentence in out.stderr


def test_with_the_hub_down_the_agent_says_refused_by_whom_and_when_it_tries_again(cluster):
    port = free_port()
    cluster.hub = f"wss://127.0.0.1:{port}/"
    agent = cluster.start_agent("node01")
    delays = wait_for_retries(agent, f"connection refused by 127.0.0.1:{port}")
    assert grows(delays), delays
    assert "Scheduling retry" not in agent.output()
