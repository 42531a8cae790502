"""The router's figures, read back the way Prometheus would see them."""

from __future__ import annotations

import inspect

import pytest
import pytest_twisted
from prometheus_client import REGISTRY, CollectorRegistry

from llmgw.router.metrics import NullMetrics, RouterMetrics


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def metrics(registry):
    return RouterMetrics(registry)


def value(registry, name, /, **labels):
    return registry.get_sample_value(name, labels)


def test_there_are_at_least_twenty_router_families_and_all_are_prefixed(registry, metrics):
    names = {family.name for family in registry.collect()}
    assert len(names) >= 20, sorted(names)
    assert all(name.startswith("llmgw_router_") for name in names), sorted(names)


def test_each_router_uses_its_own_registry_never_the_default(registry):
    RouterMetrics(registry)
    RouterMetrics(CollectorRegistry())  # a second router in the same process does not clash
    assert not any(f.name.startswith("llmgw_") for f in REGISTRY.collect())


def test_a_finished_request_counts_by_model_path_and_status_and_times_it(registry, metrics):
    metrics.request_done("qwen", "/v1/chat/completions", 200, 1.7, 0.12, 30, 200)
    metrics.request_done("qwen", "/v1/chat/completions", 200, 0.3, 0.04, 10, 5)
    metrics.request_done("qwen", "/v1/chat/completions", 429, 0.001, None, None, None)

    assert value(registry, "llmgw_router_requests_total", model="qwen", path="/v1/chat/completions", status="200") == 2
    assert value(registry, "llmgw_router_requests_total", model="qwen", path="/v1/chat/completions", status="429") == 1
    assert value(registry, "llmgw_router_responses_total", model="qwen", **{"class": "2xx"}) == 2
    assert value(registry, "llmgw_router_responses_total", model="qwen", **{"class": "4xx"}) == 1
    assert value(registry, "llmgw_router_request_duration_seconds_count", model="qwen", path="/v1/chat/completions") == 3
    assert value(registry, "llmgw_router_request_duration_seconds_sum", model="qwen",
                 path="/v1/chat/completions") == pytest.approx(2.001)
    assert value(registry, "llmgw_router_request_duration_seconds_bucket", model="qwen",
                 path="/v1/chat/completions", le="0.5") == 2
    # Only the two replies that had a first token are timed for it.
    assert value(registry, "llmgw_router_time_to_first_token_seconds_count", model="qwen") == 2
    assert value(registry, "llmgw_router_time_to_first_token_seconds_bucket", model="qwen", le="0.05") == 1
    assert value(registry, "llmgw_router_tokens_total", model="qwen", kind="prompt") == 40
    assert value(registry, "llmgw_router_tokens_total", model="qwen", kind="completion") == 205


def test_usage_an_engine_did_not_report_is_absent_not_zero(registry, metrics):
    metrics.request_done("bge", "/v1/embeddings", 200, 0.02, None, None, None)
    assert value(registry, "llmgw_router_requests_total", model="bge", path="/v1/embeddings", status="200") == 1
    assert value(registry, "llmgw_router_tokens_total", model="bge", kind="prompt") is None
    assert value(registry, "llmgw_router_time_to_first_token_seconds_count", model="bge") is None


def test_labels_stay_bounded_whatever_clients_send(registry):
    metrics = RouterMetrics(registry, max_models=2)
    metrics.request_done("a", "/v1/completions", 200, 0.1, None, None, None)
    metrics.request_done("b", "/wp-login.php", 404, 0.1, None, None, None)
    metrics.request_done("made-up-by-a-client", "/v1/completions", 404, 0.1, None, None, None)
    metrics.admission_rejected("another-made-up-one", "unknown_model")
    assert value(registry, "llmgw_router_requests_total", model="b", path="other", status="404") == 1
    assert value(registry, "llmgw_router_requests_total", model="other", path="/v1/completions", status="404") == 1
    assert value(registry, "llmgw_router_admission_rejections_total", model="unknown", reason="unknown_model") == 1
    models = {s.labels["model"] for f in registry.collect() for s in f.samples if "model" in s.labels}
    assert models == {"a", "b", "other", "unknown"}


def test_in_flight_rises_and_falls(registry, metrics):
    metrics.request_started("qwen")
    metrics.request_started("qwen")
    metrics.request_finished("qwen")
    assert value(registry, "llmgw_router_requests_in_flight", model="qwen") == 1


def test_failures_retries_and_disconnects_are_counted(registry, metrics):
    metrics.client_gone("qwen")
    metrics.upstream_error("qwen", "http://10.0.0.5:8000", "connect")
    metrics.upstream_error("qwen", "http://10.0.0.5:8000", "connect")
    metrics.retried("qwen")
    assert value(registry, "llmgw_router_client_disconnects_total", model="qwen") == 1
    assert value(registry, "llmgw_router_upstream_errors_total", model="qwen",
                 endpoint="http://10.0.0.5:8000", kind="connect") == 2
    assert value(registry, "llmgw_router_retries_total", model="qwen") == 1


def test_queue_and_admission(registry, metrics):
    metrics.queue_depth("qwen", 7)
    metrics.queue_wait("qwen", 0.3)
    metrics.admission_rejected("qwen", "queue_full")
    metrics.admission_rejected("qwen", "queue_full")
    metrics.admission_rejected("qwen", "rate_limited")
    assert value(registry, "llmgw_router_queue_depth", model="qwen") == 7
    assert value(registry, "llmgw_router_queue_wait_seconds_count", model="qwen") == 1
    assert value(registry, "llmgw_router_queue_wait_seconds_bucket", model="qwen", le="0.25") == 0
    assert value(registry, "llmgw_router_queue_wait_seconds_bucket", model="qwen", le="0.5") == 1
    assert value(registry, "llmgw_router_admission_rejections_total", model="qwen", reason="queue_full") == 2
    assert value(registry, "llmgw_router_admission_rejections_total", model="qwen", reason="rate_limited") == 1


def test_scoring_decisions(registry, metrics):
    for decision in ("affinity_hit", "affinity_hit", "affinity_spill", "least_outstanding"):
        metrics.scored("qwen", decision)
    assert value(registry, "llmgw_router_scoring_decisions_total", model="qwen", decision="affinity_hit") == 2
    assert value(registry, "llmgw_router_scoring_decisions_total", model="qwen", decision="affinity_spill") == 1
    assert value(registry, "llmgw_router_scoring_decisions_total", model="qwen", decision="engine_load") is None


def test_endpoint_figures_and_an_engine_that_reports_no_load(registry, metrics):
    metrics.endpoint_state("ep1", "qwen", True, 3, 5.0, 2.0, 0.41)
    metrics.endpoint_state("ep2", "qwen", False, 0, None, None, None)
    ep1, ep2 = {"endpoint": "ep1", "model": "qwen"}, {"endpoint": "ep2", "model": "qwen"}
    assert value(registry, "llmgw_router_endpoint_healthy", **ep1) == 1
    assert value(registry, "llmgw_router_endpoint_in_flight_requests", **ep1) == 3
    assert value(registry, "llmgw_router_endpoint_engine_running_requests", **ep1) == 5
    assert value(registry, "llmgw_router_endpoint_engine_waiting_requests", **ep1) == 2
    assert value(registry, "llmgw_router_endpoint_kv_cache_usage_ratio", **ep1) == pytest.approx(0.41)
    assert value(registry, "llmgw_router_endpoint_healthy", **ep2) == 0
    for name in ("running_requests", "waiting_requests"):
        assert value(registry, f"llmgw_router_endpoint_engine_{name}", **ep2) is None
    assert value(registry, "llmgw_router_endpoint_kv_cache_usage_ratio", **ep2) is None
    assert value(registry, "llmgw_router_endpoints", state="healthy") == 1
    assert value(registry, "llmgw_router_endpoints", state="unhealthy") == 1


def test_an_engine_that_stops_reporting_load_loses_the_series_rather_than_reading_zero(registry, metrics):
    metrics.endpoint_state("ep1", "qwen", True, 3, 5.0, 2.0, 0.41)
    metrics.endpoint_state("ep1", "qwen", True, 1, None, 2.0, None)
    ep1 = {"endpoint": "ep1", "model": "qwen"}
    assert value(registry, "llmgw_router_endpoint_engine_running_requests", **ep1) is None
    assert value(registry, "llmgw_router_endpoint_engine_waiting_requests", **ep1) == 2
    assert value(registry, "llmgw_router_endpoint_kv_cache_usage_ratio", **ep1) is None
    metrics.endpoint_state("ep1", "qwen", True, 1, 4.0, 2.0, 0.5)
    assert value(registry, "llmgw_router_endpoint_engine_running_requests", **ep1) == 4


def test_a_removed_endpoint_leaves_no_series_behind(registry, metrics):
    metrics.endpoint_state("ep1", "qwen", True, 3, 5.0, 2.0, 0.41)
    metrics.endpoint_state("ep2", "qwen", True, 0, 1.0, 0.0, 0.1)
    metrics.pool_connections("ep1", 4, 2)
    metrics.endpoint_removed("ep1", "qwen")
    leftover = [s for f in registry.collect() for s in f.samples if s.labels.get("endpoint") == "ep1"]
    assert leftover == []
    assert value(registry, "llmgw_router_endpoint_healthy", endpoint="ep2", model="qwen") == 1
    assert value(registry, "llmgw_router_endpoints", state="healthy") == 1
    # Added back, it reports again from scratch.
    metrics.endpoint_state("ep1", "qwen", False, 0, None, None, None)
    assert value(registry, "llmgw_router_endpoint_healthy", endpoint="ep1", model="qwen") == 0
    assert value(registry, "llmgw_router_endpoints", state="unhealthy") == 1


def test_pool_keys_bytes_and_body_sizes(registry, metrics):
    metrics.pool_connections("ep1", 4, 2)
    metrics.key_request("team-search", "qwen")
    metrics.key_tokens("team-search", "completion", 120)
    metrics.bytes_relayed("qwen", "response", 4096)
    metrics.request_body("/v1/chat/completions", 2000)
    assert value(registry, "llmgw_router_upstream_connections", endpoint="ep1", state="idle") == 4
    assert value(registry, "llmgw_router_upstream_connections", endpoint="ep1", state="active") == 2
    assert value(registry, "llmgw_router_key_requests_total", key="team-search", model="qwen") == 1
    assert value(registry, "llmgw_router_key_tokens_total", key="team-search", kind="completion") == 120
    assert value(registry, "llmgw_router_relayed_bytes_total", model="qwen", direction="response") == 4096
    assert value(registry, "llmgw_router_request_body_bytes_bucket", path="/v1/chat/completions", le="4096.0") == 1


def test_build_info_names_the_version(registry, metrics):
    from llmgw import __version__
    samples = [s for f in registry.collect() if f.name == "llmgw_router_build" for s in f.samples]
    assert [s.labels["version"] for s in samples] == [__version__]


def test_null_metrics_has_every_method_with_the_same_signature():
    public = {name: fn for name, fn in vars(RouterMetrics).items() if not name.startswith("_") and callable(fn)}
    for name, fn in public.items():
        assert inspect.signature(getattr(NullMetrics, name)) == inspect.signature(fn), name
    null = NullMetrics()
    null.request_done("qwen", "/v1/completions", 200, 0.1, None, None, None)
    null.endpoint_state("ep1", "qwen", True, 0, None, None, None)


def test_a_model_name_nobody_serves_is_unknown_never_a_label_of_its_own(registry):
    metrics = RouterMetrics(registry)
    metrics.set_models(["echo", "qwen"])
    metrics.request_done("echo", "/v1/chat/completions", 200, 0.1, None, None, None)
    metrics.request_done("x" * 4000, "/v1/chat/completions", 401, 0.001, None, None, None)
    metrics.request_done("nul\x00name", "/v1/chat/completions", 404, 0.001, None, None, None)
    models = {s.labels["model"] for f in registry.collect() for s in f.samples if "model" in s.labels}
    assert models == {"echo", "unknown"}


@pytest_twisted.ensureDeferred
async def test_keyless_requests_naming_invented_models_do_not_grow_the_scrape(registry):
    """Issue 15 item 4: 300 keyless requests with 4,000-character names took a scrape from 11 kB to 30.7 MB."""
    import hashlib
    import http.client
    import json

    from prometheus_client import generate_latest
    from twisted.internet import reactor, threads

    from llmgw.config.routing import APIKey, RouterSettings
    from llmgw.router.service import Router
    from tests.support.net import free_port

    port = free_port()
    key = APIKey(name="ci", sha256=hashlib.sha256(b"sk-real").hexdigest())
    router = Router(reactor, RouterSettings(keys=(key,)), f"tcp:{port}:interface=127.0.0.1",
                    metrics=RouterMetrics(registry))
    router.expect_models(["echo"])
    router.startService()
    before = len(generate_latest(registry))

    def send(n: int) -> list[int]:
        statuses = []
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(n):
            body = json.dumps({"model": f"{i:04d}" + "m" * 4000, "messages": [{"role": "user", "content": "x"}]})
            connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            statuses.append(answer.status)
        connection.close()
        return statuses

    try:
        statuses = await threads.deferToThread(send, 20)
        first = len(generate_latest(registry))
        statuses += await threads.deferToThread(send, 280)
    finally:
        await router.stopService()
    assert set(statuses) == {401}
    after = len(generate_latest(registry))
    models = {s.labels["model"] for f in registry.collect() for s in f.samples if "model" in s.labels}
    assert models <= {"unknown", "echo", ""}, sorted(m[:20] for m in models)
    # The first requests add the series of each family they touch (``unknown``'s
    # histograms among them); the next 280 invented names add none: only the
    # counts' digits grow.
    assert first - before < 8000, (before, first)
    assert after - first < 300, (first, after)


def test_the_router_reports_its_table_at_each_scrape_and_an_endpoint_gone_loses_its_series(registry):
    from twisted.internet import reactor

    from llmgw.config.routing import RouterSettings, StaticEndpoint
    from llmgw.router.service import Router
    from llmgw.views import EndpointEntry, EndpointTable
    from tests.support.net import free_port

    two = (StaticEndpoint("echo", "http://127.0.0.1:8001"), StaticEndpoint("echo", "http://127.0.0.1:8002"))
    router = Router(reactor, RouterSettings(endpoints=two), f"tcp:{free_port()}:interface=127.0.0.1",
                    metrics=RouterMetrics(registry))
    # Before any scrape nothing was pushed: the figures are read as the scrape begins.
    assert value(registry, "llmgw_router_endpoints", state="healthy") == 2
    assert value(registry, "llmgw_router_endpoint_healthy", endpoint="static:echo:http://127.0.0.1:8001", model="echo") == 1
    assert value(registry, "llmgw_router_upstream_connections", endpoint="static:echo:http://127.0.0.1:8002",
                 state="idle") == 0
    router.apply_table(EndpointTable([EndpointEntry("qwen/0", "qwen", "http://127.0.0.1:8003")]))
    assert value(registry, "llmgw_router_endpoints", state="healthy") == 3
    router.reconfigure(RouterSettings(endpoints=two[:1]))
    assert value(registry, "llmgw_router_endpoints", state="healthy") == 2
    left = {s.labels["endpoint"] for f in registry.collect() for s in f.samples if "endpoint" in s.labels}
    assert left == {"static:echo:http://127.0.0.1:8001", "qwen/0"}
    # An engine that failed twice is out of rotation, and the count says so at the next scrape.
    from llmgw.router.dispatch import RequestInfo

    for _ in range(2):
        router.dispatcher.admit("qwen", RequestInfo(model="qwen")).addCallback(lambda lease: lease.release("upstream_failed"))
    try:
        assert value(registry, "llmgw_router_endpoints", state="unhealthy") == 1
        assert value(registry, "llmgw_router_endpoint_healthy", endpoint="qwen/0", model="qwen") == 0
    finally:
        router.apply_table(EndpointTable())  # and its cool-down's timer with it
