"""A real server process: `llmgw pki revoke` then `llmgw ctl reload` ends a live node's link, without a restart;
the refused agent's log and `llmgw ctl` with a refused certificate say the hub's reason."""

from __future__ import annotations

import pytest

import datetime
import subprocess

from llmgw import pki
from tests.link.test_tls_revocation import ca_signed
from tests.support.cluster import cluster, environment  # noqa: F401 - a fixture
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration
DAY = datetime.timedelta(days=1)


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
    agent = cluster.agents["node01"]
    wait_for(lambda: "the hub refused the session: certificate CN=node01,OU=node,O=test-cluster: revoked on "
             in agent.output(), 20, "the agent to log the hub's reason", detail=cluster.logs)


def test_ctl_with_an_expired_certificate_prints_the_hub_s_reason(cluster):  # noqa: F811
    cluster.write_server_config()
    cluster.start_server()
    ca_signed(cluster.pki, "alice", ou="operator", valid_from=-3 * DAY, valid_for=DAY, name="alice-old")
    argv = [*cluster.ctl_argv(), "status"]
    argv[argv.index(str(cluster.pki / "alice.crt"))] = str(cluster.pki / "alice-old.crt")
    argv[argv.index(str(cluster.pki / "alice.key"))] = str(cluster.pki / "alice-old.key")
    out = subprocess.run(argv, capture_output=True, text=True, env=environment(), timeout=30)
    assert out.returncode == 3, out
    said = out.stderr.strip()
    assert "the hub refused the session: certificate CN=alice,OU=operator,O=prod: it has expired (on " in said, said
    assert "issue a new certificate with `llmgw pki issue DIR NAME --role ROLE --force` where the CA is" in said
    assert "Traceback" not in said
