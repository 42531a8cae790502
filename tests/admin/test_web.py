"""The admin listener over a real socket on 127.0.0.1: what Prometheus and a load balancer get."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.web.client import Agent, readBody
from twisted.web.http_headers import Headers
from twisted.web.server import Site

from llmgw.admin.web import admin_resource
from llmgw.control.collector import FleetCollector
from llmgw.router.metrics import RouterMetrics
from llmgw.states import ReplicaState
from llmgw.views import ReplicaView
from tests.support.reportedfleet import clock, fleet  # noqa: F401 - the fixtures, by name

# Twisted warns when a short local reply has been read whole before readBody
# gets to it; nothing here needs to abort a connection.
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")


def exercise(metrics: RouterMetrics) -> None:
    """Every method once, so every router family has a sample."""
    metrics.request_started("qwen")
    metrics.request_body("/v1/chat/completions", 1800)
    metrics.key_request("team-search", "qwen")
    metrics.queue_depth("qwen", 2)
    metrics.queue_wait("qwen", 0.02)
    metrics.scored("qwen", "affinity_hit")
    metrics.upstream_error("qwen", "ep2", "connect")
    metrics.retried("qwen")
    metrics.bytes_relayed("qwen", "request", 1800)
    metrics.bytes_relayed("qwen", "response", 9000)
    metrics.request_done("qwen", "/v1/chat/completions", 200, 1.2, 0.08, 40, 300)
    metrics.key_tokens("team-search", "prompt", 40)
    metrics.request_finished("qwen")
    metrics.client_gone("qwen")
    metrics.admission_rejected("qwen", "queue_full")
    metrics.endpoint_state("ep1", "qwen", True, 1, 3.0, 0.0, 0.2)
    metrics.pool_connections("ep1", 3, 1)


@pytest.fixture
def registry(fleet, clock):
    registry = CollectorRegistry()
    exercise(RouterMetrics(registry))
    registry.register(FleetCollector(fleet, clock, replicas=lambda: [ReplicaView("qwen", "qwen/0", ReplicaState.READY)]))
    return registry


@pytest_twisted.async_yield_fixture
async def admin(registry):
    port = reactor.listenTCP(0, Site(admin_resource(registry)), interface="127.0.0.1")
    yield f"http://127.0.0.1:{port.getHost().port}"
    await port.stopListening()


async def get(url: str, accept: str | None = None):
    headers = Headers({b"accept": [accept.encode()]}) if accept else None
    response = await Agent(reactor).request(b"GET", url.encode(), headers)
    body = await readBody(response)
    return response.code, response.headers.getRawHeaders(b"content-type", [b""])[0].decode(), body.decode()


@pytest_twisted.ensureDeferred
async def test_metrics_are_served_in_prometheus_text_format_and_parse(admin):
    code, content_type, body = await get(admin + "/metrics")
    assert code == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    names = {family.name for family in text_string_to_metric_families(body)}
    # prometheus_client adds a *_created gauge beside each counter and histogram; those are not families of ours.
    router = {n for n in names if n.startswith("llmgw_router_") and not n.endswith("_created")}
    assert len(router) >= 20, sorted(router)
    assert {"llmgw_nodes", "llmgw_node_memory_total_bytes", "llmgw_gpu_utilization_ratio",
            "llmgw_filesystem_free_bytes", "llmgw_shards", "llmgw_replicas"} <= names
    # The node that reported no memory has no memory series, not a zero one.
    assert 'llmgw_node_memory_total_bytes{node="cpu07"}' not in body
    assert 'llmgw_node_memory_total_bytes{node="gpu01"}' in body


@pytest_twisted.ensureDeferred
async def test_a_scraper_that_asks_for_openmetrics_gets_it(admin):
    code, content_type, body = await get(admin + "/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert code == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")


@pytest_twisted.ensureDeferred
async def test_promtool_finds_no_problems_with_every_family_populated(admin):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian: apt-get install prometheus); CI installs it")
    _, _, body = await get(admin + "/metrics")
    assert "llmgw_gpu_utilization_ratio{" in body  # promtool passes empty input too; this is not empty
    assert 'llmgw_node_engine_state{engine="llama.cpp",node="gpu01",state="broken",version="b6000"} 1.0' in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest_twisted.ensureDeferred
async def test_healthz_answers_ok(admin):
    assert await get(admin + "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")


@pytest_twisted.ensureDeferred
async def test_a_listener_without_a_control_plane_says_where_the_page_is_and_links_metrics(admin):
    code, content_type, body = await get(admin + "/")
    assert code == 200 and content_type.startswith("text/html")
    assert 'href="/metrics"' in body and "llmgw-server's <code>listen.admin</code>" in body


@pytest_twisted.ensureDeferred
async def test_unknown_paths_are_not_found(admin):
    for path in ("/metrics/extra", "/nothing-here"):
        code, _, _ = await get(admin + path)
        assert code == 404, path


def test_every_family_is_in_the_reference(registry):
    from pathlib import Path

    from prometheus_client import generate_latest

    reference = (Path(__file__).parents[2] / "docs" / "metrics.rst").read_text()
    exposed = {line.split()[2] for line in generate_latest(registry).decode().splitlines()
               if line.startswith("# TYPE ") and not line.endswith("_created gauge")}
    missing = sorted(name for name in exposed if f"``{name}``" not in reference)
    assert missing == [], "docs/metrics.rst does not describe these families"
