"""A node fetches a whole repository from a hub mirror, shows its progress, serves it and says it holds it.

Real processes: the server, an agent whose HF_ENDPOINT is the mirror
(tests/support/hfmirror.py), and ``llmgw ctl``; the mirror holds the
weights file part-way until the test has seen the progress of the whole.
"""

from __future__ import annotations

import json

import pytest

from llmgw.weightnames import cache_name
from tests.support.hfmirror import HubMirror
from tests.support.wait import wait_for

from .test_repository import SOURCE, WEIGHTS_PATH, tiny_repo

pytestmark = pytest.mark.integration

CATALOG = f"""
profiles:
  sim-fast: {{engine: sim, args: ["--ttft-ms", "0"]}}
models:
  tiny: {{source: "{SOURCE}", profile: sim-fast, replicas: 1}}
"""


@pytest.mark.slow
def test_a_node_fetches_a_repository_from_the_mirror_then_serves_and_holds_it(cluster, tmp_path):
    tiny_repo(tmp_path / "hub")
    total = sum(p.stat().st_size for p in (tmp_path / "hub").rglob("*") if p.is_file())
    with HubMirror(tmp_path / "hub") as hub:
        hub.hold(WEIGHTS_PATH, 500_000)
        cluster.write_server_config(CATALOG)
        cluster.start_server()
        cluster.start_agent("node01", env={"HF_ENDPOINT": hub.url})
        cluster.wait_node("node01", "ready")

        def fetching():
            (r,) = json.loads(cluster.ctl("replicas", "--json").stdout)
            progress = r["progress"]
            return r["state"] == "fetching" and progress and progress["bytes_done"] > 0 and r

        seen = wait_for(fetching, 30, "the repository's download to show in ctl replicas")
        assert hub.reached(WEIGHTS_PATH) == 1
        assert seen["progress"]["bytes_total"] == total and seen["progress"]["bytes_done"] < total
        assert "downloading tiny-llama" in seen["reason"]
        hub.release(WEIGHTS_PATH)

        def ready():
            (r,) = json.loads(cluster.ctl("replicas", "--json").stdout)
            return r["state"] == "ready" and r

        wait_for(ready, 60, "the replica to be ready after its repository arrived")
        fetched = cluster.base / "node01" / "weights" / cache_name(SOURCE)
        assert (fetched / "model.safetensors").stat().st_size == 1_000_000

        def held():
            weights = cluster.nodes()["node01"]["weights"]
            return [d for d in weights["directories"] if d["path"] == str(fetched)]

        (directory,) = wait_for(held, 20, "the node to report the repository's directory")
        assert directory["size_bytes"] == total
        assert len([s for s in hub.seen(WEIGHTS_PATH) if s["method"] == "GET"]) == 1
