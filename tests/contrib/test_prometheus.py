"""A real Prometheus scraping a real server, agent and sim engines; and every documented family in a real scrape.

The server, its agent and the engines are real processes on 127.0.0.1 (tests/support/cluster.py); Prometheus
is Debian's, run with its own configuration and storage under the test's directory, scraping the admin
listener every second and evaluating contrib/prometheus/alerts.yml every second.  Traffic goes through the
official openai client.  One node, so a replica whose node is gone cannot be placed anywhere else: the
"no healthy endpoint" alert's condition holds until the test has seen it pending.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.procs import marked_processes
from tests.support.cluster import cluster  # noqa: F401 - the fixture, by name
from tests.support.modelfile import ModelFile
from tests.support.net import free_port
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "sk-llmgw-metrics-token"
NVML = ROOT / "tests" / "fixtures" / "nvml" / "rtx4090.json"

# Families the traffic here does not make: each needs a refusal or a failure that
# another test stages on the same code path, and the text that test checks.
ELSEWHERE = {
    "llmgw_router_upstream_errors_total": ("tests/router/test_proxy_upstream.py", "metrics.upstream_errors =="),
    "llmgw_router_retries_total": ("tests/router/test_proxy_upstream.py", "metrics.retries =="),
    "llmgw_router_client_connections_refused_total": ("tests/router/test_client_limits.py", "metrics.refused =="),
    "llmgw_node_claims_refused_total": ("tests/control/test_collector_families.py", '"llmgw_node_claims_refused_total"'),
    "llmgw_node_progress_refused_total": ("tests/control/test_collector_families.py", '"llmgw_node_progress_refused_total"'),
    "llmgw_download_failures_total": ("tests/control/test_collector_families.py", '"llmgw_download_failures_total"'),
    "llmgw_link_duplicate_sessions_refused_total": ("tests/link/test_metrics.py",
                                                    '"llmgw_link_duplicate_sessions_refused_total"'),
    # Families with a sample only once their event has happened (a stream continued or cut, a request held for a
    # sleeping model, a key's wait in a queue, an elastic model's decision): their own tests make the event.
    "llmgw_router_client_stalls_cut_total": ("tests/router/test_fairmetrics.py", '"llmgw_router_client_stalls_cut_total"'),
    "llmgw_router_key_queue_wait_seconds": ("tests/router/test_fairmetrics.py",
                                            '"llmgw_router_key_queue_wait_seconds_count"'),
    "llmgw_router_continued_total": ("tests/router/test_continuationmetrics.py", '"llmgw_router_continued_total"'),
    "llmgw_router_not_continuable_total": ("tests/router/test_continuationmetrics.py",
                                           '"llmgw_router_not_continuable_total"'),
    "llmgw_router_continuation_failed_total": ("tests/router/test_continuationmetrics.py",
                                               '"llmgw_router_continuation_failed_total"'),
    "llmgw_router_continuation_gap_seconds": ("tests/router/test_continuationmetrics.py",
                                              '"llmgw_router_continuation_gap_seconds_bucket"'),
    "llmgw_router_held_requests": ("tests/router/test_elasticmetrics.py", '"llmgw_router_held_requests"'),
    "llmgw_router_held_seconds": ("tests/router/test_elasticmetrics.py", '"llmgw_router_held_seconds_count"'),
    "llmgw_router_cold_start_timeouts_total": ("tests/router/test_elasticmetrics.py",
                                               '"llmgw_router_cold_start_timeouts_total"'),
    "llmgw_scale_events": ("tests/control/test_scalemetrics.py", "llmgw_scale_events_total{"),
    "llmgw_replicas_wanted": ("tests/control/test_scalemetrics.py", "llmgw_replicas_wanted{"),
}


def documented_families() -> list[str]:
    text = (ROOT / "docs" / "metrics.rst").read_text()
    return re.findall(r"^   \* - ``(llmgw_[a-z0-9_]+)``$", text, re.MULTILINE)


def present(name: str, samples: set[str]) -> bool:
    """A documented family is in a scrape: as itself, or as a histogram's or an info's samples."""
    return name in samples or name + "_count" in samples or name + "_info" in samples


def catalog(weights_url: str, sha256: str) -> str:
    return f"""
profiles:
  sim-fast: {{engine: sim, args: ["--ttft-ms", "0", "--output-tokens", "8"]}}
  sim-slow: {{engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "20", "--output-tokens", "200"]}}
models:
  echo: {{profile: sim-fast, replicas: 2}}
  slow: {{profile: sim-slow, replicas: 1}}
  fetched: {{source: "{weights_url}", sha256: "{sha256}", profile: sim-fast, replicas: 1}}
router:
  scoring: engine-load
  admission: {{max_inflight_per_endpoint: 2, queue: 64}}
  clients: {{header_timeout_s: 2}}
  keys:
    - {{name: ci, sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}
"""


def scrape(cluster) -> str:
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=10) as answer:
        return answer.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(text: str, name: str, **labels) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def chat(client: openai.OpenAI, model: str = "echo", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "the quick brown fox"}], **kw)


def raw_post(cluster, model: str, key: str | None) -> int:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]}).encode()
    request = urllib.request.Request(cluster.api + "/v1/chat/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


class Prometheus:
    """Debian's prometheus on 127.0.0.1 with its own config and storage, scraping *target* every second."""

    def __init__(self, binary: str, base: Path, target: str):
        self.base = base
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base.mkdir()
        rules = ROOT / "contrib" / "prometheus" / "alerts.yml"
        (base / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{rules}"]
scrape_configs:
  - job_name: llmgw
    static_configs: [{{targets: ["{target}"]}}]
""")
        self.log = open(base / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={base / 'prometheus.yml'}", f"--storage.tsdb.path={base / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=base)
        wait_for(lambda: self._ready() or self.proc.poll() is not None, 60, "prometheus to be ready",
                 interval=0.2, detail=self.output)
        assert self.proc.poll() is None, self.output()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def names(self) -> set[str]:
        return {r["metric"]["__name__"] for r in self.query('count by (__name__) ({__name__=~"llmgw_.+"})')}

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def output(self) -> str:
        return (self.base / "prometheus.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self.log.close()


@pytest.fixture
def weights():
    """The model `fetched` downloads, held at its first megabyte until the test ends."""
    served = ModelFile("fetched.gguf", os.urandom(3_000_000), stops=(1_000_000,)).start()
    yield served
    served.stop()


@pytest.fixture
def scraper(prometheus, tmp_path, cluster):
    started = []

    def start() -> Prometheus:
        started.append(Prometheus(prometheus, tmp_path / "prometheus", f"127.0.0.1:{cluster.admin_port}"))
        return started[0]

    yield start
    for p in started:
        p.stop()


def start_cluster(cluster, weights) -> None:
    cluster.write_server_config("")
    cluster.start_server()
    cluster.start_agent("node01", env={"LLMGW_FAKE_NVML": str(NVML)})
    cluster.wait_node("node01", "ready")
    cluster.write_server_config(catalog(weights.url, weights.sha256))
    out = cluster.ctl("reload")
    assert out.returncode == 0, out.stderr

    def ready():
        views = json.loads(cluster.ctl("replicas", "--json").stdout)
        counts = {m: sum(1 for v in views if v["model"] == m and v["state"] == "ready") for m in ("echo", "slow")}
        if counts != {"echo": 2, "slow": 1}:
            return False
        # The router's table follows the control plane's a moment later.
        healthy = {labels: v for (n, labels), v in samples(scrape(cluster)).items()
                   if n == "llmgw_router_endpoint_healthy"}
        return (sum(v for labels, v in healthy.items() if ("model", "echo") in labels) == 2
                and sum(v for labels, v in healthy.items() if ("model", "slow") in labels) == 1)

    wait_for(ready, 90, "echo's two replicas and slow's one to be ready, in the router too", interval=0.3,
             detail=cluster.logs)
    wait_for(lambda: weights.reached, 30, "the download of `fetched` to reach its stop", detail=cluster.logs)


def traffic(cluster) -> None:
    """Requests that make every router family the docs list (bar those ELSEWHERE names)."""
    with openai.OpenAI(base_url=cluster.api + "/v1", api_key=TOKEN, max_retries=0, timeout=30) as client:
        assert chat(client).usage.completion_tokens == 8
        streamed = list(chat(client, stream=True, stream_options={"include_usage": True}))
        assert streamed[-1].usage.completion_tokens == 8
        # A client that leaves a long stream early.
        stream = chat(client, model="slow", stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
    # Refusals: no key (401), a model nobody serves (404).
    assert raw_post(cluster, "echo", None) == 401
    assert raw_post(cluster, "nobody", TOKEN) == 404
    # A head that never ends: 408 at router.clients.header_timeout_s.
    with socket.create_connection(("127.0.0.1", cluster.api_port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 408 ")

    def queued() -> bool:
        # More at once than echo's two endpoints take (two each): some wait in its queue.
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            assert set(pool.map(lambda _: raw_post(cluster, "echo", TOKEN), range(24))) == {200}
        return (sample(scrape(cluster), "llmgw_router_queue_wait_seconds_count", model="echo") or 0) > 0

    wait_for(queued, 60, "a request to wait in echo's queue", interval=0)


def test_every_documented_family_is_in_a_real_scrape_and_prometheus_sees_them(cluster, weights, scraper):
    start_cluster(cluster, weights)
    prometheus = scraper()
    traffic(cluster)
    text = scrape(cluster)
    names = {name for name, _ in samples(text)}

    def engine_load_read() -> bool:
        return "llmgw_router_endpoint_kv_cache_usage_ratio{" in scrape(cluster)

    wait_for(engine_load_read, 30, "the router to read echo/0's engine load (scoring: engine-load)")
    text = scrape(cluster)
    names = {name for name, _ in samples(text)}

    documented = documented_families()
    assert len(documented) >= 55, documented
    for family, (where, needle) in ELSEWHERE.items():
        assert family in documented
        assert needle in (ROOT / where).read_text(), (family, where)
    missing = [f for f in documented if f not in ELSEWHERE and not present(f, names)]
    assert missing == [], missing

    # Two endpoints serve echo, one serves slow: the count says so (it read 0 before).
    assert sample(text, "llmgw_router_endpoints", state="healthy") == 3
    assert sample(text, "llmgw_router_endpoints", state="unhealthy") == 0
    assert sum(v for (n, labels), v in samples(text).items()
               if n == "llmgw_router_endpoint_healthy" and ("model", "echo") in labels) == 2
    assert sample(text, "llmgw_router_admission_rejections_total", model="echo", reason="unauthorized") == 1
    assert sample(text, "llmgw_router_admission_rejections_total", model="unknown", reason="unknown_model") == 1
    assert sample(text, "llmgw_router_key_tokens_total", key="ci", kind="completion") >= 16
    assert sample(text, "llmgw_router_requests_in_flight", model="echo") == 0
    assert sample(text, "llmgw_downloads_active", node="node01", kind="download") == 1
    assert sample(text, "llmgw_download_bytes", node="node01", kind="download") >= 1_000_000
    assert sample(text, "llmgw_weights_held_nodes", model="fetched", fabric="-") == 0

    # Prometheus scraped the same families during the traffic.
    def scraped() -> set[str] | None:
        seen = prometheus.names()
        wanted = {"llmgw_router_endpoints", "llmgw_router_endpoint_healthy", "llmgw_router_requests_in_flight",
                  "llmgw_router_relayed_bytes_total", "llmgw_router_request_body_bytes_bucket",
                  "llmgw_router_upstream_connections", "llmgw_router_admission_rejections_total",
                  "llmgw_router_key_requests_total", "llmgw_router_key_tokens_total",
                  "llmgw_router_endpoint_kv_cache_usage_ratio", "llmgw_downloads_active", "llmgw_download_bytes",
                  "llmgw_weights_held_nodes", "llmgw_node_certificate_expiry_timestamp_seconds",
                  "llmgw_certificate_expiry_timestamp_seconds", "llmgw_gpu_memory_used_bytes"}
        return seen if wanted <= seen else None

    wait_for(scraped, 30, "Prometheus to have scraped the new families", interval=0.5, detail=prometheus.output)
    [healthy] = prometheus.query('llmgw_router_endpoints{state="healthy"}')
    assert healthy["value"][1] == "3"

    # A keyless flood of invented model names (issue 12: 300 of 4,000 characters took a scrape from
    # 11 kB to 30.7 MB), and keyed requests naming models nobody serves: a few new series, no more.
    before = len(scrape(cluster))
    statuses = [raw_post(cluster, f"{i:04d}" + "m" * 4000, None) for i in range(300)]
    statuses += [raw_post(cluster, f"{i:04d}" + "n" * 4000, TOKEN) for i in range(100)]
    assert statuses == [401] * 300 + [404] * 100
    text = scrape(cluster)
    after = len(text)
    print(f"scrape: {before} bytes before, {after} after 300 keyless and 100 keyed invented model names")
    assert max(len(v) for f in text_string_to_metric_families(text) for s in f.samples for v in s.labels.values()) < 200
    assert after - before < 4000, (before, after)


def test_a_stopped_engine_makes_no_healthy_endpoint_go_pending_in_prometheus(cluster, weights, scraper):
    start_cluster(cluster, weights)
    prometheus = scraper()
    wait_for(lambda: prometheus.query('llmgw_router_endpoint_healthy{model="slow"} == 1'), 30,
             "Prometheus to see slow's endpoint healthy", interval=0.5, detail=prometheus.output)
    assert not [a for a in prometheus.alerts() if a["labels"].get("model") == "slow"]
    agent = cluster.agents["node01"]
    [engine] = [p for p in marked_processes(cluster.base / "node01" / "state") if (p.shard_id or "").startswith("slow/")]
    # The agent is held so it cannot start slow again, and with one node nothing else can: the
    # condition lasts until the test has looked.
    os.killpg(agent.pid, signal.SIGSTOP)
    try:
        os.killpg(engine.pgid, signal.SIGKILL)

        def pending():
            return [a for a in prometheus.alerts()
                    if a["labels"]["alertname"] == "LlmgwNoHealthyEndpoint" and a["labels"].get("model") == "slow"
                    and a["state"] == "pending"]

        [alert] = wait_for(pending, 60, "LlmgwNoHealthyEndpoint to go pending for slow", interval=0.5,
                           detail=lambda: json.dumps(prometheus.alerts()) + cluster.logs())
        assert alert["labels"]["severity"] == "critical"
    finally:
        os.killpg(agent.pid, signal.SIGCONT)

