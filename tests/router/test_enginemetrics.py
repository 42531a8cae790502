"""Engine load from /metrics: each engine's names, absent as unknown, and the poller on a test clock."""

from __future__ import annotations

import attrs
import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.task import Clock
from twisted.web.client import Agent

from llmgw.config.routing import RouterSettings, StaticEndpoint
from llmgw.router.enginemetrics import EngineFigures, EnginePoller, PageTooLarge, fetch_metrics, parse_engine_metrics
from llmgw.router.service import Router
from llmgw.router.scoring import Endpoint
from llmgw.sim.metrics import SimMetrics

# Trimmed from a vLLM 0.10 (V1 engine) server, two data-parallel ranks.
VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.25
# HELP vllm:num_requests_running_total_unrelated A lookalike that must not be read.
# TYPE vllm:num_requests_running_total_unrelated gauge
vllm:num_requests_running_total_unrelated 99.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 12.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 40.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
"""

# vLLM before the V1 engine called the KV gauge gpu_cache_usage_perc.
VLLM_V0 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
"""

LLAMA_CPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4410
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""

# Newer llama.cpp builds export no KV-cache gauge at all.
LLAMA_CPP_NO_KV = """\
llamacpp:requests_processing 4
llamacpp:requests_deferred 0
llamacpp:predicted_tokens_seconds 41.5
"""

SGLANG = """\
# HELP sglang metrics
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen3-8B"} 8.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen3-8B"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen3-8B"} 0.52
sglang:cache_hit_rate{model_name="Qwen/Qwen3-8B"} 0.28
"""


def test_vllm_v1_sums_counts_over_ranks_and_averages_kv_usage():
    assert parse_engine_metrics(VLLM_V1) == EngineFigures(running=5.0, waiting=1.0, kv_usage=0.375)


def test_vllm_v0_names():
    assert parse_engine_metrics(VLLM_V0.encode()) == EngineFigures(running=7.0, waiting=2.0, kv_usage=0.9)


def test_llama_cpp():
    assert parse_engine_metrics(LLAMA_CPP) == EngineFigures(running=1.0, waiting=3.0, kv_usage=0.125)


def test_a_figure_the_engine_does_not_export_is_unknown_not_zero():
    assert parse_engine_metrics(LLAMA_CPP_NO_KV) == EngineFigures(running=4.0, waiting=0.0, kv_usage=None)


def test_sglang():
    assert parse_engine_metrics(SGLANG) == EngineFigures(running=8.0, waiting=4.0, kv_usage=0.52)


def test_llmgw_sim_reads_as_vllm():
    text = SimMetrics("echo").render(running=2, waiting=5, cache_usage=0.0625)
    assert parse_engine_metrics(text) == EngineFigures(running=2.0, waiting=5.0, kv_usage=0.0625)


def test_an_engine_without_load_figures_is_all_unknown():
    assert parse_engine_metrics("# TYPE up gauge\nup 1\n") == EngineFigures(None, None, None)
    assert parse_engine_metrics("") == EngineFigures(None, None, None)


def test_nan_is_unknown():
    assert parse_engine_metrics("vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n") == EngineFigures(
        running=None, waiting=0.0, kv_usage=None
    )


# -- the poller ---------------------------------------------------------------------------


class Engines:
    """``fetch`` for the poller: each URL answers what the test put there, when the test says."""

    def __init__(self):
        self.pages: dict[str, object] = {}
        self.asked: list[str] = []
        self.held: dict[str, defer.Deferred] = {}

    def fetch(self, url):
        self.asked.append(url)
        page = self.pages.get(url)
        if page == "hold":
            d = self.held[url] = defer.Deferred()
            return d
        if isinstance(page, Exception):
            return defer.fail(page)
        if page is None:
            return defer.fail(ConnectionRefusedError(url))
        return defer.succeed(page)


def endpoint(i=0):
    return Endpoint(f"echo/{i}", "echo", "127.0.0.1", 8001 + i)


def test_the_poller_writes_each_engines_figures_onto_its_endpoint():
    clock, engines = Clock(), Engines()
    a, b = endpoint(0), endpoint(1)
    a.inflight = 2
    engines.pages["http://127.0.0.1:8001/metrics"] = LLAMA_CPP.encode()
    engines.pages["http://127.0.0.1:8002/metrics"] = SimMetrics("echo").render(running=0, waiting=0, cache_usage=0.0)
    EnginePoller(clock, engines.fetch).poll([a, b])
    assert (a.engine_running, a.engine_waiting, a.kv_usage, a.engine_inflight_at_report) == (1.0, 3.0, 0.125, 2)
    assert (b.engine_running, b.engine_waiting, b.kv_usage) == (0.0, 0.0, 0.0)


def test_an_engine_that_stops_answering_becomes_unknown_not_stale():
    clock, engines = Clock(), Engines()
    a = endpoint()
    engines.pages["http://127.0.0.1:8001/metrics"] = VLLM_V0.encode()
    poller = EnginePoller(clock, engines.fetch)
    poller.poll([a])
    assert a.engine_running == 7.0
    del engines.pages["http://127.0.0.1:8001/metrics"]
    poller.poll([a])
    assert (a.engine_running, a.engine_waiting, a.kv_usage, a.engine_inflight_at_report) == (None, None, None, None)
    assert a.healthy  # health is for real requests to judge


def test_a_fetch_that_hangs_times_out_and_the_next_poll_asks_again():
    clock, engines = Clock(), Engines()
    a = endpoint()
    a.engine_running = 3.0
    url = "http://127.0.0.1:8001/metrics"
    engines.pages[url] = "hold"
    poller = EnginePoller(clock, engines.fetch, interval_s=2.0)
    poller.poll([a])
    # Still fetching: no second request to the same engine.
    poller.poll([a])
    assert engines.asked == [url]
    clock.advance(4.0)
    assert a.engine_running is None
    engines.pages[url] = VLLM_V0.encode()
    poller.poll([a])
    assert a.engine_running == 7.0 and len(engines.asked) == 2


def test_the_poller_polls_every_interval_until_stopped():
    clock, engines = Clock(), Engines()
    table = [endpoint()]
    engines.pages["http://127.0.0.1:8001/metrics"] = VLLM_V0.encode()
    poller = EnginePoller(clock, engines.fetch, interval_s=2.0)
    poller.start(lambda: table)
    assert len(engines.asked) == 1
    clock.advance(2.0)
    clock.advance(2.0)
    assert len(engines.asked) == 3
    # The table it polls is read afresh each time.
    table.append(endpoint(1))
    engines.pages["http://127.0.0.1:8002/metrics"] = LLAMA_CPP.encode()
    clock.advance(2.0)
    assert table[1].engine_waiting == 3.0
    poller.stop()
    clock.advance(10.0)
    assert len(engines.asked) == 5


def test_a_malformed_page_is_unknown():
    clock, engines = Clock(), Engines()
    a = endpoint()
    a.engine_waiting = 1.0
    engines.pages["http://127.0.0.1:8001/metrics"] = b"vllm:num_requests_waiting {{{ not a number\n"
    EnginePoller(clock, engines.fetch).poll([a])
    assert a.engine_waiting is None


def test_an_engine_whose_page_keeps_failing_is_asked_less_and_less_often():
    clock, engines = Clock(), Engines()
    table = [endpoint()]
    url = "http://127.0.0.1:8001/metrics"
    asked_at = []
    fetch = engines.fetch

    def fetch_and_note(u):
        asked_at.append(clock.seconds())
        return fetch(u)

    poller = EnginePoller(clock, fetch_and_note, interval_s=2.0)
    poller.start(lambda: table)
    for _ in range(65):
        clock.advance(2.0)
    # 2, 4, 8, 16, 32 s apart, then at most 60.
    assert asked_at == [0, 2, 6, 14, 30, 62, 122]
    engines.pages[url] = VLLM_V0.encode()
    for _ in range(30):
        clock.advance(2.0)
    assert table[0].engine_running == 7.0
    # Asked 60 s after the last failure, and every poll from that success on.
    assert asked_at[7:] == [182, 184, 186, 188, 190]
    poller.stop()


def test_the_parse_may_be_a_deferred_and_its_figures_land_when_it_fires():
    clock, engines = Clock(), Engines()
    a = endpoint()
    engines.pages["http://127.0.0.1:8001/metrics"] = VLLM_V0.encode()
    parsing = defer.Deferred()
    pages = []

    def parse(page):
        pages.append(page)
        return parsing

    EnginePoller(clock, engines.fetch, parse=parse).poll([a])
    assert a.engine_running is None
    parsing.callback(parse_engine_metrics(pages[0]))
    assert a.engine_running == 7.0


class _Flood(protocol.Protocol):
    """A /metrics that announces (or not) far more than it should, and sends 2 MiB of it at once."""

    def dataReceived(self, data: bytes) -> None:
        if self.factory.announce:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n")
        else:
            self.transport.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        self.transport.write(b"vllm:num_requests_running 1\n" * 75_000)

    def connectionLost(self, reason=None) -> None:
        self.factory.closed.callback(None)


@pytest.mark.parametrize("announce", [True, False])
@pytest_twisted.ensureDeferred
async def test_a_page_over_metrics_max_bytes_fails_the_poll_and_drops_the_connection(announce):
    flood = protocol.Factory.forProtocol(_Flood)
    flood.announce, flood.closed = announce, defer.Deferred()
    port = reactor.listenTCP(0, flood, interface="127.0.0.1")
    try:
        agent = Agent(reactor)
        url = f"http://127.0.0.1:{port.getHost().port}/metrics"
        with pytest.raises(PageTooLarge, match=r"metrics_max_bytes \(1048576"):
            await fetch_metrics(agent, url, 1 << 20)
        await flood.closed
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_the_router_reads_engines_metrics_only_while_scoring_is_engine_load():
    config = RouterSettings(scoring="least-outstanding", endpoints=(StaticEndpoint("m", "http://127.0.0.1:9"),))
    router = Router(reactor, config, "tcp:0:interface=127.0.0.1")
    router.startService()
    try:
        assert not router._poller.running
        router.reconfigure(attrs.evolve(config, scoring="engine-load"))
        assert router._poller.running
        router.reconfigure(config)
        assert not router._poller.running
    finally:
        await router.stopService()


@pytest_twisted.ensureDeferred
async def test_the_router_parses_engines_pages_off_the_reactor_thread(monkeypatch):
    import threading

    from llmgw.router import service

    threads_seen = []

    def parse(page):
        threads_seen.append(threading.current_thread())
        return parse_engine_metrics(page)

    monkeypatch.setattr(service, "parse_engine_metrics", parse)
    router = Router(reactor, RouterSettings(scoring="engine-load"), "tcp:0:interface=127.0.0.1")
    figures = await router._parse_metrics(VLLM_V0.encode())
    assert figures.running == 7.0
    assert threads_seen and threads_seen[0] is not threading.main_thread()
