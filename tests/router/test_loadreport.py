"""The router's load report: its figures read from the dispatcher and the metrics, every second and at once on a cold start."""

from __future__ import annotations

import hashlib

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher

from llmgw.config.routing import Admission, APIKey, RouterSettings
from llmgw.router.dispatch import Dispatcher, RequestInfo
from llmgw.router.loadreport import LoadReporter, build_load, counts
from llmgw.router.metrics import RouterMetrics
from llmgw.traffic import REPORT_INTERVAL_S, TTFT_BUCKETS_MS, EndpointLoad, KeyCounts, ModelCounts, ModelLoad
from llmgw.views import ColdStart, EndpointEntry

from .test_dispatch import result, specs

QWEN = {"qwen": ColdStart(timeout_s=60, max_held=8)}


def setup(clock, limit=1, queue=4, keys=()):
    metrics = RouterMetrics(CollectorRegistry())
    d = Dispatcher(clock, RouterSettings(admission=Admission(limit, queue, 10.0), keys=keys), metrics)
    d.set_endpoints(specs(2, "echo"), {"qwen": "starting on demand"}, QWEN)
    metrics.set_models(["echo", "qwen"])
    return d, metrics


def test_each_models_load_is_what_the_dispatcher_holds_now():
    clock = Clock()
    d, metrics = setup(clock)
    clock.advance(100)
    leases = [result(d.admit("echo", RequestInfo())) for _ in range(2)]
    d.admit("echo", RequestInfo())  # queued: both endpoints are at their limit of one
    clock.advance(5)
    d.admit("qwen", RequestInfo())
    d.admit("qwen", RequestInfo())
    d.endpoints("echo")[0].engine_waiting = 3.0
    clock.advance(2)
    report = build_load("server", d, metrics.counted, clock.seconds())
    assert report.router == "server" and not report.urgent
    assert report.models == [
        ModelLoad("echo", inflight=2, queued=1, held=0, idle_s=7.0, engine_waiting=3),
        ModelLoad("qwen", inflight=0, queued=0, held=2, idle_s=2.0, engine_waiting=None),
    ]
    assert report.endpoints == [EndpointLoad("echo/0", 1), EndpointLoad("echo/1", 1)]
    for lease in leases:
        lease.release("ok")


def test_a_model_never_asked_for_is_idle_none_and_no_engine_figure_is_none_not_zero():
    clock = Clock()
    d, metrics = setup(clock)
    (echo, qwen) = build_load("server", d, metrics.counted, 0.0).models
    assert echo == ModelLoad("echo", 0, 0, 0, None, None)
    assert qwen == ModelLoad("qwen", 0, 0, 0, None, None)


def test_an_endpoint_gone_from_the_table_is_reported_until_its_last_request_is_done():
    clock = Clock()
    d, metrics = setup(clock, limit=4)
    lease = result(d.admit("echo", RequestInfo()))
    gone = lease.endpoint.id
    d.set_endpoints([e for e in specs(2, "echo") if e.id != gone], {}, QWEN)
    report = build_load("server", d, metrics.counted, 0.0)
    assert EndpointLoad(gone, 1) in report.endpoints
    assert [m.inflight for m in report.models if m.model == "echo"] == [1]
    lease.release("ok")
    report = build_load("server", d, metrics.counted, 0.0)
    assert gone not in [e.id for e in report.endpoints]


def test_counts_are_summed_from_the_metrics_families_per_model_and_per_key():
    clock = Clock()
    d, metrics = setup(clock, keys=(APIKey(name="team-a", sha256=hashlib.sha256(b"sk-team-a").hexdigest()),))
    lease = result(d.admit("echo", RequestInfo(api_key="sk-team-a")))
    lease.usage(30, 200)
    lease.release("ok")
    metrics.request_done("echo", "/v1/chat/completions", 200, 1.0, 0.020, 30, 200)
    metrics.request_done("echo", "/v1/chat/completions", 200, 1.0, 0.030, 10, 5)
    metrics.request_done("echo", "/v1/completions", 200, 1.0, 90.0, None, None)
    metrics.request_done("echo", "/v1/chat/completions", 429, 0.0, None, None, None)
    metrics.request_done("echo", "/v1/chat/completions", 404, 0.0, None, None, None)
    metrics.request_done("echo", "/v1/chat/completions", 503, 0.0, None, None, None)
    metrics.request_done("echo", "/v1/chat/completions", 502, 0.0, None, None, None)
    metrics.upstream_error("echo", "echo/0", "refused")
    metrics.upstream_error("echo", "echo/1", "timeout")
    model_counts, key_counts = counts(metrics.counted)
    ttft = [0] * (len(TTFT_BUCKETS_MS) + 1)
    ttft[0] = 1  # 20 ms: under 25
    ttft[1] = 1  # 30 ms: 25 to 50
    ttft[-1] = 1  # 90 s: past the last edge
    assert model_counts == [ModelCounts("echo", requests=7, prompt_tokens=40, completion_tokens=205,
                                        errors={"429": 1, "4xx": 1, "503": 1, "5xx": 1, "upstream": 2}, ttft_ms=ttft)]
    assert key_counts == [KeyCounts("team-a", requests=1, tokens=230)]


def test_a_report_goes_to_the_sink_every_interval_and_none_is_made_without_one():
    clock = Clock()
    d, metrics = setup(clock)
    reporter = LoadReporter(clock, d, metrics.counted, "node01:42")
    reporter.start()
    clock.advance(REPORT_INTERVAL_S)  # no sink: nothing made
    sent = []
    reporter.sink = sent.append
    clock.advance(REPORT_INTERVAL_S)
    clock.advance(REPORT_INTERVAL_S)
    assert [(r.router, r.urgent) for r in sent] == [("node01:42", False)] * 2
    reporter.stop()
    clock.advance(REPORT_INTERVAL_S)
    assert len(sent) == 2


def test_the_first_request_held_for_a_model_is_reported_at_once_and_marked_urgent():
    clock = Clock()
    d, metrics = setup(clock)
    reporter = LoadReporter(clock, d, metrics.counted, "server")
    d.cold.first_held = reporter.urgent
    sent = []
    reporter.sink = sent.append
    reporter.start()
    d.admit("qwen", RequestInfo())
    d.admit("qwen", RequestInfo())
    clock.advance(0)
    assert [r.urgent for r in sent] == [True]
    assert [m.held for m in sent[0].models if m.model == "qwen"] == [2]
    # The second request held was not news; the next report is the periodic one.
    clock.advance(REPORT_INTERVAL_S)
    assert [r.urgent for r in sent] == [True, False]
    reporter.stop()


def test_a_sink_that_fails_is_logged_once_and_the_reports_go_on():
    clock = Clock()
    d, metrics = setup(clock)
    reporter = LoadReporter(clock, d, metrics.counted, "server")
    calls = []

    def broken(report):
        calls.append(report)
        raise RuntimeError("the control plane is away")

    reporter.sink = broken
    logged = []
    globalLogPublisher.addObserver(logged.append)
    try:
        reporter.start()
        for _ in range(3):
            clock.advance(REPORT_INTERVAL_S)
    finally:
        globalLogPublisher.removeObserver(logged.append)
        reporter.stop()
    assert len(calls) == 3
    assert len([e for e in logged if "load report" in e.get("log_format", "")]) == 1


def test_an_endpoint_leaving_the_table_is_reported_at_once_without_it():
    from llmgw.router.service import Router
    from llmgw.views import EndpointTable

    clock = Clock()
    router = Router(clock, RouterSettings(), "tcp:0:interface=127.0.0.1", follows_table=True, router_id="server")
    sent = []
    router.load_sink = sent.append
    router.reporter.start()
    two = [EndpointEntry("echo/0", "echo", "http://127.0.0.1:1"), EndpointEntry("echo/1", "echo", "http://127.0.0.1:2")]
    router.apply_table(EndpointTable(two))
    clock.advance(0)
    assert sent == []  # nothing left the table: the periodic report will do
    router.apply_table(EndpointTable(two[:1]))
    clock.advance(0)
    assert [r.urgent for r in sent] == [True]
    assert [e.id for e in sent[0].endpoints] == ["echo/0"]
    router.reporter.stop()
