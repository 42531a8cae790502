"""What a failover costs: two real servers on one etcd, the leader killed with 32 streams in flight through the standby.

    .venv/bin/python bench/failover.py [--runs 10] [--streams 32] [--hang]

Each run starts a one-member etcd, two servers with ``ha:`` (lease 4 s,
tests/support/ha.py's fleet: settle_s 3, settle_quiet_s 2), two agents given
both hubs and a sim model of two replicas; then 32 streams (40 tokens at 10
a second) and a loop of short requests run through the STANDBY's API while
the leader is killed (``kill -9``; ``--hang``: SIGSTOP).  Measured from the
kill, per run:

- failover: until etcd's ``/llmgw/leader`` names the standby (read directly,
  every 50 ms);
- agents back: until both agents' logs say they registered with it;
- placement resumes: until its log says the fleet has settled (from then it
  places and publishes the endpoint table) — once every node the old leader
  listed in etcd (``/llmgw/nodes``) has registered with it;
- failed: API requests (streams and short ones) that did not finish whole;
- started twice: engines whose pid changed (each agent's, from its marker).

Printed: a line per run, then p50 and max of each time and the totals, and
one JSON line.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support.cluster import Cluster  # noqa: E402
from tests.support.etcd import EtcdMember  # noqa: E402
from tests.support.ha import HAFleet  # noqa: E402
from tests.support.streams import Stream  # noqa: E402
from tests.support.wait import wait_for  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_failover import CATALOG, MODEL, WORDS  # noqa: E402


def leader_name(etcd_url: str) -> str | None:
    body = json.dumps({"key": base64.b64encode(b"/llmgw/leader").decode()}).encode()
    request = urllib.request.Request(etcd_url + "/v3/kv/range", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=1) as answer:
            kvs = json.loads(answer.read()).get("kvs", [])
    except OSError:
        return None
    return json.loads(base64.b64decode(kvs[0]["value"]))["name"] if kvs else None


def short_requests(port: int, stop: threading.Event, counts: dict) -> None:
    while not stop.is_set():
        s = Stream(port, MODEL, WORDS, 2)
        s.thread.join(30)
        counts["sent"] += 1
        if s.errors or not s.done:
            counts["failed"] += 1


def one_run(base: Path, pki: Path, hang: bool, n_streams: int) -> dict:
    etcd = EtcdMember(base / "etcd" / "data")
    etcd.start()
    cluster = Cluster(base, pki)
    try:
        from test_failover import start_pair

        fleet = start_pair(cluster, [etcd.client_url])
        a, b = fleet.servers["serverA"], fleet.servers["serverB"]
        pids = fleet.engine_pids()
        streams = [Stream(b.api_port, MODEL, WORDS, 40) for _ in range(n_streams)]
        wait_for(lambda: all(s.pieces for s in streams), 20, "streams in flight", interval=0.05)
        stop, counts = threading.Event(), {"sent": 0, "failed": 0}
        poller = threading.Thread(target=short_requests, args=(b.api_port, stop, counts), daemon=True)
        poller.start()
        kill_at = time.monotonic()
        if hang:
            os.killpg(a.proc.pid, signal.SIGSTOP)
        else:
            a.proc.kill(signal.SIGKILL)
        times: dict[str, float | None] = {"failover_s": None, "agents_back_s": None, "placement_s": None}
        logs = {node: cluster.agents[node] for node in ("node01", "node02")}
        deadline = kill_at + 150
        while time.monotonic() < deadline and None in times.values():
            now = time.monotonic() - kill_at
            if times["failover_s"] is None and leader_name(etcd.client_url) == "serverB":
                times["failover_s"] = now
            if times["agents_back_s"] is None and all(
                    f"registered again with the hub at {b.hub}" in p.output() for p in logs.values()):
                times["agents_back_s"] = now
            if times["placement_s"] is None and "serverB: the fleet has settled" in b.proc.output():
                times["placement_s"] = now
            time.sleep(0.05)
        for s in streams:
            s.thread.join(60)
        stop.set()
        poller.join(30)
        failed = sum(1 for s in streams if s.errors or not s.done or len(s.pieces) != 40) + counts["failed"]
        after = fleet.engine_pids()
        twice = sum(len(before - after.get(node, set())) for node, before in pids.items())
        if hang:
            os.killpg(a.proc.pid, signal.SIGCONT)
        return {**times, "requests": n_streams + counts["sent"], "failed": failed, "started_twice": twice}
    finally:
        cluster.stop()
        etcd.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--hang", action="store_true", help="SIGSTOP the leader rather than kill it")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="llmgw-failover-") as tmp:
        from tests.conftest import _make_pki

        pki = _make_pki(Path(tmp) / "ca" / "pki", "bench-failover")
        for run in range(args.runs):
            result = one_run(Path(tmp) / f"run{run}", pki, args.hang, args.streams)
            results.append(result)
            print(f"run {run + 1}: failover {result['failover_s']:.2f} s, agents back {result['agents_back_s']:.2f} s, "
                  f"placement resumes {result['placement_s']:.2f} s, {result['failed']} of {result['requests']} "
                  f"requests failed, {result['started_twice']} started twice", flush=True)

    def figures(key):
        values = [r[key] for r in results if r[key] is not None]
        return {"p50": round(statistics.median(values), 2), "max": round(max(values), 2)} if values else None

    summary = {"runs": len(results), "kill": "SIGSTOP" if args.hang else "SIGKILL",
               **{k: figures(k) for k in ("failover_s", "agents_back_s", "placement_s")},
               "requests": sum(r["requests"] for r in results), "failed": sum(r["failed"] for r in results),
               "started_twice": sum(r["started_twice"] for r in results)}
    for key in ("failover_s", "agents_back_s", "placement_s"):
        f = summary[key]
        print(f"{key}: p50 {f['p50']} s, max {f['max']} s" if f else f"{key}: not reached")
    print(f"requests through the standby: {summary['requests']}, failed {summary['failed']}; "
          f"replicas started twice: {summary['started_twice']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
