"""An engine killed mid-answer under load, in a real cluster: how many streams went on elsewhere, and the pause each saw.

A server, two agents and two sim replicas of one model streaming 300 tokens at
60 a second; 32 clients stream through the server's router, and once each has
10 tokens one replica's engine is killed with SIGKILL, or its node drained.  Every stream must end
as the whole answer with its usage; the row says how many were continued
(their answer came from two engines, by ``system_fingerprint``) and the
longest pause each continued client saw, p50 and p99.
"""

from __future__ import annotations

import os
import signal
import statistics

import pytest

from llmgw.sim.api import reply_text
from tests.faults.bed import MODEL, Figures, orphaned, slots
from tests.support.streams import Stream
from tests.support.wait import wait_for

pytestmark = pytest.mark.faults

TOKENS = 300
WORDS = [f"w{i}" for i in range(37)]
CATALOG = f"""
profiles:
  sim-long: {{engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "60", "--output-tokens", "{TOKENS}", "--quiet"]}}
models:
  {MODEL}: {{profile: sim-long, replicas: 2}}
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@pytest.mark.parametrize("fault", ["kill", "drain"])
def test_an_engine_killed_or_drained_mid_answer_under_load_loses_no_stream(cluster, record_figures, fault):
    cluster.write_server_config(CATALOG.replace("models:", "router: {admission: {max_inflight_per_endpoint: 64}}\nmodels:"))
    cluster.start_server()
    for node in ("node01", "node02"):
        cluster.start_agent(node)
    for node in ("node01", "node02"):
        cluster.wait_node(node, "ready", timeout=60)
    ready = wait_for(lambda: (found := slots(cluster)) and len(found) == 2 and found, 90, "two ready replicas")
    streams = [Stream(cluster.api_port, MODEL, WORDS, TOKENS + 50) for _ in range(32)]
    wait_for(lambda: all(len(s.pieces) >= 10 for s in streams), 60, "every stream to have 10 tokens",
             detail=lambda: str([(len(s.pieces), s.errors) for s in streams]))
    victim = sorted(ready)[0]
    if fault == "kill":
        os.killpg(ready[victim].pid, signal.SIGKILL)
    else:
        # The node is cordoned and its replica stopped: its engine's connections close mid-answer.
        out = cluster.ctl("drain", ready[victim].node)
        assert out.returncode == 0, out.stderr
    for s in streams:
        s.thread.join(60)
    whole = reply_text(WORDS, TOKENS)
    failed = [s for s in streams if s.errors or not s.done or s.text != whole]
    continued = [s for s in streams if len(s.engines) > 1]
    gaps = [s.gap for s in continued]
    note = (f"{len(continued)} of {len(streams)} streams continued, {len(failed)} failed; longest pause of each "
            f"continued client p50 {percentile(gaps, 0.5) * 1000:.0f} ms, p99 {percentile(gaps, 0.99) * 1000:.0f} ms"
            if gaps else f"none continued, {len(failed)} failed")
    figures = record_figures(Figures(
        fault="engine kill -9 mid-answer (continued)" if fault == "kill" else "node drained mid-answer (continued)", requests=len(streams), cut=len(failed), before_bytes=0,
        elsewhere=0, outage=0, orphaned=len(orphaned(cluster)), started_twice=0,
        recover_s=None, note=note))
    assert failed == [], [(s.errors, len(s.text)) for s in failed]
    assert all(s.usage == {"prompt_tokens": len(WORDS), "completion_tokens": TOKENS,
                           "total_tokens": len(WORDS) + TOKENS} for s in streams)
    if fault == "kill":
        assert len(continued) >= 8, figures.note
        assert statistics.median(gaps) < 5, figures.note
