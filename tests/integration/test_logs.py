"""A node's logs read through ctl: `logs -f` prints each line once, and the logs carry signal, not polls.

The server, the agent and its sim engine are real processes on 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import threading

import pytest

from tests.integration.test_replicas import CATALOG, complete, wait_ready
from tests.support.cluster import environment
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

REQUESTS = 6


def one_replica(cluster) -> dict:
    cluster.write_server_config(CATALOG.replace("replicas: 2", "replicas: 1"))
    cluster.start_server()
    cluster.start_agent("node01")
    (replica,) = wait_ready(cluster, 1)
    return replica


@pytest.mark.slow
def test_logs_follow_prints_each_line_once(cluster):
    replica = one_replica(cluster)
    for _ in range(REQUESTS):
        complete(replica["endpoint"])
    post = "POST /v1/chat/completions"
    # -n smaller than the log: the first read is narrower than the ones -f polls with.
    follow = subprocess.Popen(
        [*cluster.ctl_argv(), "logs", "node01", "--source", "echo/0/0", "-n", str(REQUESTS), "-f"],
        stdout=subprocess.PIPE, text=True, env=environment(),
    )
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(line.rstrip("\n") for line in follow.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: sum(post in ln for ln in printed) >= REQUESTS, 20, "ctl logs -f to print the tail")
        for i in range(REQUESTS):
            complete(replica["endpoint"])
            # A request a poll or so, so the seam is looked for many times.
            wait_for(lambda: sum(post in ln for ln in printed) > REQUESTS + i, 30,
                     f"ctl logs -f to print request {REQUESTS + i + 1}")
        # Lines print in the order they were written: once the last request's
        # line is there, a second copy of an earlier one would be there too.
    finally:
        follow.terminate()
        follow.wait(timeout=10)
        reader.join(timeout=10)
    assert printed[0].startswith("# node01 echo/0/0: last"), printed[0]
    body = printed[1:]
    log = cluster.ctl("logs", "node01", "--source", "echo/0/0", "-n", "1000").stdout.splitlines()[1:]
    assert body == log[len(log) - len(body):], "\n".join(printed)
    assert sum(post in ln for ln in body) == 2 * REQUESTS, "\n".join(printed)


def test_the_logs_leave_out_twisteds_factory_lines_and_the_engines_polls(cluster):
    replica = one_replica(cluster)
    agent = cluster.agents["node01"]
    complete(replica["endpoint"])

    def engine_log():
        out = cluster.ctl("logs", "node01", "--source", "echo/0/0").stdout
        return out if "POST /v1/chat/completions" in out else None

    engine = wait_for(engine_log, 30, "the request in the engine's log", interval=0.5)
    # The agent polled /health until the engine was ready, and the router
    # polls /metrics every second.
    assert "/metrics" not in engine and "/health" not in engine, engine
    own = cluster.ctl("logs", "node01")
    assert "registered with the hub" in own.stdout
    assert "Starting factory" not in own.stdout and "Starting factory" not in agent.output(), agent.output()
