"""Two servers, one fleet (docs/operations.rst, "Two servers"): the leader dies or hangs, the standby takes over.

Real processes: one etcd member (three in the slow test), two servers with
``ha:``, two agents given both hubs, sim engines.  32 streams run through the
STANDBY's API while the leader is killed (or stopped); they must all finish,
the standby must lead within the lease and a few seconds, every agent must
register with it, and no engine may be started twice (each agent's engine
pids are the same before and after).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.support.etcd import etcd, etcd_cluster  # noqa: F401 - fixtures
from tests.support.ha import LEASE_S, HAFleet
from tests.support.streams import Stream
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

MODEL = "m"
WORDS = ["fail", "over"]
# Two replicas that answer 40 tokens over about 4 s each: streams in flight through a failover.
CATALOG = f"""profiles:
  sim-slow: {{engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "10", "--output-tokens", "40"]}}
models:
  {MODEL}: {{profile: sim-slow, replicas: 2}}
"""
#: How long after the lease a standby may take to lead (its campaign every lease_s / 3, a ctl round trip).
SLACK_S = 4
#: How long an agent's link takes to notice a hung hub: its WebSocket ping's interval and timeout (link/client.py).
PING_S = 10 + 20


def start_pair(cluster, urls) -> HAFleet:
    fleet = HAFleet(cluster, urls)
    a, b = fleet.servers["serverA"], fleet.servers["serverB"]
    a.start(CATALOG)
    assert fleet.wait_leader([a]) is a
    b.start(CATALOG)
    wait_for(lambda: b.role() == "standby", 20, "serverB to stand by", interval=0.2, detail=cluster.logs)
    for node in ("node01", "node02"):
        fleet.start_agent(node)
    fleet.wait_nodes_ready(a, ["node01", "node02"])
    fleet.wait_ready(a, MODEL, 2)
    # The standby's router serves the leader's table, from etcd.
    probe = Stream(b.api_port, MODEL, WORDS, 2)
    probe.thread.join(20)
    assert probe.errors == [] and probe.text, (probe.errors, cluster.logs())
    return fleet


def streams_through(server, n: int = 32) -> list[Stream]:
    streams = [Stream(server.api_port, MODEL, WORDS, 40) for _ in range(n)]
    wait_for(lambda: sum(len(s.pieces) > 0 for s in streams) == n, 20, f"{n} streams in flight", interval=0.05)
    return streams


def check_streams(streams, cluster) -> None:
    for s in streams:
        s.thread.join(60)
    failed = [s.errors for s in streams if s.errors or not s.done]
    assert failed == [], (failed, cluster.logs())
    assert all(len(s.pieces) == 40 for s in streams)


def failover(cluster, urls, stop_leader, agents_within: float | None = None) -> tuple[HAFleet, float]:
    fleet = start_pair(cluster, urls)
    a, b = fleet.servers["serverA"], fleet.servers["serverB"]
    pids = fleet.engine_pids()
    assert all(len(p) == 1 for p in pids.values()), pids
    streams = streams_through(b)
    started = time.monotonic()
    stop_leader(a)
    wait_for(lambda: b.role() == "leader", LEASE_S + SLACK_S + 6, "serverB to lead", interval=0.1,
             detail=cluster.logs)
    took = time.monotonic() - started
    assert took <= LEASE_S + SLACK_S, f"serverB led {took:.1f} s after serverA stopped"
    check_streams(streams, cluster)
    # Killed, the leader's sockets close and the agents dial on at once; hung, each agent waits out its
    # WebSocket ping (10 + 20 s), then dials the next hub first: the new leader.
    back = re.compile(rf"registered( again)? with the hub at {re.escape(b.hub)}")
    wait_for(lambda: all(back.search(cluster.agents[n].output()) for n in ("node01", "node02")), 120,
             "both agents to register with serverB", interval=0.1, detail=cluster.logs)
    agents_back = time.monotonic() - started
    assert agents_within is None or agents_back <= agents_within, (
        f"the agents were back {agents_back:.1f} s after serverA stopped, more than {agents_within} s")
    fleet.wait_nodes_ready(b, ["node01", "node02"], timeout=30)
    fleet.wait_ready(b, MODEL, 2, timeout=30)
    assert fleet.engine_pids() == pids  # adopted, not started again
    after = streams_through(b, 8)  # and the new leader's table serves
    check_streams(after, cluster)
    return fleet, took


@pytest.mark.slow
def test_the_leader_killed_the_standby_leads_adopts_the_fleet_and_no_stream_through_it_fails(cluster, etcd):
    fleet, took = failover(cluster, [etcd.client_url], lambda a: a.proc.kill(signal.SIGKILL))
    b = fleet.servers["serverB"]
    events = b.ctl_json("events")
    assert not [e for e in events if e["kind"] in ("placed", "started")], events


@pytest.mark.slow
def test_the_leader_stopped_then_resumed_does_not_act_and_stands_by(cluster, etcd):
    def sigstop(a):
        os.killpg(a.proc.pid, signal.SIGSTOP)

    # Back within the lease (long over by then), the ping, and a few seconds: the backoff and one registration.
    fleet, took = failover(cluster, [etcd.client_url], sigstop, agents_within=LEASE_S + PING_S + SLACK_S)
    a, b = fleet.servers["serverA"], fleet.servers["serverB"]
    pids = fleet.engine_pids()
    os.killpg(a.proc.pid, signal.SIGCONT)
    wait_for(lambda: a.role() == "standby", 20, "serverA, resumed, to stand by", interval=0.2, detail=cluster.logs)
    assert "serverA no longer leads" in a.proc.output()
    # It commands nothing: any command it had begun is refused by the agents' fence, none changes a node.
    assert fleet.engine_pids() == pids
    out = a.ctl("drain", "node01")
    assert out.returncode != 0 and "standby; the leader is serverB" in out.stderr, out.stderr
    assert b.ctl_json("status")["servers"][1]["role"] == "leader"


@pytest.mark.slow
def test_a_three_member_etcd_loses_its_leader_member_and_the_servers_carry_on(cluster, etcd_cluster):
    urls = [m.client_url for m in etcd_cluster]
    fleet = start_pair(cluster, urls)
    a = fleet.servers["serverA"]
    leader_member = next(m for m in etcd_cluster if _is_etcd_leader(m.client_url))
    leader_member.proc.kill()
    leader_member.proc.wait(10)
    streams = streams_through(fleet.servers["serverB"])
    check_streams(streams, cluster)
    # etcd elected another member; the servers' leases renewed through it: the same leader, commanding.
    assert fleet.wait_leader() is a
    assert "stepped down" not in a.proc.output()


def _is_etcd_leader(url: str) -> bool:
    import json
    import urllib.request

    request = urllib.request.Request(url + "/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        status = json.loads(answer.read())
    return status.get("leader") == status.get("header", {}).get("member_id")
