"""Replicas end to end: sim engines placed by the control plane, run by real agents.

The server, agents and engines are real processes on 127.0.0.1; the engines
are llmgw's sim, reached with the official openai client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import openai
import pytest

from tests.support.cluster import environment
from tests.support.procs import alive
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 2}
"""


def replicas(cluster) -> list[dict]:
    out = cluster.ctl("replicas", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_ready(cluster, count: int, model: str = "echo", timeout: float = 60) -> list[dict]:
    def ready():
        found = [r for r in replicas(cluster) if r["model"] == model and r["state"] == "ready"]
        return found if len(found) == count else None

    try:
        return wait_for(ready, timeout, f"{count} ready replicas of {model}", interval=0.3)
    except AssertionError:
        raise AssertionError(f"{json.dumps(replicas(cluster), indent=1)}\n{cluster.logs()}") from None


def complete(endpoint: str, model: str = "echo") -> str:
    client = openai.OpenAI(base_url=endpoint + "/v1", api_key="unused", max_retries=0, timeout=10)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello there"}])
    return reply.choices[0].message.content


def pid_of(replica: dict) -> int:
    (shard,) = replica["shards"]
    return shard["pid"]


def two_nodes(cluster, catalog: str = CATALOG):
    """A server with both nodes ready, then *catalog* loaded: placement sees the whole fleet."""
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.start_agent("node02")
    cluster.wait_node("node01", "ready")
    cluster.wait_node("node02", "ready")
    cluster.write_server_config(catalog)
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr


def test_a_model_with_two_replicas_lands_on_both_nodes_and_serves(cluster):
    two_nodes(cluster)
    ready = wait_ready(cluster, 2)
    assert sorted(r["nodes"][0] for r in ready) == ["node01", "node02"]  # spread
    for replica in ready:
        assert replica["endpoint"].startswith("http://127.0.0.1:")
        assert replica["stale"] is False
        assert complete(replica["endpoint"])
    status = json.loads(cluster.ctl("status", "--json").stdout)
    (echo,) = status["models"]
    assert (echo["model"], echo["desired"], echo["ready"]) == ("echo", 2, 2)
    table = cluster.ctl("replicas").stdout
    assert "echo/0" in table and "echo/1" in table and "ready" in table


def test_a_killed_engine_is_restarted_and_serves_again(cluster):
    two_nodes(cluster)
    first = wait_ready(cluster, 2)[0]
    old = pid_of(first)
    os.killpg(old, signal.SIGKILL)

    def replaced():
        found = [r for r in replicas(cluster) if r["replica"] == first["replica"]]
        return found and found[0]["state"] == "ready" and pid_of(found[0]) != old and found[0]

    again = wait_for(replaced, 60, "the killed engine to be replaced", interval=0.3)
    assert complete(again["endpoint"])


def test_a_restarted_agent_adopts_its_engine_and_can_stop_it(cluster):
    cluster.write_server_config(CATALOG.replace("replicas: 2", "replicas: 1"))
    cluster.start_server()
    agent = cluster.start_agent("node01")
    (replica,) = wait_ready(cluster, 1)
    engine = pid_of(replica)

    agent.kill()
    assert alive(engine)
    assert complete(replica["endpoint"])  # serves with its agent gone

    agent = cluster.start_agent("node01")
    wait_for(lambda: "adopted echo/0/0" in agent.output(), 30, "the new agent to adopt the engine")
    (again,) = wait_ready(cluster, 1)
    assert pid_of(again) == engine  # the same engine, no second one
    assert complete(again["endpoint"])

    cluster.write_server_config("")  # the model leaves the catalog
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr
    assert "model echo removed" in out.stdout
    wait_for(lambda: not alive(engine), 30, "the adopted engine to be stopped")
    wait_for(lambda: replicas(cluster) == [], 30, "the replica to disappear")


def test_a_restarted_server_rebuilds_replicas_from_the_agents_and_starts_nothing_twice(cluster):
    two_nodes(cluster)
    before = {r["replica"]: pid_of(r) for r in wait_ready(cluster, 2)}
    cluster.server.stop()
    for pid in before.values():
        assert alive(pid)
    cluster.start_server()
    after = {r["replica"]: pid_of(r) for r in wait_ready(cluster, 2, timeout=60)}
    assert after == before
    log = cluster.server.output()
    assert "starting replica" not in log.split("llmgw server: link")[-1]


def test_an_invalid_reload_keeps_the_old_catalog_running(cluster):
    two_nodes(cluster)
    ready = wait_ready(cluster, 2)
    cluster.write_server_config(CATALOG + "  broken: {profile: no-such-profile}\n")
    out = cluster.ctl("reload")
    assert out.returncode != 0
    assert "reload refused, the old catalog stays" in out.stderr
    assert "no-such-profile" in out.stderr
    still = wait_ready(cluster, 2)
    assert {r["replica"]: pid_of(r) for r in still} == {r["replica"]: pid_of(r) for r in ready}
    # SIGHUP reads the file too, with the same result
    os.kill(cluster.server.pid, signal.SIGHUP)
    wait_for(lambda: cluster.server.output().count("reload refused") >= 2, 10, "the SIGHUP reload to be refused")


def test_drain_moves_replicas_off_a_node_and_cordon_keeps_new_ones_off(cluster):
    two_nodes(cluster, CATALOG.replace("replicas: 2", "replicas: 1"))
    (replica,) = wait_ready(cluster, 1)
    home = replica["nodes"][0]
    other = "node02" if home == "node01" else "node01"
    out = cluster.ctl("drain", home)
    assert out.returncode == 0, out.stderr
    assert f"{home}: cordoned" in out.stdout

    def moved():
        found = [r for r in replicas(cluster) if r["state"] == "ready"]
        return found and found[0]["nodes"] == [other] and found[0]

    wait_for(moved, 60, f"the replica to move to {other}", interval=0.3)
    nodes = cluster.nodes()
    assert nodes[home]["cordoned"] is True and nodes[other]["cordoned"] is False
    assert "cordoned" in cluster.ctl("nodes").stdout
    assert cluster.ctl("uncordon", home).returncode == 0
    assert cluster.nodes()[home]["cordoned"] is False


def test_a_model_no_node_can_hold_stays_pending_with_each_nodes_reason(cluster):
    catalog = """
profiles:
  huge: {engine: sim, min_memory_gb: 100000}
models:
  big: {profile: huge, replicas: 1}
"""
    two_nodes(cluster, catalog)
    cluster.wait_node("node01", "ready")
    cluster.wait_node("node02", "ready")

    def pending():
        (r,) = replicas(cluster)
        return r["state"] == "pending" and "needs 100000" in (r["reason"] or "") and r

    replica = wait_for(pending, 30, "the placement reason")
    assert "node01: has" in replica["reason"] and "node02: has" in replica["reason"]
    assert "needs 100000" in cluster.ctl("replicas").stdout


def test_an_edited_profile_flags_running_replicas_stale(cluster):
    two_nodes(cluster)
    wait_ready(cluster, 2)
    cluster.write_server_config(CATALOG.replace('"0"]', '"5"]'))
    assert cluster.ctl("reload").returncode == 0
    flagged = wait_for(lambda: all(r["stale"] for r in replicas(cluster)) and replicas(cluster), 20, "stale flags")
    assert len(flagged) == 2
    assert "stale" in cluster.ctl("replicas").stdout


@pytest.mark.slow
def test_a_nodes_logs_and_its_engines_are_one_ctl_away(cluster):
    cluster.write_server_config(CATALOG.replace("replicas: 2", "replicas: 1"))
    cluster.start_server()
    agent = cluster.start_agent("node01")
    (replica,) = wait_ready(cluster, 1)

    own = cluster.ctl("logs", "node01", "--json")
    assert own.returncode == 0, own.stderr
    answer = json.loads(own.stdout)
    assert answer["source"] == "agent"
    assert "echo/0/0" in answer["sources"]
    assert any("registered with the hub" in line for line in answer["lines"])

    engine = cluster.ctl("logs", "node01", "--source", "echo/0/0", "-n", "50")
    assert engine.returncode == 0, engine.stderr
    assert "sim: serving echo" in engine.stdout

    wrong = cluster.ctl("logs", "node01", "--source", "nope/0/0")
    assert wrong.returncode != 0 and "echo/0/0" in wrong.stderr  # the node lists what it has

    follow = subprocess.Popen(
        [*cluster.ctl_argv(), "logs", "node01", "--source", "echo/0/0", "-f"],
        stdout=subprocess.PIPE, text=True, env=environment(),
    )
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(follow.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: printed, 20, "ctl logs -f to print the tail")
        before = len(printed)
        complete(replica["endpoint"])  # the sim logs each request
        line = wait_for(lambda: next((ln for ln in printed[before:] if "POST" in ln), None), 30,
                        "ctl logs -f to print the new request")
        assert "chat/completions" in line
    finally:
        follow.terminate()
        follow.wait(timeout=10)

    agent.kill()
    cluster.wait_node("node01", "unreachable", timeout=15)
    gone = cluster.ctl("logs", "node01")
    assert gone.returncode != 0
    assert "agent too old or not answering" in gone.stderr


def test_an_engine_that_fails_at_start_shows_its_last_lines_in_ctl_replicas(cluster):
    catalog = """
profiles:
  broken: {engine: sim, args: ["--no-such-option"]}
models:
  echo: {profile: broken, replicas: 1}
"""
    cluster.write_server_config(catalog)
    cluster.start_server()
    cluster.start_agent("node01")

    def failed():
        found = [r for r in replicas(cluster) if r["state"] == "failed" and r["shards"]]
        return found and found[0]["shards"][0]

    shard = wait_for(failed, 60, "the replica to fail", interval=0.3, detail=cluster.logs)
    assert shard["state"] == "failed"
    assert any("unrecognized arguments: --no-such-option" in line for line in shard["output_tail"])
    table = cluster.ctl("replicas")
    assert table.returncode == 0, table.stderr
    assert "last lines of echo/0/0 on node01:" in table.stdout
    assert "unrecognized arguments: --no-such-option" in table.stdout
