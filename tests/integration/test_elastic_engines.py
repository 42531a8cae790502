"""A request to a sleeping model served by a real engine is held while it loads, then answered: cold starts measured.

llama.cpp's llama-server with Gemma 3 270M, and vLLM for CPU with the tiny
random Llama (tests/integration/test_multinode_vllm.py's), each a model with
``replicas: {min: 0, max: 1}`` that sleeps until the request comes.  The
figure printed, request sent to first token through the router, is the one
docs/scaling.rst gives per engine.  Skips, saying what is missing, where an
engine is absent (fails under CI=true, tests/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.integration.test_multinode_vllm import ARGS as VLLM_ARGS
from tests.integration.test_multinode_vllm import SOURCE as TINY, hub, hub_root  # noqa: F401 - fixtures
from tests.support.elastic import replicas, timed_chat
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A sim model beside the real one: its answered cold start says the fleet has settled (fleet.settle_s), so the
# real engine's figure is its own start, not the server's settling.
PROBE = """  sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "2"]}
"""
PROBE_MODEL = "  probe: {profile: sim-fast, replicas: {min: 0, max: 1}}\n"


def cold_start(cluster, model: str, timeout: float) -> tuple[str, float]:
    assert timed_chat(cluster.api, "probe", "settled")[0] == "settled settled"
    (asleep,) = replicas(cluster, model)
    assert asleep["state"] == "sleeping" and asleep["shards"] == [], asleep
    text, first = timed_chat(cluster.api, model, "Say hello.", timeout=timeout, max_tokens=8)
    assert text.strip()
    (awake,) = replicas(cluster, model)
    assert awake["state"] == "ready"
    return text, first


@pytest.mark.llama_server
def test_a_sleeping_gemma_on_llama_server_wakes_for_a_request_and_answers_it(cluster, llama_server, gemma):
    catalog = f"""
profiles:
  gemma-cpu: {{engine: llama.cpp, args: ["-c", "2048", "-t", "2"], min_memory_gb: 1}}
{PROBE}models:
  gemma-3-270m: {{source: {gemma}, profile: gemma-cpu, replicas: {{min: 0, max: 1}}, scale: {{cold_start_timeout_s: 240}}}}
{PROBE_MODEL}"""
    start_fleet_with(cluster, catalog, f"engines:\n  llama.cpp: {{path: {llama_server}}}\n")
    text, first = cold_start(cluster, "gemma-3-270m", 300)
    print(f"\ncold start, llama.cpp + gemma-3-270m Q4_K_M: {first:.1f} s from the request to its first token ({text!r})")


@pytest.mark.vllm
def test_a_sleeping_tiny_model_on_vllm_cpu_wakes_for_a_request_and_answers_it(cluster, vllm_python, hub):  # noqa: F811
    catalog = f"""
profiles:
  tiny-cpu: {{engine: vllm, args: {VLLM_ARGS}, min_memory_gb: 1}}
{PROBE}models:
  tiny: {{source: "{TINY}", profile: tiny-cpu, replicas: {{min: 0, max: 1}}, scale: {{cold_start_timeout_s: 600}}}}
{PROBE_MODEL}"""
    start_fleet_with(cluster, catalog, f"engines:\n  vllm: {{path: {vllm_python}}}\n", {"HF_ENDPOINT": hub.url})
    text, first = cold_start(cluster, "tiny", 660)
    print(f"\ncold start, vLLM-CPU + tiny random Llama: {first:.1f} s from the request to its first token ({text!r})")


def start_fleet_with(cluster, catalog: str, agent_extra: str, env: dict | None = None) -> None:
    """One agent with a real engine configured, then *catalog*; every model in it asleep."""
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01", extra=agent_extra, env=env)
    cluster.wait_node("node01", "ready", timeout=60)
    cluster.write_server_config(catalog)
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: {r["state"] for r in replicas(cluster)} == {"sleeping"}, 30, "every model asleep", interval=0.5)
