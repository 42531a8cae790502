"""The official openai client, sync and async, streaming and not, through the router to real sim engines."""

from __future__ import annotations

import asyncio

import openai
import pytest
import pytest_twisted
from twisted.internet import threads

from tests.support.sim import MODEL
from tests.support.wait import until

from .routerharness import StaticDispatcher, endpoint_of


def client(router, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk-test", max_retries=0, **kw)


@pytest_twisted.ensureDeferred
async def test_chat_completion_reaches_the_engine_and_reports_usage(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim, "sim-a")])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "the quick brown fox"}])

    reply = await threads.deferToThread(call)
    assert reply.choices[0].message.content.split()[:5] == ["the", "quick", "brown", "fox", "the"]
    assert reply.system_fingerprint == f"llmgw-sim-{sim.port}"
    assert reply.usage.prompt_tokens == 4 and reply.usage.completion_tokens == 16
    [lease] = dispatcher.leases
    assert (lease.tokens, lease.outcome) == ((4, 16), "ok")
    [(model, path, status, seconds, ttft, prompt, completion)] = router.metrics.done
    assert (model, path, status, ttft, prompt, completion) == (MODEL, "/v1/chat/completions", 200, None, 4, 16)
    assert 0 < seconds < 5


@pytest_twisted.ensureDeferred
async def test_streamed_chat_arrives_token_by_token_with_its_usage(start_sim, make_router):
    sim = start_sim("--ttft-ms", "50", "--tokens-per-s", "500")
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)

    def call():
        with client(router) as c:
            stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "one two three"}],
                                               stream=True, stream_options={"include_usage": True})
            return list(stream)

    chunks = await threads.deferToThread(call)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.split() == ("one two three " * 6).split()[:16]
    assert chunks[-1].usage.completion_tokens == 16
    # The client may leave at [DONE], before the stream's final empty chunk
    # arrives: the router finishes reading it, then releases the lease.
    await until(lambda: dispatcher.inflight == 0, "the lease to be released")
    [lease] = dispatcher.leases
    assert (lease.tokens, lease.outcome) == ((3, 16), "ok")
    [(_, _, status, seconds, ttft, prompt, completion)] = router.metrics.done
    assert status == 200 and (prompt, completion) == (3, 16)
    # The first token waits --ttft-ms; the last 15 more at 500/s.
    assert 0.05 <= ttft < seconds and seconds >= 0.05 + 0.02


@pytest_twisted.ensureDeferred
async def test_async_client_completions_streaming_and_not(sim, make_router):
    router = make_router(StaticDispatcher([endpoint_of(sim)]))

    async def calls():
        async with openai.AsyncOpenAI(base_url=router.base_url + "/v1", api_key="sk", max_retries=0) as c:
            whole = await c.completions.create(model=MODEL, prompt="red green blue", max_tokens=5)
            pieces = [chunk.choices[0].text async for chunk in await c.completions.create(
                model=MODEL, prompt="red green blue", max_tokens=5, stream=True)]
            several = await asyncio.gather(*(c.completions.create(model=MODEL, prompt=f"n{i}", max_tokens=2) for i in range(8)))
            return whole, pieces, several

    whole, pieces, several = await threads.deferToThread(asyncio.run, calls())
    assert whole.choices[0].text == "red green blue red green"
    assert whole.choices[0].finish_reason == "length"
    assert "".join(pieces) == whole.choices[0].text
    assert [r.choices[0].text for r in several] == [f"n{i} n{i}" for i in range(8)]


@pytest_twisted.ensureDeferred
async def test_embeddings_and_models(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)], models=(MODEL, "other"))
    router = make_router(dispatcher)

    def calls():
        with client(router) as c:
            one = c.embeddings.create(model=MODEL, input="a b c")
            floats = c.embeddings.create(model=MODEL, input=["a b c", "d"], encoding_format="float")
            return one, floats, c.models.list(), c.models.retrieve("other")

    one, floats, models, other = await threads.deferToThread(calls)
    assert one.data[0].embedding == pytest.approx(floats.data[0].embedding, rel=1e-6)  # base64 is float32
    assert len(floats.data) == 2 and one.usage.prompt_tokens == 3
    assert [m.id for m in models.data] == [MODEL, "other"]
    assert other.id == "other" and other.object == "model"
    # Embeddings say nothing of completion tokens: absent, not zero.
    assert dispatcher.leases[0].tokens == (3, None)


@pytest_twisted.ensureDeferred
async def test_the_dispatcher_sees_key_model_stream_and_prompt_prefix(sim, make_router):
    dispatcher = StaticDispatcher([endpoint_of(sim)])
    router = make_router(dispatcher)
    long = "x" * 3000

    def calls():
        with openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk-alice", max_retries=0) as c:
            c.chat.completions.create(model=MODEL, messages=[
                {"role": "system", "content": "Be brief. "},
                {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
            ])
            list(c.completions.create(model=MODEL, prompt=long, max_tokens=1, stream=True))
            c.embeddings.create(model=MODEL, input=["first", "second"])

    await threads.deferToThread(calls)
    chat, completion, embedding = dispatcher.requests
    assert (chat.path, chat.model, chat.stream, chat.api_key) == ("/v1/chat/completions", MODEL, False, "sk-alice")
    assert chat.prefix == "Be brief. What is 2+2?"
    assert chat.body["messages"][0]["role"] == "system"
    assert (completion.path, completion.stream, completion.prefix) == ("/v1/completions", True, "x" * 2048)
    assert (embedding.path, embedding.prefix) == ("/v1/embeddings", "firstsecond")


@pytest_twisted.ensureDeferred
async def test_requests_go_round_robin_to_every_engine(start_sim, make_router):
    sims = [start_sim("--quiet"), start_sim("--quiet")]
    dispatcher = StaticDispatcher([endpoint_of(s) for s in sims])
    router = make_router(dispatcher)

    def calls():
        with client(router) as c:
            return [c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}]).system_fingerprint
                    for _ in range(4)]

    fingerprints = await threads.deferToThread(calls)
    assert sorted(fingerprints) == sorted([f"llmgw-sim-{s.port}" for s in sims] * 2)
    await until(lambda: dispatcher.inflight == 0, "every lease released")
