"""The OpenAI router in the server, in front of sim engines started by real agents.

Everything is a real process on 127.0.0.1, and every client is the official
openai package (or raw HTTP where the point is the status line).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

TOKEN = "sk-llmgw-test-token"
OTHER = "sk-llmgw-other-token"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


CATALOG = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "8"]}
  sim-slow: {engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "20", "--output-tokens", "200"]}
models:
  echo: {profile: sim-fast, replicas: 2}
  slow: {profile: sim-slow, replicas: 1}
"""


def start(cluster, catalog: str = CATALOG, router: str = "", replicas: dict | None = None):
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.start_agent("node02")
    cluster.wait_node("node01", "ready")
    cluster.wait_node("node02", "ready")
    cluster.write_server_config(catalog + router)
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr
    want = replicas or {"echo": 2, "slow": 1}

    def ready():
        views = json.loads(cluster.ctl("replicas", "--json").stdout)
        counts = {m: sum(1 for v in views if v["model"] == m and v["state"] == "ready") for m in want}
        return counts == want and views

    views = wait_for(ready, 60, f"replicas {want}", interval=0.3)
    # The router learns the table within a tick of the replicas being ready.
    wait_for(lambda: set(want) <= set(models(cluster)), 10, "the router to serve every model")
    return views


def client(cluster, key: str | None = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.api + "/v1", api_key=key, max_retries=0, timeout=30)


def models(cluster) -> list[str]:
    # With router.keys, /v1/models needs a key too (an API without keys ignores it).
    request = urllib.request.Request(cluster.api + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return [m["id"] for m in json.load(r)["data"]]
    except (OSError, ValueError):
        return []


def raw(cluster, path: str, body: dict | bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(cluster.api + path, data=data, method="POST",
                                     headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def engine_metric(endpoint: str, name: str) -> float:
    with urllib.request.urlopen(endpoint + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


def chat(model: str = "echo", content: str = "hello there") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def test_the_openai_client_sync_async_and_streaming_through_the_router(cluster):
    start(cluster)
    sync = client(cluster)
    assert sorted(m.id for m in sync.models.list().data) == ["echo", "slow"]
    reply = sync.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hello router"}])
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens == 8
    stream = sync.chat.completions.create(model="echo", messages=[{"role": "user", "content": "stream me"}],
                                          stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(pieces) >= 8 and "".join(pieces)
    completion = sync.completions.create(model="echo", prompt="once upon a time")
    assert completion.choices[0].text
    vectors = sync.embeddings.create(model="echo", input=["a", "b"])
    assert len(vectors.data) == 2

    async def concurrently():
        async_client = openai.AsyncOpenAI(base_url=cluster.api + "/v1", api_key="unused", max_retries=0)
        replies = await asyncio.gather(*[
            async_client.chat.completions.create(model="echo", messages=[{"role": "user", "content": f"n{i}"}])
            for i in range(20)
        ])
        await async_client.close()
        return replies

    replies = asyncio.run(concurrently())
    assert all(r.choices[0].message.content for r in replies)
    # both replicas answered: the sim names its port in system_fingerprint
    assert len({r.system_fingerprint for r in replies}) == 2


def test_errors_come_in_openai_format_with_the_right_status(cluster):
    start(cluster)
    status, _, body = raw(cluster, "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, _, body = raw(cluster, "/v1/chat/completions", chat(model="no-such-model"))
    assert status == 404 and "no-such-model" in body["error"]["message"]
    status, _, body = raw(cluster, "/v1/chat/completions", {"model": "echo", "messages": [
        {"role": "user", "content": "x" * (5 * 1024 * 1024)}]})
    assert status == 413
    with pytest.raises(openai.NotFoundError):
        client(cluster).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_a_model_with_no_ready_replica_is_503_naming_why(cluster):
    catalog = CATALOG + "  big: {profile: huge, replicas: 1}\n"
    catalog = catalog.replace("profiles:\n", "profiles:\n  huge: {engine: sim, min_memory_gb: 100000}\n")
    start(cluster, catalog)
    status, _, body = raw(cluster, "/v1/chat/completions", chat(model="big"))
    assert status == 503
    assert "needs 100000" in body["error"]["message"]


def test_a_client_that_hangs_up_mid_stream_aborts_the_engines_request(cluster):
    views = start(cluster)
    (slow,) = [v for v in views if v["model"] == "slow"]
    before = engine_metric(slow["endpoint"], "llmgw_sim_aborted_total")
    stream = client(cluster).chat.completions.create(
        model="slow", messages=[{"role": "user", "content": "tell me a long story"}], stream=True)
    got = 0
    for chunk in stream:
        got += 1
        if got == 3:
            break
    stream.response.close()
    wait_for(lambda: engine_metric(slow["endpoint"], "llmgw_sim_aborted_total") > before, 10,
             "the engine to see the abort")


@pytest.mark.slow
def test_an_overflowing_queue_is_429_with_retry_after(cluster):
    router = """
router:
  admission: {max_inflight_per_endpoint: 1, queue: 1, queue_timeout_s: 30}
"""
    start(cluster, router=router)
    # The one slow endpoint works on one request (a long stream); the queue holds one more.
    busy = urllib.request.urlopen(urllib.request.Request(
        cluster.api + "/v1/chat/completions", method="POST",
        data=json.dumps({**chat("slow", "long"), "stream": True}).encode(),
        headers={"content-type": "application/json"}), timeout=30)
    waiting = threading.Thread(target=raw, args=(cluster, "/v1/chat/completions", chat("slow", "queued")))
    try:
        waiting.start()
        wait_for(lambda: _metric(cluster, "llmgw_router_queue_depth", model="slow") >= 1, 10, "a queued request")
        status, headers, body = raw(cluster, "/v1/chat/completions", chat("slow", "overflow"))
        assert status == 429
        assert int(headers["Retry-After"]) >= 1
        assert body["error"]["message"]
    finally:
        busy.close()
        waiting.join(timeout=60)


def _metric(cluster, name: str, **labels) -> float:
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_a_killed_engine_under_load_costs_no_client_an_error(cluster):
    views = start(cluster)
    echo = [v for v in views if v["model"] == "echo"]
    victim = echo[0]["shards"][0]["pid"]
    errors: list[Exception] = []
    done = threading.Event()

    def load():
        c = client(cluster)
        while not done.is_set():
            try:
                c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "keep going"}])
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                errors.append(e)

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: _metric(cluster, "llmgw_router_requests_total", model="echo", status="200") > 50, 20,
                 "load to flow")
        os.killpg(victim, signal.SIGKILL)
        served = _metric(cluster, "llmgw_router_requests_total", model="echo", status="200")
        wait_for(lambda: _metric(cluster, "llmgw_router_requests_total", model="echo", status="200") > served + 100,
                 30, "load to keep flowing on the other replica")
    finally:
        done.set()
        for w in workers:
            w.join(timeout=30)
    assert errors == []
    # The kill took: the victim's replica failed and runs again under another pid.  (Whether a
    # request met the dead engine and was retried, or the table dropped it first, is timing:
    # the table now follows a shard's failure in the same turn, not at the next tick.)
    def restarted():
        pids = [s["pid"] for v in json.loads(cluster.ctl("replicas", "--json").stdout)
                if v["model"] == "echo" for s in v["shards"]]
        return victim not in pids and len(pids) == len(echo)

    wait_for(restarted, 60, "the killed echo replica to run again")


def test_repeated_prefixes_stick_to_one_engine_until_it_is_loaded(cluster):
    # Both echo engines generate slowly, so a stream stays open, and counts as
    # in flight, until the test closes it; short answers come back at once.
    slow_echo = CATALOG.replace('sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "8"]}',
                                'sim-fast: {engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "20", '
                                '"--output-tokens", "400"]}')
    start(cluster, catalog=slow_echo, router="\nrouter:\n  scoring: prefix-affinity\n")
    c = client(cluster)
    prefix = "You are a helpful assistant. " * 20

    def messages(question):
        return [{"role": "system", "content": prefix}, {"role": "user", "content": question}]

    seen = {c.chat.completions.create(model="echo", messages=messages(f"question {i}"), max_tokens=1).system_fingerprint
            for i in range(10)}
    assert len(seen) == 1  # one warm KV cache

    # Hold streams open one after another, each until its first chunk has come:
    # with two engines and a load factor of 1.25 the home engine takes two, and
    # the third is over its bound and spills to the other engine.
    streams, fingerprints = [], []
    try:
        for i in range(4):
            stream = c.chat.completions.create(model="echo", messages=messages(f"held {i}"), stream=True)
            streams.append(stream)
            fingerprints.append(next(iter(stream)).system_fingerprint)
    finally:
        for stream in streams:
            stream.close()
    assert fingerprints[:2] == [*seen, *seen]
    assert len(set(fingerprints)) == 2, fingerprints  # over its bound, it spills to the other engine
    assert _metric(cluster, "llmgw_router_scoring_decisions_total", model="echo", decision="affinity_spill") >= 1


def test_keys_no_key_wrong_key_wrong_model_and_rate_limit(cluster):
    router = f"""
router:
  keys:
    - {{name: team, sha256: {sha(TOKEN)}, requests_per_minute: 3}}
    - {{name: echo-only, sha256: {sha(OTHER)}, models: [echo]}}
"""
    start(cluster, router=router)
    status, _, body = raw(cluster, "/v1/chat/completions", chat())  # no Authorization header at all
    assert status == 401 and body["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        client(cluster, key="sk-wrong").chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.PermissionDeniedError):
        client(cluster, key=OTHER).chat.completions.create(model="slow", messages=[{"role": "user", "content": "x"}])
    assert client(cluster, key=OTHER).chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "x"}]).choices
    team = client(cluster, key=TOKEN)
    for _ in range(3):
        team.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.RateLimitError) as limited:
        team.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
    assert int(limited.value.response.headers["retry-after"]) >= 1


def test_the_admin_listener_serves_metrics_promtool_accepts(cluster):
    start(cluster)
    client(cluster).chat.completions.create(model="echo", messages=[{"role": "user", "content": "count me"}])
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=5) as r:
        text = r.read().decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert len([n for n in names if n.startswith("llmgw_router_")]) >= 20
    assert _metric(cluster, "llmgw_nodes", state="ready") == 2
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def _router_process(cluster, text: str, name: str = "router"):
    from tests.support.cluster import Process, environment, twistd

    config = cluster.base / f"{name}.yaml"
    config.write_text(text)
    proc = Process(name, twistd("llmgw-router", config), cluster.base / f"{name}.log", environment()).start()
    cluster.processes.append(proc)
    return proc


def _sim(cluster, model: str):
    from tests.support.cluster import Process, environment

    log = cluster.base / f"sim-{model}.log"
    proc = Process(f"sim-{model}", [sys.executable, "-m", "llmgw.sim", "--host", "127.0.0.1", "--port", "0",
                                    "--model", model], log, environment()).start()
    cluster.processes.append(proc)
    line = wait_for(lambda: next((ln for ln in proc.output().splitlines() if "serving" in ln), None), 20,
                    "the sim to listen")
    return line.rsplit(" ", 1)[-1]


def test_a_router_process_serves_static_endpoints_without_a_control_plane(cluster):
    from tests.support.net import free_port

    url = _sim(cluster, "echo")
    port = free_port()
    router = _router_process(cluster, f"""
listen: {{api: "tcp:{port}:interface=127.0.0.1", admin: null}}
router:
  endpoints: [{{model: echo, url: "{url}"}}]
""")
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=10)

    def answers():
        try:
            return c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "static"}])
        except openai.APIConnectionError:
            return None

    reply = wait_for(answers, 20, "the router process to answer")
    assert reply.choices[0].message.content
    assert router.running()


def test_router_processes_follow_the_hubs_endpoint_table(cluster):
    from tests.support.net import free_port

    start(cluster, replicas={"echo": 2, "slow": 1})
    port = free_port()
    _router_process(cluster, f"""
listen: {{api: "tcp:{port}:interface=127.0.0.1", admin: null}}
hub: "{cluster.hub}"
tls: {{ca: pki/ca.crt, cert: pki/r1.crt, key: pki/r1.key}}
""")
    api = f"http://127.0.0.1:{port}/v1"

    def served():
        try:
            with urllib.request.urlopen(api + "/models", timeout=5) as r:
                return sorted(m["id"] for m in json.load(r)["data"]) == ["echo", "slow"]
        except OSError:
            return False

    wait_for(served, 30, "the router process to learn the table from the hub")
    c = openai.OpenAI(base_url=api, api_key="unused", max_retries=0, timeout=10)
    assert c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "via r1"}]).choices
    # The catalog changes: the table follows.
    cluster.write_server_config(CATALOG.replace("  slow: {profile: sim-slow, replicas: 1}\n", ""))
    assert cluster.ctl("reload").returncode == 0

    def slow_gone():
        with urllib.request.urlopen(api + "/models", timeout=5) as r:
            return [m["id"] for m in json.load(r)["data"]] == ["echo"]

    wait_for(slow_gone, 30, "the removed model to leave the router process's table")


def test_a_router_process_before_its_first_table_is_503_for_every_model(cluster):
    from tests.support.net import free_port

    # The hub is not up: the router process listens, but has no table to go by.
    port = free_port()
    _router_process(cluster, f"""
listen: {{api: "tcp:{port}:interface=127.0.0.1", admin: null}}
hub: "{cluster.hub}"
tls: {{ca: pki/ca.crt, cert: pki/r1.crt, key: pki/r1.key}}
""")
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=10)

    def refused():
        try:
            c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
        except openai.APIConnectionError:
            return None
        except openai.APIStatusError as e:
            return e
        raise AssertionError("a router with no table answered")

    error = wait_for(refused, 20, "the router process to listen", detail=cluster.logs)
    assert error.status_code == 503 and error.response.headers["retry-after"] == "1"
    assert error.message.endswith("no endpoint table from the control plane yet")


def test_an_open_api_on_a_public_interface_is_refused_at_start(cluster):
    from tests.support.cluster import TWISTD, environment
    from tests.support.net import free_port

    config = cluster.base / "open.yaml"
    config.write_text(f"""
listen: {{api: "tcp:{free_port()}", admin: null}}
router:
  endpoints: [{{model: echo, url: "http://127.0.0.1:9"}}]
""")
    out = subprocess.run([*TWISTD, "--nodaemon", "--pidfile=", "--logfile=-", "llmgw-router", "--config", str(config)],
                         capture_output=True, text=True, env=environment(), timeout=60, cwd=cluster.base)
    assert out.returncode != 0
    assert "router.keys is empty and listen.api" in out.stdout + out.stderr
    assert "allow_anonymous" in out.stdout + out.stderr


def test_a_configured_model_is_503_with_retry_after_across_a_server_restart_never_404(cluster):
    start(cluster)
    # The agents go too, so the window before replicas are adopted lasts until they come back.
    for agent in cluster.agents.values():
        agent.kill()
    cluster.server.stop()
    cluster.start_server(wait=False)
    c = client(cluster)
    answers: list[tuple[int, str, str | None]] = []

    def ask(model: str = "echo"):
        try:
            c.chat.completions.create(model=model, messages=[{"role": "user", "content": "still there?"}])
            answers.append((200, "", None))
        except openai.APIConnectionError:
            return None  # the API is not listening yet
        except openai.APIStatusError as e:
            answers.append((e.status_code, e.message, e.response.headers.get("retry-after")))
        return answers[-1]

    def past_the_first_table():
        answer = ask()
        return answer is not None and "fleet.settle_s" in answer[1]

    wait_for(past_the_first_table, 30, "the control plane's own reason for echo", interval=0.02,
             detail=lambda: f"{answers[-5:]}\n{cluster.logs()}")
    # Before the control plane's first table the router says so; after it, the
    # control plane's own reason.  Which one the first request meets depends on
    # how the server's start interleaves, so both are accepted, and nothing else.
    assert all("no endpoint table from the control plane yet" in message or "fleet.settle_s" in message
               for _, message, _ in answers), answers
    assert {status for status, _, _ in answers} == {503}, answers
    assert all(after == "1" for _, _, after in answers), answers
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])

    cluster.start_agent("node01")
    cluster.start_agent("node02")
    wait_for(lambda: (ask() or (0,))[0] == 200, 60, "echo to answer again", interval=0.1,
             detail=lambda: f"{answers[-5:]}\n{cluster.logs()}")
    assert {status for status, _, _ in answers} == {503, 200}, answers


def test_a_router_process_keeps_its_limits_on_clients_and_engines(cluster):
    """router.clients.max_connections and router.engines.first_byte_timeout_s, from router.yaml to the wire."""
    import socket

    from tests.support.net import free_port, read_response

    # An engine that accepts (the kernel does, into the backlog) and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = free_port()
    _router_process(cluster, f"""
listen: {{api: "tcp:{port}:interface=127.0.0.1", admin: null}}
router:
  clients: {{max_connections: 4}}
  engines: {{first_byte_timeout_s: 0.5}}
  endpoints: [{{model: silent, url: "http://127.0.0.1:{silent.getsockname()[1]}"}}]
""")
    wait_for(lambda: "silent" in _models_at(port), 20, "the router process to serve")
    held = []
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(s)
            s.sendall(b"HEAD /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            f = s.makefile("rb")
            # The HEAD's head, no body, then the GET's whole answer.
            assert f.readline().startswith(b"HTTP/1.1 200 ")
            while f.readline() != b"\r\n":
                pass
            assert read_response(f)[0] == 200
        with socket.create_connection(("127.0.0.1", port), timeout=10) as fifth:
            status, headers, body = read_response(fifth.makefile("rb"))
        assert status == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
        assert headers["retry-after"] == "1"
    finally:
        for s in held:
            s.close()

    def timed_out():
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=10) as c:
            try:
                c.chat.completions.create(model="silent", messages=[{"role": "user", "content": "hello?"}])
            except openai.InternalServerError as e:
                return e if e.status_code == 504 else None
            except openai.APIConnectionError:
                return None

    error = wait_for(timed_out, 20, "a 504 once the held connections are gone")
    assert error.code == "upstream_timeout" and "0.5 s" in error.message
    silent.close()


def _models_at(port: int) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            return [m["id"] for m in json.load(r)["data"]]
    except (OSError, ValueError):
        return []
