"""Two real agents with one node's certificate: the second is refused, the first keeps its replica.

A second session with a connected node's certificate used to be welcomed
and to win, blanking the node's replicas; two agents sharing a certificate
flapped forever.  Now the hub pings the first session, finds it alive, and
refuses the second with a sentence naming both peers, every time it retries.
"""

from __future__ import annotations

import re

import pytest

from tests.integration.test_replicas import CATALOG, complete, pid_of, wait_ready
from tests.support.cluster import Process, environment, twistd
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

REFUSED = re.compile(
    r"node01 is already connected from 127\.0\.0\.1:\d+; a second agent with its certificate "
    r"from 127\.0\.0\.1:\d+ was refused: give each node its own certificate"
)


def start_twin(cluster) -> Process:
    """A second agent in its own directory, with node01's certificate and node id."""
    home = cluster.base / "twin"
    (home / "weights").mkdir(parents=True)
    original = (cluster.base / "node01" / "agent.yaml").read_text()
    config = home / "agent.yaml"
    config.write_text(original.replace(str(cluster.base / "node01"), str(home)))
    twin = Process("twin", twistd("llmgw-agent", config), home / "agent.log", environment()).start()
    cluster.processes.append(twin)
    return twin


@pytest.mark.slow
def test_a_second_agent_with_a_nodes_certificate_is_refused_and_the_first_keeps_its_replica(cluster):
    cluster.write_server_config(CATALOG.replace("replicas: 2", "replicas: 1"))
    server = cluster.start_server()
    cluster.start_agent("node01")
    (replica,) = wait_ready(cluster, 1)

    twin = start_twin(cluster)
    wait_for(lambda: len(REFUSED.findall(server.output())) >= 2, 60, "the hub to refuse the twin twice (it retries)",
             detail=cluster.logs)
    assert REFUSED.search(twin.output()), twin.output()  # the twin's operator reads why, in the hub's words
    assert twin.running()

    (again,) = wait_ready(cluster, 1)
    assert (again["endpoint"], pid_of(again)) == (replica["endpoint"], pid_of(replica))
    assert complete(again["endpoint"])
    node = cluster.nodes()["node01"]
    assert node["state"] == "ready"
    # ctl nodes shows the refusal with the node, in the hub's words.
    assert [w for w in node["link_warnings"] if REFUSED.fullmatch(w)], node["link_warnings"]
    out = cluster.ctl("nodes")
    assert REFUSED.search(out.stdout), out.stdout
    assert not re.search(r"session \d+ left: node node01", server.output())  # the first was never displaced
