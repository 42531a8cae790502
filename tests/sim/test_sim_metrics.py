"""/metrics as Prometheus parses it: vLLM's gauges while requests are in flight, counters, aborts."""

from __future__ import annotations

import json
import threading

import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import connect
from tests.support.sim import MODEL
from tests.support.wait import wait_for

TEN_WORDS = "one two three four five six seven eight nine ten"


def test_families_types_and_counters(sim, client):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a b c"}], max_tokens=4)
    client.completions.create(model=MODEL, prompt="a b", max_tokens=2, stream=True).close()
    sim.request("GET", "/nope")
    status, headers, body = sim.request("GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    types = {f.name: f.type for f in text_string_to_metric_families(body.decode())}
    assert types == {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:gpu_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "llmgw_sim_requests": "counter",
        "llmgw_sim_aborted": "counter",
    }
    m = sim.metrics()
    label = f'{{model_name="{MODEL}"}}'
    assert m[f"vllm:num_requests_running{label}"] == 0
    assert m[f"vllm:gpu_cache_usage_perc{label}"] == 0
    # This module's sim is shared: earlier tests in it may have counted too.
    assert m[f"vllm:prompt_tokens_total{label}"] >= 5
    assert m[f"vllm:generation_tokens_total{label}"] >= 6
    assert m['llmgw_sim_requests_total{status="200"}'] >= 2
    assert m['llmgw_sim_requests_total{status="404"}'] >= 1
    assert m["llmgw_sim_aborted_total"] == 0


def test_token_counters_grow_by_what_was_served(sim, client):
    label = f'{{model_name="{MODEL}"}}'
    before = sim.metrics()
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TEN_WORDS}], max_tokens=7)
    after = sim.metrics()
    assert after[f"vllm:prompt_tokens_total{label}"] - before[f"vllm:prompt_tokens_total{label}"] == 10
    assert after[f"vllm:generation_tokens_total{label}"] - before[f"vllm:generation_tokens_total{label}"] == 7
    assert after['llmgw_sim_requests_total{status="200"}'] - before['llmgw_sim_requests_total{status="200"}'] == 1


def test_gauges_while_requests_are_in_flight(start_sim):
    held = start_sim("--ttft-ms", "1000", "--max-concurrency", "2", "--kv-cache-tokens", "100")
    results: list[object] = []

    def one() -> None:
        with openai.OpenAI(base_url=held.base_url + "/v1", api_key="unused", max_retries=0) as c:
            r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TEN_WORDS}], max_tokens=2)
            results.append(r.choices[0].message.content)

    threads = [threading.Thread(target=one) for _ in range(5)]
    for t in threads:
        t.start()
    try:
        m = wait_for(
            lambda: (lambda m: m if m[f'vllm:num_requests_waiting{{model_name="{MODEL}"}}'] == 3 else None)(held.metrics()),
            10,
            "three requests waiting",
        )
        assert m[f'vllm:num_requests_running{{model_name="{MODEL}"}}'] == 2
        # Two running requests of ten prompt tokens each, before their first token, out of 100.
        assert m[f'vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}}'] == 0.2
    finally:
        for t in threads:
            t.join(timeout=20)
    assert results == ["one two"] * 5
    m = held.metrics()
    assert m[f'vllm:num_requests_running{{model_name="{MODEL}"}}'] == 0
    assert m[f'vllm:num_requests_waiting{{model_name="{MODEL}"}}'] == 0
    assert m[f'vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}}'] == 0


def test_cache_usage_grows_with_generated_tokens_and_caps_at_one(start_sim):
    paced = start_sim("--tokens-per-s", "20", "--output-tokens", "100", "--kv-cache-tokens", "30")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": TEN_WORDS}], "stream": True}).encode()
    with connect(paced.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        usage = f'vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}}'
        partial = wait_for(lambda: (lambda v: v if 10 / 30 < v < 1 else None)(paced.metrics()[usage]), 10, "usage between prompt-only and full")
        assert partial > 10 / 30
        wait_for(lambda: paced.metrics()[usage] == 1.0, 10, "usage capped at 1")


def test_a_client_that_leaves_mid_stream_is_counted_as_an_abort(start_sim):
    paced = start_sim("--tokens-per-s", "20", "--output-tokens", "1000")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "tick"}], "stream": True}).encode()
    s = connect(paced.port)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    f = s.makefile("rb")
    assert f.readline().startswith(b"HTTP/1.1 200")
    # Read up to the first token's event, then hang up.
    while b'"content":"tick"' not in f.readline():
        pass
    wait_for(lambda: paced.gauge("vllm:num_requests_running") == 1, 10, "the stream to be running")
    f.close()
    s.close()
    wait_for(lambda: paced.metrics()["llmgw_sim_aborted_total"] == 1, 10, "llmgw_sim_aborted_total to reach 1")
    line = paced.wait_for_line(lambda l: "aborted" in l)
    assert "POST /v1/chat/completions" in line
    m = paced.metrics()
    assert m[f'vllm:num_requests_running{{model_name="{MODEL}"}}'] == 0
    assert m[f'vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}}'] == 0
    generated = m[f'vllm:generation_tokens_total{{model_name="{MODEL}"}}']
    assert 1 <= generated < 1000
    # It stopped generating: the counter stays where it was.
    wait_for(lambda: paced.metrics()[f'vllm:generation_tokens_total{{model_name="{MODEL}"}}'] == generated, 2, "no more tokens")


def test_a_client_that_leaves_while_waiting_for_its_first_token_is_an_abort(start_sim):
    held = start_sim("--ttft-ms", "5000")
    s = connect(held.port)
    body = json.dumps({"model": MODEL, "prompt": "x y"}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    wait_for(lambda: held.gauge("vllm:num_requests_running") == 1, 10, "the request to be running")
    s.close()
    wait_for(lambda: held.metrics()["llmgw_sim_aborted_total"] == 1, 10, "llmgw_sim_aborted_total to reach 1")
    assert held.gauge("vllm:num_requests_running") == 0
