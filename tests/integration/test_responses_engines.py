"""The Responses API on real engines that do not serve it as llmgw does: llama.cpp (Gemma 3 270M) and vLLM for CPU.

Each engine runs as llmgw's agent would start it (tests/support/engineproc.py:
the adapter's own argv), behind a real llmgw-router process with it as a static
endpoint; the official openai clients, Python's and Node's
(tests/support/nodeclient.py), call ``responses.create``, whole and streamed.  The router translates to chat completions for both (docs/router.rst).
What a small model says is not asserted, only that the Response and its events
are whole and agree; the timings are printed for docs/router.rst.  Skips where
the engine is not installed (make engines), and fails instead under CI=true.
"""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.support import nodeclient
from tests.support.engineproc import EngineProcess
from tests.support.routerproc import RouterProcess
from tests.support.tinymodel import build

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LLAMA_ARGS = ["-c", "2048", "-t", "2"]
# As tests/integration/test_multinode_vllm.py gives it: small, the KV cache's size named.  The tiny
# model's words are few: "hello world" is among them.
VLLM_ARGS = ["--max-model-len", "256", "--dtype", "float32", "--kv-cache-memory-bytes", "268435456"]
READY_S = 420


def responses_through(router: RouterProcess, model: str, prompt: str, words: int) -> dict[str, float]:
    """One whole and one streamed ``responses.create``, checked; their timings in seconds."""
    client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    began = time.monotonic()
    whole = client.responses.create(model=model, input=prompt, max_output_tokens=words)
    took = time.monotonic() - began
    assert whole.object == "response" and whole.id.startswith("resp_"), whole
    assert whole.status in ("completed", "incomplete"), whole
    assert [item.type for item in whole.output] == ["message"], whole.output
    assert whole.output_text.strip() and 0 < whole.usage.output_tokens <= words, whole
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens

    began = time.monotonic()
    first = None
    events = []
    for event in client.responses.create(model=model, input=prompt, max_output_tokens=words, stream=True):
        if first is None and event.type == "response.output_text.delta":
            first = time.monotonic() - began
        events.append(event)
    streamed = time.monotonic() - began
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert first is not None and text.strip() and text == final.output_text, (text, final)
    assert 0 < final.usage.output_tokens <= words
    # The same question as a chat completion, the route the translation uses, beside it: each the
    # least of three, taken in turn, so that neither is the one that found the engine's cache cold.
    chats, responses = [], []
    for _ in range(3):
        began = time.monotonic()
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                              max_tokens=words)
        chats.append(time.monotonic() - began)
        began = time.monotonic()
        client.responses.create(model=model, input=prompt, max_output_tokens=words)
        responses.append(time.monotonic() - began)
    assert chat.choices[0].message.content is not None
    return {"first_whole_s": took, "whole_s": min(responses), "streamed_s": streamed, "first_delta_s": first,
            "tokens": whole.usage.output_tokens, "chat_s": min(chats), "chat_tokens": chat.usage.completion_tokens}


def node_responses_through(router: RouterProcess, model: str, words: int) -> None:
    """The Node client's plain and streamed cases (tests/support/node/responses.mjs), parsed with no warning."""
    node, module = nodeclient.node_client()
    for case in ("plain", "stream"):
        done = nodeclient.run(node, module, "responses.mjs", router.base_url + "/v1", model, case, str(words),
                              timeout=180)
        assert done.returncode == 0 and done.stderr == "", (case, done.stdout, done.stderr)
        got = json.loads(done.stdout)
        if case == "plain":
            assert got["text"].strip() and got["status"] in ("completed", "incomplete"), got
        else:
            assert got["types"][0] == "response.created" and got["sequence"] == list(range(len(got["types"]))), got
            assert got["text"].strip() and got["text"] == got["completed"]["text"], got


def report(engine: str, started_s: float, timings: dict[str, float]) -> None:
    print(f"\n{engine}: ready in {started_s:.1f} s; responses.create whole {timings['first_whole_s']:.2f} s "
          f"the first time, {timings['whole_s']:.2f} s at best of three "
          f"({timings['tokens']} tokens), streamed {timings['streamed_s']:.2f} s, "
          f"first text delta after {timings['first_delta_s']:.2f} s; the same as a chat completion "
          f"{timings['chat_s']:.2f} s ({timings['chat_tokens']} tokens)")


@pytest.mark.llama_server
def test_responses_on_llama_cpp_serving_gemma(llama_server, gemma, tmp_path):
    began = time.monotonic()
    with EngineProcess(tmp_path, "llama.cpp", llama_server, "gemma-3-270m", gemma, LLAMA_ARGS) as engine:
        engine.start(timeout=240)
        started = time.monotonic() - began
        with RouterProcess(tmp_path, {"gemma-3-270m": engine.base_url}) as router:
            report("llama.cpp, Gemma 3 270M Q4_K_M", started, responses_through(router, "gemma-3-270m", "Say hello.", 24))
            node_responses_through(router, "gemma-3-270m", 24)


@pytest.mark.vllm
def test_responses_on_vllm_cpu_serving_the_tiny_model(vllm_python, tmp_path):
    model = build(vllm_python, tmp_path / "tiny-llama")
    began = time.monotonic()
    with EngineProcess(tmp_path, "vllm", vllm_python, "tiny", str(model), VLLM_ARGS) as engine:
        engine.start(timeout=READY_S)
        started = time.monotonic() - began
        with RouterProcess(tmp_path, {"tiny": engine.base_url}) as router:
            report("vLLM for CPU, the tiny random Llama", started, responses_through(router, "tiny", "hello world", 8))
            node_responses_through(router, "tiny", 8)
