"""Asking for the log of a replica still fetching its weights: an answer in words, and not a line in the node's log.

Real processes: the server, an agent fetching from the hub mirror
(tests/support/hfmirror.py, which holds the weights part-way until the test
has looked), and ``llmgw ctl logs`` polled as the dashboard polls.
"""

from __future__ import annotations

import json

import pytest

from tests.support.cluster import cluster  # noqa: F401 - a fixture
from tests.support.hfmirror import HubMirror
from tests.support.wait import wait_for
from tests.agent.weights.test_repository import WEIGHTS_PATH, tiny_repo
from tests.agent.weights.test_repository_node import CATALOG

pytestmark = pytest.mark.integration

POLLS = 3


@pytest.mark.slow
def test_polling_a_fetching_replicas_log_writes_nothing_to_the_nodes_log(cluster, tmp_path):
    tiny_repo(tmp_path / "hub")
    with HubMirror(tmp_path / "hub") as hub:
        hub.hold(WEIGHTS_PATH, 500_000)
        cluster.write_server_config(CATALOG)
        cluster.start_server()
        agent = cluster.start_agent("node01", env={"HF_ENDPOINT": hub.url})
        cluster.wait_node("node01", "ready")

        def fetching():
            (r,) = json.loads(cluster.ctl("replicas", "--json").stdout)
            return r["state"] == "fetching" and r["shards"] and r["shards"][0]["state"] == "fetching" and r

        replica = wait_for(fetching, 30, "the replica to be fetching", detail=cluster.logs)
        shard = replica["shards"][0]["shard"]
        before = len(agent.output())

        for _ in range(POLLS):
            out = cluster.ctl("logs", "node01", "--source", shard)
            assert out.returncode != 0
            assert f"{shard} on node01 has not started: it is fetching its weights" in out.stderr
            assert "llmgw.error" not in out.stderr
        # A shard the node does not hold at all: the node's refusal, relayed, and not logged there either.
        for _ in range(POLLS):
            out = cluster.ctl("logs", "node01", "--source", "nosuch/0")
            assert out.returncode != 0 and "no shard nosuch/0 on this node" in out.stderr

        # The node's log is in order: once it says it was cordoned, any line the polls wrote is in it.
        assert cluster.ctl("cordon", "node01").returncode == 0
        wait_for(lambda: "this node is now cordoned" in agent.output()[before:], 20, "the agent to log the cordon")
        during = agent.output()[before:]
        assert "onUserError" not in during and "nosuch" not in during and "has not started" not in during, during
        hub.release(WEIGHTS_PATH)
