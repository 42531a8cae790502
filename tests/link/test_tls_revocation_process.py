"""A real server process: `llmgw pki revoke` then `llmgw ctl reload` ends a live node's link, without a restart."""

from __future__ import annotations

import pytest

from llmgw import pki
from tests.support.cluster import cluster  # noqa: F401 - a fixture
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def test_revoke_and_reload_close_a_live_node_and_refuse_it_from_then_on(cluster):  # noqa: F811
    cluster.write_server_config()
    server = cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready", timeout=60)

    pki.revoke(cluster.pki, "node01")  # crl.pem beside the server's tls.ca
    reloaded = cluster.ctl("reload")
    assert reloaded.returncode == 0, reloaded.stderr

    wait_for(lambda: "closed the link connection of CN=node01,OU=node,O=test-cluster" in server.output(), 20,
             "the server to close node01's connection", detail=cluster.logs)
    wait_for(lambda: "certificate CN=node01,OU=node,O=test-cluster: revoked on " in server.output(), 20,
             "the agent's next handshake to be refused", detail=cluster.logs)
    [refused] = [line for line in server.output().splitlines() if "refused the link connection" in line][:1]
    assert "refused the link connection from 127.0.0.1:" in refused
    assert refused.endswith(")") and "(serial " in refused.rsplit(": revoked on ", 1)[1]
    assert server.running()
    assert cluster.ctl("status").returncode == 0  # an operator's certificate is still good
