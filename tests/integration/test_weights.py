"""Weights end to end: a node fetches a model over HTTP with progress people can see, and gives back only what it fetched.

The model file is served by a small HTTP server this test starts on
127.0.0.1, which holds the download open part-way until the test has seen
its progress (see tests/support/modelfile.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from tests.support.cluster import environment
from tests.support.modelfile import ModelFile
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

SIZE = 3_000_000


@pytest.fixture
def model_server():
    """gemma-test.gguf, held at its first megabyte until the test releases it."""
    served = ModelFile("gemma-test.gguf", os.urandom(SIZE), stops=(1_000_000,)).start()
    yield served
    served.stop()


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
        assert model_server.reached == 1 and seen["progress"]["bytes_done"] <= 1_000_000  # still held
        assert seen["progress"]["bytes_total"] == SIZE
        assert seen["progress"]["file_name"] == "gemma-test.gguf"
        assert "downloading gemma-test.gguf" in seen["reason"] and f"/{SIZE // 1_000_000} MB" in seen["reason"]
        table = cluster.ctl("replicas").stdout
        assert "node01: downloading gemma-test.gguf" in table
        model_server.release()

        def ready():
            (r,) = replicas(cluster)
            return r["state"] == "ready" and r

        done = wait_for(ready, 60, "the replica to be ready after its download")
        assert done["progress"] is None  # a real transition clears it
        progress = [json.loads(line)["progress"] for line in printed if line.startswith("{")]
        sizes = [p["bytes_done"] for p in progress]
        assert len(progress) >= 2 and sizes == sorted(sizes)
        assert progress[-1]["final"] is True
        assert len(model_server.requests) == 1
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
    model_server.release()  # nothing to watch here: the whole file at once
    cluster.write_server_config(catalog(model_server.url, "0" * 64))
    assert cluster.ctl("reload").returncode == 0

    def failed():
        (r,) = replicas(cluster)
        return r["state"] == "failed" and r

    replica = wait_for(failed, 60, "the replica to fail on its checksum")
    assert "sha256" in replica["reason"]
    weights_dir = cluster.base / "node01" / "weights"
    assert [p.name for p in weights_dir.iterdir() if not p.name.endswith(".partial")] == []
