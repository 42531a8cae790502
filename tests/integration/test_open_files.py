"""API clients cannot take the descriptors agents need: a real server under a low open-files limit.

With the process's open-files limit reached, new API clients and new agent
links were both reset.  Now the server raises its soft limit to the hard
one, keeps link.max_connections of it for the link and lets the API hold
only what is left; a flood of API connections is refused at the API while
ctl and agents still join.
"""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.cluster import Process, environment, twistd
from tests.support.net import listening
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LIMIT = 256  # hard; the soft one starts lower and the server raises it
LINK = 64


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' in /proc/PID/limits")


def admin_figure(cluster, name: str) -> float | None:
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_a_flood_of_api_clients_leaves_the_link_its_descriptors(cluster):
    config = cluster.write_server_config(f"link: {{max_connections: {LINK}}}\n")
    lowered = f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (200, {LIMIT})); os.execv(sys.argv[1], sys.argv[1:])"
    argv = [sys.executable, "-c", lowered, *twistd("llmgw-server", config)]
    server = Process("server", argv, cluster.base / "server.log", environment()).start()
    cluster.server = server
    cluster.processes.append(server)
    wait_for(lambda: listening(cluster.link_port) or not server.running(), 20, "the hub to listen", detail=cluster.logs)
    assert soft_limit(server.pid) == LIMIT
    assert "open-files limit 256 (raised from 200; hard 256)" in server.output()
    api_budget = LIMIT - 128 - LINK
    assert f"the link holds up to {LINK} connections, the API up to {api_budget}" in server.output()

    flood = []
    try:
        for _ in range(LIMIT + 50):  # more than the whole limit
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", cluster.api_port))
            flood.append(s)
        api = '{listener="api"}'
        wait_for(lambda: admin_figure(cluster, "llmgw_listener_connections_refused_total" + api) or None, 20,
                 "the API to refuse connections past its budget", detail=cluster.logs)
        assert admin_figure(cluster, "llmgw_listener_connections" + api) == api_budget
        nodes = cluster.ctl("nodes", "--json", timeout=20)
        assert nodes.returncode == 0, nodes.stderr + cluster.logs()
        cluster.start_agent("node01")
        cluster.wait_node("node01", "ready")
    finally:
        for s in flood:
            s.close()
    log = server.output()
    refused = [line for line in log.splitlines() if "listen.api" in line and "refused a connection from 127.0.0.1:" in line]
    assert len(refused) == 1, refused  # one line for the run, not one per connection


def test_a_limit_too_low_for_the_link_is_shared_half_and_half():
    from llmgw.process.common import RESERVED_FDS, Budgets, split_open_files

    assert split_open_files(65536, 1024) == Budgets(1024, 65536 - RESERVED_FDS - 1024)
    # systemd's default soft limit with the default link budget: agents keep half of what there is.
    assert split_open_files(1024, 1024) == Budgets(448, 448)
