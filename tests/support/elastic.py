"""Helpers for the elastic-replica tests (docs/scaling.rst): a fleet whose capacity is counted in fake GPUs.

Each agent reports the eight H100s of ``tests/fixtures/nvml/h100x8.json``;
a profile with ``gpus: 4`` then fits two replicas on a node, whatever the
machine running the tests has.  Everything else is ``tests/support/cluster.py``'s
real processes; these only read what ``llmgw ctl`` prints.
"""

from __future__ import annotations

import json
import time
import urllib.request

import openai

from tests.support.cluster import ROOT, Cluster, Process, environment, twistd
from tests.support.net import free_port
from tests.support.wait import wait_for

H100X8 = str(ROOT / "tests" / "fixtures" / "nvml" / "h100x8.json")


def start_fleet(cluster: Cluster, catalog: str, nodes: tuple[str, ...] = ("node01", "node02")) -> None:
    """A server with *nodes* ready, each with eight fake H100s, then *catalog* loaded."""
    cluster.write_server_config("")
    cluster.start_server()
    for node in nodes:
        cluster.start_agent(node, env={"LLMGW_FAKE_NVML": H100X8})
    for node in nodes:
        cluster.wait_node(node, "ready", timeout=60)
    cluster.write_server_config(catalog)
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr


def replicas(cluster: Cluster, model: str | None = None) -> list[dict]:
    out = cluster.ctl("replicas", "--json")
    assert out.returncode == 0, out.stderr
    return [r for r in json.loads(out.stdout) if model is None or r["model"] == model]


def events(cluster: Cluster, kind: str | None = None, model: str | None = None) -> list[dict]:
    out = cluster.ctl("events", "--json")
    assert out.returncode == 0, out.stderr
    return [e for e in json.loads(out.stdout)
            if (kind is None or e["kind"] == kind) and (model is None or e.get("model") == model)]


def count_ready(cluster: Cluster, model: str) -> int:
    return sum(1 for r in replicas(cluster, model) if r["state"] == "ready")


def wait_ready_count(cluster: Cluster, model: str, count: int, timeout: float = 90) -> list[dict]:
    def check():
        found = [r for r in replicas(cluster, model) if r["state"] == "ready"]
        return found if len(found) == count else None

    return wait_for(check, timeout, f"{count} ready replica(s) of {model}", interval=0.3,
                    detail=lambda: json.dumps(replicas(cluster), indent=1) + "\n" + cluster.logs())


def client(base_url: str, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def timed_chat(base_url: str, model: str, prompt: str = "hello there", timeout: float = 120,
               max_tokens: int | None = None) -> tuple[str, float]:
    """The reply of a streamed chat request and the seconds from sending it to its first byte of content."""
    began = time.monotonic()
    first = None
    parts = []
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    stream = client(base_url, timeout).chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], stream=True, **extra)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.monotonic() - began
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts), first if first is not None else time.monotonic() - began


def models_listed(base_url: str) -> list[str]:
    with urllib.request.urlopen(base_url + "/v1/models", timeout=10) as r:
        return sorted(m["id"] for m in json.load(r)["data"])


def hub_router(cluster: Cluster, name: str = "router") -> str:
    """A ``twistd llmgw-router`` worker on the cluster's hub (certificate r1); its API's base URL.

    It is one of the cluster's processes, stopped with them.
    """
    port = free_port()
    config = cluster.base / f"{name}.yaml"
    config.write_text(f"""listen: {{api: "tcp:{port}:interface=127.0.0.1", admin: null}}
hub: "{cluster.hub}"
tls: {{ca: pki/ca.crt, cert: pki/r1.crt, key: pki/r1.key}}
""")
    proc = Process(name, twistd("llmgw-router", config), cluster.base / f"{name}.log", environment()).start()
    cluster.processes.append(proc)
    return f"http://127.0.0.1:{port}"
