"""The simulator as a process: its first line, its flags, failure injection, startup, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import openai
import pytest

from tests.support.cluster import ROOT
from tests.support.net import connect
from tests.support.sim import MODEL
from tests.support.wait import wait_for


def test_port_0_prints_the_port_it_got_and_serves_on_it(sim):
    assert sim.lines[0] == f"sim: serving {MODEL} on http://127.0.0.1:{sim.port}"
    assert sim.port > 0
    status, _, body = sim.request("GET", "/health")
    assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_one_line_per_request_unless_quiet(start_sim):
    loud = start_sim()
    loud.request("GET", "/v1/models")
    line = loud.wait_for_line(lambda l: "GET /v1/models" in l)
    assert line.startswith("sim: 127.0.0.1:")
    assert line.split()[-1] == "200"

    quiet = start_sim("--quiet")
    quiet.request("GET", "/v1/models")
    quiet.request("GET", "/health")
    quiet.stop()
    assert quiet.lines == [f"sim: serving {MODEL} on {quiet.base_url}"]


def test_fail_rate_1_answers_500_in_openai_format(start_sim):
    failing = start_sim("--fail-rate", "1.0")
    with openai.OpenAI(base_url=failing.base_url + "/v1", api_key="unused", max_retries=0) as c:
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["type"] == "server_error"
        with pytest.raises(openai.InternalServerError):
            c.embeddings.create(model=MODEL, input="hi")
        # Failure injection is for inference only: the model list still answers.
        assert [m.id for m in c.models.list().data] == [MODEL]
    assert failing.metrics()['llmgw_sim_requests_total{status="500"}'] == 2


def test_fail_rate_is_a_fraction_of_requests(start_sim):
    flaky = start_sim("--fail-rate", "0.5", "--quiet")
    with openai.OpenAI(base_url=flaky.base_url + "/v1", api_key="unused", max_retries=0) as c:
        outcomes = []
        for _ in range(200):
            try:
                c.completions.create(model=MODEL, prompt="x", max_tokens=1)
                outcomes.append(200)
            except openai.InternalServerError:
                outcomes.append(500)
    assert 50 < outcomes.count(500) < 150


def test_fail_after_exits_with_code_1_after_n_requests(start_sim):
    doomed = start_sim("--fail-after", "3")
    with openai.OpenAI(base_url=doomed.base_url + "/v1", api_key="unused", max_retries=0) as c:
        for _ in range(3):
            assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}]).choices
    assert doomed.wait(timeout=10) == 1
    doomed.wait_for_line(lambda l: "exiting with code 1 after 3 requests" in l)
    with pytest.raises(OSError):
        connect(doomed.port, timeout=2).close()


def test_startup_delay_answers_503_loading_then_200(start_sim):
    started = time.monotonic()
    loading = start_sim("--startup-delay-ms", "2000")
    status, headers, body = loading.request("GET", "/health")
    assert (status, json.loads(body)) == (503, {"status": "loading"})
    payload = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    status, headers, body = loading.request("POST", "/v1/chat/completions", payload)
    assert status == 503
    assert headers["retry-after"] == "1"
    assert json.loads(body)["error"]["code"] == "model_loading"
    wait_for(lambda: loading.request("GET", "/health")[0] == 200, 10, "/health to turn 200")
    assert time.monotonic() - started >= 2
    loading.wait_for_line(lambda l: l == f"sim: {MODEL} is ready")
    assert loading.request("POST", "/v1/chat/completions", payload)[0] == 200


def test_sigterm_exits_0_promptly_with_a_stream_in_flight(start_sim):
    busy = start_sim("--tokens-per-s", "5", "--output-tokens", "1000")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    with connect(busy.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        wait_for(lambda: busy.gauge("vllm:num_requests_running") == 1, 10, "the stream to be running")
        sent = time.monotonic()
        busy.signal(signal.SIGTERM)
        assert busy.wait(timeout=5) == 0
        assert time.monotonic() - sent < 2
        # The stream ends with the connection; the client is not left hanging.
        s.settimeout(5)
        while s.recv(65536):
            pass


def test_sigint_exits_0_too(start_sim):
    idle = start_sim()
    idle.signal(signal.SIGINT)
    assert idle.wait(timeout=5) == 0


@pytest.mark.parametrize(
    "flags, complaint",
    [
        (["--fail-rate", "2"], "not a fraction from 0 to 1"),
        (["--ttft-ms", "-1"], "not a duration"),
        (["--output-tokens", "many"], "not a whole number"),
        (["--fail-after", "0"], "not a whole number, 1 or more"),
        (["--model", " "], "the model name is empty"),
    ],
)
def test_bad_flags_are_refused_with_a_reason(flags, complaint):
    argv = [sys.executable, "-m", "llmgw.sim", "--port", "0"]
    argv += flags if "--model" in flags else ["--model", MODEL, *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 2
    assert complaint in done.stderr


def test_a_port_in_use_is_an_error_that_names_it(sim):
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.sim", "--model", MODEL, "--port", str(sim.port)],
        capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
    )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{sim.port}" in done.stderr


def test_the_model_name_is_what_is_served(start_sim):
    named = start_sim(model="llama-3-8b")
    with openai.OpenAI(base_url=named.base_url + "/v1", api_key="unused", max_retries=0) as c:
        assert c.chat.completions.create(model="llama-3-8b", messages=[{"role": "user", "content": "x"}]).model == "llama-3-8b"
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert named.gauge("vllm:num_requests_running") == 0  # labelled model_name="llama-3-8b"


def test_tokens_per_s_paces_a_stream(start_sim):
    paced = start_sim("--ttft-ms", "200", "--tokens-per-s", "20", "--output-tokens", "10")
    with openai.OpenAI(base_url=paced.base_url + "/v1", api_key="unused", max_retries=0) as c:
        started = time.monotonic()
        arrivals = []
        for chunk in c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 10
    # First token after --ttft-ms, the other nine 50 ms apart.
    assert arrivals[0] >= 0.2
    assert arrivals[-1] - arrivals[0] >= 9 / 20 * 0.9
    assert arrivals[-1] < 5
