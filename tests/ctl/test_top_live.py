"""A known traffic pattern shows in `ctl top --json` and in `llmgw.cp.figures`: a real server, agent, sims and client.

A client sends 5 requests a second to model ``a`` and 2 a second to ``b``,
every one with the key ``team``, for as long as it takes a whole 10 s bucket
to close inside the traffic.  The figures of that bucket must be the rates
sent, within 20 %: a bucket holds the differences of the ten router reports
that arrived in it, so its edges may move a request or two either way.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.support.cluster import environment
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

TOKEN = "sk-llmgw-top-token"
RATES = {"a": 5.0, "b": 2.0}
TOLERANCE = 0.2
BUCKET_S = 10.0
CATALOG = f"""
profiles:
  sim-a: {{engine: sim, args: ["--ttft-ms", "30", "--output-tokens", "4"]}}
  sim-b: {{engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "4"]}}
models:
  a: {{profile: sim-a, replicas: 1}}
  b: {{profile: sim-b, replicas: 1}}
router:
  keys:
    - {{name: team, sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}
"""


class Traffic:
    """Requests at fixed times, each on its own thread, so a slow answer never delays the next one's start."""

    def __init__(self, api: str):
        self.api = api
        self.stopping = threading.Event()
        self.answered = {model: 0 for model in RATES}
        self.failed: list[str] = []
        self.started = time.time()
        self.threads = [threading.Thread(target=self._send, args=(model, rate), daemon=True)
                        for model, rate in RATES.items()]

    def start(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def _send(self, model: str, rate: float) -> None:
        n = 0
        while not self.stopping.is_set():
            delay = self.started + n / rate - time.time()
            if delay > 0 and self.stopping.wait(delay):
                return
            threading.Thread(target=self._one, args=(model,), daemon=True).start()
            n += 1

    def _one(self, model: str) -> None:
        # a's answers stream (a router times the first token of a streamed answer only); b's do not.
        chat: dict = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if model == "a":
            chat.update(stream=True, stream_options={"include_usage": True})
        body = json.dumps(chat).encode()
        request = urllib.request.Request(self.api + "/v1/chat/completions", data=body, method="POST",
                                         headers={"content-type": "application/json",
                                                  "authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                r.read()
            self.answered[model] += 1
        except OSError as e:
            self.failed.append(f"{model}: {e}")

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(5)


FIGURES = """
import json, sys
from twisted.internet import defer, task
from llmgw.config.ctl import resolve_ctl_settings
from llmgw.huburl import parse_hub_url
from llmgw.link import uris
from llmgw.link.client import connect_once

async def main(reactor):
    given = resolve_ctl_settings(hub=sys.argv[1], ca=sys.argv[2], cert=sys.argv[3], key=sys.argv[4])
    session = await connect_once(reactor, parse_hub_url(given.hub), given.tls)
    try:
        print(json.dumps(await session.call(uris.CP_FIGURES, scope="model", buckets=int(sys.argv[5]))))
    finally:
        session.leave()

task.react(main)
"""


def cp_figures(cluster, buckets: int) -> dict:
    pki = cluster.pki
    out = subprocess.run([sys.executable, "-c", FIGURES, cluster.hub, str(pki / "ca.crt"), str(pki / "alice.crt"),
                          str(pki / "alice.key"), str(buckets)], capture_output=True, text=True, env=environment(),
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def top(cluster) -> dict:
    out = cluster.ctl("top", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def start(cluster) -> None:
    cluster.write_server_config()
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    cluster.write_server_config(CATALOG)
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr

    def ready():
        views = json.loads(cluster.ctl("replicas", "--json").stdout)
        return {v["model"] for v in views if v["state"] == "ready"} == set(RATES)

    wait_for(ready, 60, "a ready replica of a and of b", interval=0.3, detail=cluster.logs)


def near(value, expected: float) -> bool:
    return value is not None and abs(value - expected) <= TOLERANCE * expected


@pytest.mark.slow
def test_a_fixed_rate_shows_in_ctl_top_and_in_the_figures(cluster):
    start(cluster)
    traffic = Traffic(cluster.api).start()
    try:
        # Wait for the newest closed bucket to lie wholly inside the traffic (a second after it began:
        # the routers' first reports), then read it while the traffic goes on.
        shown = wait_for(lambda: (t := top(cluster))["end"] - BUCKET_S >= traffic.started + 1 and t, 40,
                         "a bucket wholly inside the traffic", interval=1.0, detail=cluster.logs)
        figures = cp_figures(cluster, buckets=1)
    finally:
        traffic.stop()
    assert not traffic.failed, traffic.failed[:5]
    assert shown["bucket_s"] == BUCKET_S
    models = shown["model"]
    for model, rate in RATES.items():
        assert near(models[model]["requests_per_s"], rate), (model, models[model])
        assert near(models[model]["tokens_out_per_s"], 4 * rate), (model, models[model])
        assert models[model]["errors_per_s"] == 0
        assert models[model]["queue"] == 0
    # The sim waits 30 ms before a's first token: its median is in the 25-50 ms bucket.
    assert 25 <= models["a"]["ttft_p50_ms"] <= 50, models["a"]
    assert models["b"]["ttft_p50_ms"] is None, models["b"]  # nothing streamed: no first token timed, not 0 ms
    assert near(shown["key"]["team"]["requests_per_s"], sum(RATES.values())), shown["key"]
    assert set(shown["node"]) == {"node01"}
    assert 0 < shown["node"]["node01"]["memory_used_pct"] < 100
    assert shown["node"]["node01"]["gpu_util_pct"] is None  # no GPU here: unknown, not 0 %

    # llmgw.cp.figures says the same of the models, for a bucket at most one later.
    assert figures["end"] - shown["end"] in (0, BUCKET_S)
    rates = {(s["subject"], s["name"]): s["points"][-1] for s in figures["series"]}
    assert {s["scope"] for s in figures["series"]} == {"model"}
    for model, rate in RATES.items():
        assert near(rates[(model, "requests_per_s")], rate), rates

    # The table a person reads has both models and the node.
    out = cluster.ctl("top")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.split()}
    assert {"a", "b", "team", "node01"} <= set(rows)
