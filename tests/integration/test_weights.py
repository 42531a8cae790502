"""Weights end to end: a node fetches a model over HTTP with progress people can see, and gives back only what it fetched.

The model file is served by a small HTTP server this test starts on
127.0.0.1, throttled so the download lasts long enough to be watched.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from harness import environment, wait_for

pytestmark = pytest.mark.integration

SIZE = 3_000_000


class _Slow(http.server.BaseHTTPRequestHandler):
    payload = b""
    chunk = 100_000
    pause = 0.1  # ~1 MB/s: the server's pace, not the test's waiting
    requests: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        for start in range(0, len(self.payload), self.chunk):
            try:
                self.wfile.write(self.payload[start:start + self.chunk])
                self.wfile.flush()
            except OSError:
                return
            time.sleep(self.pause)

    def log_message(self, *args):
        pass


@pytest.fixture
def model_server():
    payload = os.urandom(SIZE)
    handler = type("Handler", (_Slow,), {"payload": payload, "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/gemma-test.gguf"
    server.sha256 = hashlib.sha256(payload).hexdigest()
    server.handler = handler
    yield server
    server.shutdown()


def catalog(url: str, sha256: str) -> str:
    return f"""
profiles:
  sim-fast: {{engine: sim, args: ["--ttft-ms", "0"]}}
models:
  fetched: {{source: "{url}", sha256: "{sha256}", profile: sim-fast, replicas: 1}}
"""


def replicas(cluster) -> list[dict]:
    return json.loads(cluster.ctl("replicas", "--json").stdout)


EVENTS = """
import json, sys
from twisted.internet import task, defer
from llmgw.huburl import parse_hub_url
from llmgw.link.client import connect_once
from llmgw.tlsfiles import TLSFiles

async def main(reactor):
    hub, ca, cert, key = sys.argv[1:5]
    s = await connect_once(reactor, parse_hub_url(hub), TLSFiles(ca, cert, key))
    await s.subscribe(lambda node, event: print(json.dumps(event), flush=True), "llmgw.event.progress")
    print("subscribed", flush=True)
    await task.deferLater(reactor, 60, lambda: None)

task.react(lambda r: defer.ensureDeferred(main(r)))
"""


def test_a_node_fetches_a_model_with_visible_progress_then_serves_it(cluster, model_server):
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    events = subprocess.Popen(
        [sys.executable, "-c", EVENTS, cluster.hub, str(cluster.pki / "ca.crt"), str(cluster.pki / "alice.crt"),
         str(cluster.pki / "alice.key")], stdout=subprocess.PIPE, text=True, env=environment())
    printed: list[str] = []
    threading.Thread(target=lambda: printed.extend(events.stdout), daemon=True).start()
    try:
        wait_for(lambda: "subscribed\n" in printed, 20, "the event subscriber")
        cluster.write_server_config(catalog(model_server.url, model_server.sha256))
        assert cluster.ctl("reload").returncode == 0

        def fetching():
            (r,) = replicas(cluster)
            return r["state"] == "fetching" and r["progress"] and r["progress"]["bytes_done"] > 0 and r

        seen = wait_for(fetching, 30, "the download to show in ctl replicas")
        assert seen["progress"]["bytes_total"] == SIZE
        assert seen["progress"]["file_name"] == "gemma-test.gguf"
        assert "downloading gemma-test.gguf" in seen["reason"] and f"/{SIZE // 1_000_000} MB" in seen["reason"]
        table = cluster.ctl("replicas").stdout
        assert "node01: downloading gemma-test.gguf" in table

        def ready():
            (r,) = replicas(cluster)
            return r["state"] == "ready" and r

        done = wait_for(ready, 60, "the replica to be ready after its download")
        assert done["progress"] is None  # a real transition clears it
        progress = [json.loads(line)["progress"] for line in printed if line.startswith("{")]
        sizes = [p["bytes_done"] for p in progress]
        assert len(progress) >= 2 and sizes == sorted(sizes)
        assert progress[-1]["final"] is True
        assert len(model_server.handler.requests) == 1
    finally:
        events.terminate()
        events.wait(timeout=10)

    # The node now says it holds them.
    weights = cluster.nodes()["node01"]["weights"]
    (held,) = [f for f in weights["files"] if f["path"].endswith("gemma-test.gguf")]
    assert held["size_bytes"] == SIZE

    # An operator's file beside it is never llmgw's to take back.
    operator = cluster.base / "node01" / "weights" / "copied-by-hand.gguf"
    operator.write_bytes(b"weights somebody copied")

    cluster.write_server_config("")  # nobody wants the model any more
    assert cluster.ctl("reload").returncode == 0
    listed = wait_for(lambda: json.loads(cluster.ctl("weights", "--json").stdout)["unwanted"].get("node01"), 30,
                      "ctl weights to list the unwanted file")
    assert [f["path"] for f in listed] == [held["path"]]
    out = cluster.ctl("weights", "--collect")
    assert out.returncode == 0, out.stderr
    assert "asked to remove 1 file(s) on 1 node(s): 1 removed" in out.stdout
    assert not os.path.exists(held["path"])
    assert operator.read_bytes() == b"weights somebody copied"


def test_a_wrong_sha256_is_refused_and_leaves_nothing_under_the_final_name(cluster, model_server):
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    cluster.write_server_config(catalog(model_server.url, "0" * 64))
    assert cluster.ctl("reload").returncode == 0

    def failed():
        (r,) = replicas(cluster)
        return r["state"] == "failed" and r

    replica = wait_for(failed, 60, "the replica to fail on its checksum")
    assert "sha256" in replica["reason"]
    weights_dir = cluster.base / "node01" / "weights"
    assert [p.name for p in weights_dir.iterdir() if not p.name.endswith(".partial")] == []
