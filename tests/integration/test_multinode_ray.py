"""Real Ray: two agents on this machine form a two-node Ray cluster for one replica with launcher: ray.

vLLM's CPU build refuses the Ray executor, so rank 0 runs a stand-in for vLLM
(tests/support/raystandin.py) from the Ray environment: it answers a
completion only after a task ran on each node, so an answer proves the
cluster formed.  Everything else is the real path: rank 0's head script,
``ray start --address … --block`` on rank 1, readiness asked of the head with
the environment's Python, each node in its own --temp-dir.  Skips, saying
why, without .engines/ray.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import openai
import psutil
import pytest

from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAKE_SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "connectx7-ib-400g"
STANDIN = ROOT / "tests" / "support" / "raystandin.py"
READY_S = 300


def executable(path: Path, body: str) -> str:
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def ray_vllm(ray_python, tmp_path):
    """A directory laid out as vLLM's environment: ``vllm`` (the stand-in), ``ray`` and ``python`` beside it."""
    bin_dir = tmp_path / "ray-env" / "bin"
    bin_dir.mkdir(parents=True)
    ray = Path(ray_python).with_name("ray")
    executable(bin_dir / "python", f'#!/bin/sh\nexec {ray_python} "$@"\n')
    executable(bin_dir / "ray", f'#!/bin/sh\nexec {ray} "$@"\n')
    return executable(bin_dir / "vllm", f'#!/bin/sh\nexec {ray_python} {STANDIN} "$@"\n')


def replica(cluster):
    out = cluster.ctl("replicas", "--json")
    assert out.returncode == 0, out.stderr
    return next((r for r in json.loads(out.stdout) if r["model"] == "tiny"), None)


def groups_of(states) -> set[int]:
    """The process groups of every engine the agents' records name."""
    return {json.loads(p.read_text())["pid"] for s in states for p in (s / "shards").glob("*.json")}


def members(pgids) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def test_two_agents_form_a_ray_cluster_and_losing_the_workers_agent_fails_the_replica(cluster, ray_vllm, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    cluster.write_server_config(f"""
profiles:
  tiny-ray: {{engine: vllm, ranks: 2, launcher: ray, min_memory_gb: 1}}
models:
  tiny: {{source: {model}, profile: tiny-ray, replicas: 1}}
""")
    cluster.start_server()
    env = {"LLMGW_FAKE_SYSFS": str(FAKE_SYSFS)}
    extra = f"engines:\n  vllm: {{path: {ray_vllm}}}\nfabrics: {{mlx5_5: fab-a}}\n"
    for node in ("node01", "node02"):
        cluster.start_agent(node, extra=extra, env=env)

    def ready():
        found = replica(cluster)
        return found if found and found["state"] == "ready" else None

    first = wait_for(ready, READY_S, "the Ray replica to be ready", interval=1,
                     detail=lambda: f"{replica(cluster)}\n{cluster.logs()}")
    assert sorted(first["nodes"]) == ["node01", "node02"]
    client = openai.OpenAI(base_url=cluster.api + "/v1", api_key="unused", max_retries=0, timeout=120)
    # The stand-in answers only once a task ran on each of the two nodes.
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=3).choices[0].text == "2 nodes answered"

    states = [cluster.base / n / "state" for n in ("node01", "node02")]
    engines = groups_of(states)
    assert len(engines) == 2
    worker_node = next(n for n in first["nodes"] if n != first["nodes"][0])
    cluster.agents[worker_node].kill(signal.SIGKILL)

    def failed_without_the_worker():
        found = replica(cluster)
        if found is None or found["state"] == "ready":
            return None
        return found if worker_node not in found["nodes"] else None

    wait_for(failed_without_the_worker, 60, f"the replica to fail and drop {worker_node}'s rank", interval=1,
             detail=lambda: f"{replica(cluster)}\n{cluster.logs()}")
    # The killed agent's Ray worker outlived it, as engines outlive their agent.  Started
    # again, as its unit would be, the agent adopts it and the control plane has it
    # stopped: the replica it belonged to is gone.
    orphan = groups_of([cluster.base / worker_node / "state"])
    assert orphan and members(orphan)
    cluster.start_agent(worker_node, extra=extra, env=env)
    wait_for(lambda: members(orphan) == [], 120, f"{worker_node}'s orphaned Ray worker to be stopped", interval=1,
             detail=lambda: f"{replica(cluster)}\n{cluster.logs()}")
    engines |= groups_of(states)
    cluster.stop()
    wait_for(lambda: members(engines) == [], 60, "every engine process to end with its agent",
             interval=0.5, detail=lambda: str(members(engines)))
