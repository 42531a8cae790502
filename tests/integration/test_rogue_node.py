"""A node certificate in the wrong hands cannot take over another model's traffic.

A real server and a real agent serve ``victim`` from a sim engine.  Then a
raw WAMP client — autobahn's asyncio flavour, not llmgw's agent — holding a
second node certificate from ``llmgw pki`` registers (claiming another
host's address) offering ``victim/0/0``
for adoption and reports it ready at an endpoint of its own (a listener
that counts what reaches it), with the oldest ``since`` there is.  Both
claims are refused in words; the router keeps sending victim's prompts to
the real replica (asked with the official openai client), and the real
engine is not stopped.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import pytest

from llmgw import pki as pkimod
from tests.integration.test_router import client, models
from tests.support.cluster import environment
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "8"]}
models:
  victim: {profile: sim-fast, replicas: 1}
"""
OTHER = """
  other: {profile: sim-fast, replicas: 1}
"""

ROGUE = r"""
import asyncio, json, ssl, sys
from autobahn.asyncio.wamp import ApplicationRunner, ApplicationSession
from autobahn.wamp.exception import ApplicationError

url, ca, cert, key, endpoint = sys.argv[1:]
spec = {"shard_id": "victim/0/0", "replica_id": "victim/0", "model": "victim", "engine": "sim"}
claim = {"spec": spec, "state": "ready", "pid": 1, "endpoint": endpoint, "since": 0.0}


class Rogue(ApplicationSession):
    async def onJoin(self, details):
        out = {}
        for name, uri, payload in [
            ("register", "llmgw.cp.agent.register", {"node_id": "rogue", "address": "10.1.2.3", "shards": [claim]}),
            ("shard_status", "llmgw.cp.agent.shard_status", claim),
        ]:
            try:
                out[name] = await self.call(uri, payload)
            except ApplicationError as e:
                out[name] = {"error": e.error, "words": e.args[0] if e.args else None}
        print(json.dumps(out), flush=True)
        # Stay connected, as a rogue would, until the test is done with us.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        self.leave()

    def onDisconnect(self):
        asyncio.get_event_loop().stop()


context = ssl.create_default_context(cafile=ca)
context.load_cert_chain(cert, key)
ApplicationRunner(url, "llmgw", ssl=context).run(Rogue)
"""


class Trap(http.server.ThreadingHTTPServer):
    """An endpoint of the rogue's choosing: counts every request that reaches it."""

    def __init__(self):
        self.hits = 0
        trap = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                trap.hits += 1
                self.send_response(500)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def replica(cluster, replica_id):
    views = json.loads(cluster.ctl("replicas", "--json").stdout)
    return next((v for v in views if v["replica"] == replica_id), None)


def serving(cluster, model):
    def ready():
        view = replica(cluster, f"{model}/0")
        return view if view and view["state"] == "ready" and model in models(cluster) else None

    return wait_for(ready, 60, f"the router to serve {model}", interval=0.3, detail=cluster.logs)


def test_a_rogue_node_certificate_cannot_take_over_a_models_traffic_nor_stop_its_replica(cluster):
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    cluster.write_server_config(CATALOG)
    assert cluster.ctl("reload").returncode == 0
    real = serving(cluster, "victim")
    (real_shard,) = real["shards"]
    assert client(cluster).chat.completions.create(model="victim", messages=[{"role": "user", "content": "hi"}])

    trap = Trap()
    pkimod.issue(cluster.pki, "rogue", "node")
    pki = cluster.pki
    rogue = subprocess.Popen(
        [sys.executable, "-c", ROGUE, cluster.hub, str(pki / "ca.crt"), str(pki / "rogue.crt"), str(pki / "rogue.key"),
         trap.url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment())
    try:
        line = rogue.stdout.readline()
        assert line, rogue.stderr.read()
        said = json.loads(line)

        # A change the router has to learn: once it serves `other`, the control
        # plane has ticked and published its table since the claims were made.
        cluster.write_server_config(CATALOG + OTHER)
        assert cluster.ctl("reload").returncode == 0
        serving(cluster, "other")

        sync = client(cluster)
        for i in range(5):
            reply = sync.chat.completions.create(model="victim", messages=[{"role": "user", "content": f"secret {i}"}])
            assert reply.choices[0].message.content
        assert trap.hits == 0
        after = replica(cluster, "victim/0")
        assert (after["state"], after["nodes"], after["endpoint"]) == ("ready", ["node01"], real["endpoint"])
        # Same engine, same pid: not stopped and started again (only its age has grown).
        assert [{**s, "age_s": None} for s in after["shards"]] == [{**real_shard, "age_s": None}]
        assert after["shards"][0]["age_s"] >= real_shard["age_s"]

        assert said["register"]["refused"] == {
            "victim/0/0": "rogue may not report victim/0/0: node01 already serves it, and the control plane "
                          "placed it there first"}
        assert said["shard_status"]["error"] == "llmgw.error.refused"
        assert said["shard_status"]["words"].startswith(
            "rogue may not report victim/0/0: the control plane did not place it on rogue")
        # The address it claimed is overruled by the one its link comes from, which the hub saw.
        assert cluster.nodes()["rogue"]["address"] == "127.0.0.1"
        log = cluster.server.output()
        assert "node rogue says its address is 10.1.2.3, and its link comes from 127.0.0.1" in log
        assert log.count("refused: rogue may not report victim/0/0") == 1, log[-3000:]
    finally:
        rogue.communicate("done\n", timeout=15)
        trap.shutdown()

