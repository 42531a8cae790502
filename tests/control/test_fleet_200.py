"""A small fleet in the default suite: 200 simulated agents against a real `twistd llmgw-server`.

The agents are bench/fleet.py's (real mutual-TLS sessions, each with its own
node certificate, registering recorded inventories and heartbeating every
second), in two worker processes: one sends its heartbeats as frames written
once (the benchmark's default), the other through autobahn's session.call.
What is checked is correctness, never speed: all register; both kinds of
heartbeat are answered and their figures reach the listing; a state change
reaches an operator's subscription; a paged listing returns every node
exactly once; a query that does not fit is refused in words.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import attrs

from bench.fleet import FIXTURES, MACHINES, Worker, heartbeat_variants, node_name
from llmgw.views import NodeBrief, NodeView
from llmgw.wire import from_wire
from tests.support.cluster import cluster, environment  # noqa: F401 - cluster is a fixture
from tests.support.wait import wait_for

SUBSCRIBER = """
import json, sys
from twisted.internet import defer, reactor
from llmgw.huburl import parse_hub_url
from llmgw.link.client import connect_once
from llmgw.tlsfiles import TLSFiles

async def main():
    s = await connect_once(reactor, parse_hub_url(sys.argv[1]), TLSFiles(*sys.argv[2:5]))
    await s.subscribe(lambda node, event: print(json.dumps(event), flush=True), "llmgw.event.node")
    print("subscribed", flush=True)

reactor.callWhenRunning(lambda: defer.ensureDeferred(main()).addErrback(lambda f: (f.printTraceback(), reactor.stop())))
reactor.run()
"""


def test_two_hundred_nodes_register_are_followed_and_are_listed_once_each(cluster):
    cluster.start_server()
    workers = [Worker(cluster.hub, cluster.pki, first, 100, 1.0, cluster.base / f"worker-{first}.log", ramp=2,
                      heartbeats=form) for first, form in ((0, "frames"), (100, "calls"))]
    subscriber = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, cluster.hub, str(cluster.pki / "ca.crt"),
         str(cluster.pki / "alice.crt"), str(cluster.pki / "alice.key")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(), start_new_session=True,
    )
    printed: list[str] = []
    threading.Thread(target=lambda: printed.extend(subscriber.stdout), daemon=True).start()
    try:
        wait_for(lambda: sum(w.registered() for w in workers) == 200, 90, "200 simulated agents to register",
                 detail=cluster.logs)
        wait_for(lambda: "subscribed\n" in printed, 30, "the operator's subscription", detail=lambda: "".join(printed))

        # Both workers' heartbeats are answered, none refused, and what they say reaches the listing:
        # every h100 node's GPU memory is a heartbeat's figure, not the recording's it registered with.
        recorded = json.loads((FIXTURES / "h100x8-ib-a-1.json").read_text())["gpus"]
        beaten = {v["gpus"][0]["memory_used_bytes"] for v in heartbeat_variants(recorded)}
        assert recorded[0]["memory_used_bytes"] not in beaten
        h100s = [node_name("sim", i) for i in range(200) if MACHINES[i % len(MACHINES)] == "h100x8-ib-a-1"]
        assert any(int(n[3:]) < 100 for n in h100s) and any(int(n[3:]) >= 100 for n in h100s)

        def heard_beats():
            listed = cluster.nodes()
            return listed if all(listed[n]["gpus"][0]["memory_used_bytes"] in beaten for n in h100s) else None

        everyone = wait_for(heard_beats, 30, "every h100 node's heartbeat figures in the listing", detail=cluster.logs)
        for w in workers:
            report = w.ask("report", "REPORT")
            assert report["beats"] > 0 and report["errors"] == {}, report
        assert sorted(everyone) == [node_name("sim", i) for i in range(200)]
        assert {n["state"] for n in everyone.values()} == {"ready"}

        # A page at a time, as a script would: every node exactly once, in id order.
        seen: list[str] = []
        after: list[str] = []
        while True:
            out = cluster.ctl("nodes", "--json", "--limit", "80", *after)
            assert out.returncode == 0, out.stderr
            page = [n["id"] for n in json.loads(out.stdout)]
            seen += page
            if len(page) < 80:
                break
            assert f"--after {page[-1]}" in out.stderr
            after = ["--after", page[-1]]
        assert seen == sorted(everyone)

        # The table reads each node's brief: what the whole views say, the GPUs counted and summed.
        table = cluster.ctl("nodes")
        assert table.returncode == 0, table.stderr
        rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:201]}
        assert sorted(rows) == sorted(everyone)
        assert all("8x H100 80GB HBM3 (" in rows[n] and " GB used)" in rows[n] for n in h100s)
        out = cluster.ctl("nodes", "--json", "--brief")
        assert out.returncode == 0, out.stderr
        briefs = {b["id"]: from_wire(NodeBrief, b) for b in json.loads(out.stdout)}
        assert sorted(briefs) == sorted(everyone)

        def steady(brief: NodeBrief) -> NodeBrief:  # what heartbeats move between the two listings, left aside
            gpus = brief.gpu_summary and attrs.evolve(brief.gpu_summary, memory_used_bytes=None)
            return attrs.evolve(brief, seen_ago_s=None, memory_available_bytes=None, gpu_summary=gpus)

        for node_id, view in everyone.items():
            assert steady(briefs[node_id]) == steady(NodeBrief.of(from_wire(NodeView, view))), node_id

        h100 = cluster.ctl("nodes", "--json", "--label", "gpu=h100")
        assert h100.returncode == 0, h100.stderr
        assert [n["id"] for n in json.loads(h100.stdout)] == [
            node_name("sim", i) for i in range(200) if MACHINES[i % len(MACHINES)].startswith("h100")]

        # kill -9 the second hundred's process: each of their links closes, and the operator hears it.
        workers[1].kill()

        def unreachable_events() -> set[str]:
            found = set()
            for line in list(printed):
                if line.startswith("{"):
                    event = json.loads(line)
                    if event["change"] == "state" and event["node"]["state"] == "unreachable":
                        found.add(event["node"]["id"])
            return found

        gone = {node_name("sim", i) for i in range(100, 200)}
        wait_for(lambda: unreachable_events() == gone, 60, "the operator to hear 100 nodes become unreachable",
                 detail=lambda: "".join(printed[-20:]))
        out = cluster.ctl("nodes", "--json", "--state", "unreachable")
        assert out.returncode == 0, out.stderr
        assert {n["id"] for n in json.loads(out.stdout)} == gone
        assert all(n["reason"] == "its link to the hub closed" for n in json.loads(out.stdout))

        refused = cluster.ctl("nodes", "--state", "sleeping")
        assert refused.returncode != 0
        assert "llmgw.cp.nodes: state 'sleeping' is none of ready, unreachable, lost" in refused.stderr
    finally:
        subscriber.kill()
        subscriber.wait(timeout=10)
        for w in workers:
            w.stop()
