"""The simulator as the official openai client sees it: sync and async, streaming and not."""

from __future__ import annotations

import asyncio
import base64
import math
import struct

import openai
import pytest

from tests.support.sim import MODEL

PROMPT = "the quick brown fox"


def expected(n: int, words: str = PROMPT) -> str:
    """What the simulator says: the last user message's words, over and over, n of them."""
    w = words.split()
    return " ".join(w[i % len(w)] for i in range(n))


def test_chat_reads_the_prompt_back_with_usage(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": PROMPT},
        ],
    )
    assert r.model == MODEL
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected(16)
    assert r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (6, 16, 22)


def test_max_tokens_and_max_completion_tokens_cap_the_reply(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=5)
    assert r.choices[0].message.content == expected(5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_completion_tokens=2, max_tokens=9
    )
    assert r.choices[0].message.content == "the quick"
    # A cap above --output-tokens changes nothing: the engine stops by itself.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=100)
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "stop"


def test_content_given_as_parts_counts_its_text(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "one two"}, {"type": "text", "text": "three"}]}],
        max_tokens=4,
    )
    assert r.choices[0].message.content == "one two three one"
    assert r.usage.prompt_tokens == 3


def test_chat_stream_joins_to_the_same_reply_and_ends_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=7,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected(7)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 7)
    assert all(c.model == MODEL for c in chunks)
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_without_usage_has_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}], stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_with_and_without_streaming(client):
    r = client.completions.create(model=MODEL, prompt="alpha beta gamma", max_tokens=4)
    assert r.object == "text_completion"
    assert r.model == MODEL
    assert r.choices[0].text == "alpha beta gamma alpha"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 4, 7)
    chunks = list(client.completions.create(model=MODEL, prompt="alpha beta gamma", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "alpha beta gamma alpha"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completions_accepts_token_ids(client):
    r = client.completions.create(model=MODEL, prompt=[11, 22, 33], max_tokens=3)
    assert r.choices[0].text == "11 22 33"
    assert r.usage.prompt_tokens == 3


def test_embeddings_are_deterministic_unit_vectors(client):
    # The client asks for base64 unless told otherwise; both must decode to the same vectors.
    one = client.embeddings.create(model=MODEL, input="hello world")
    again = client.embeddings.create(model=MODEL, input="hello world", encoding_format="float")
    both = client.embeddings.create(model=MODEL, input=["hello world", "goodbye"])
    v = one.data[0].embedding
    assert len(v) == 16
    assert math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-5)
    assert again.data[0].embedding == pytest.approx(v, abs=1e-6)
    assert both.data[0].embedding == pytest.approx(v, abs=1e-6)
    assert both.data[1].embedding != pytest.approx(v, abs=1e-3)
    assert [d.index for d in both.data] == [0, 1]
    assert both.usage.prompt_tokens == 3
    assert one.model == MODEL


def test_embedding_dimensions_and_base64_on_the_wire(client):
    raw = client.embeddings.with_raw_response.create(model=MODEL, input="x", dimensions=8, encoding_format="base64")
    encoded = raw.http_response.json()["data"][0]["embedding"]
    vector = struct.unpack("<8f", base64.b64decode(encoded))
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-5)
    # Asked for explicitly, base64 reaches the caller as it came.
    assert raw.parse().data[0].embedding == encoded
    decoded = client.embeddings.create(model=MODEL, input="x", dimensions=8).data[0].embedding
    assert decoded == pytest.approx(vector, abs=1e-6)


def test_models_list_and_retrieve(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "llmgw-sim"
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("another")


def test_another_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="gpt-4o", input="hi")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "a"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ],
)
def test_invalid_chat_requests_say_which_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/chat/completions", body={"model": MODEL, **fields}, cast_to=object)
    assert e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error"


def test_async_client_many_at_once(sim):
    async def run():
        async with openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="unused", max_retries=0) as client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=3)
                    for i in range(20)
                )
            )
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}], stream=True, max_tokens=6
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream])
            completion = await client.completions.create(model=MODEL, prompt="x y", max_tokens=3)
            embedding = await client.embeddings.create(model=MODEL, input="x")
            models = await client.models.list()
            return replies, streamed, completion, embedding, models

    replies, streamed, completion, embedding, models = asyncio.run(run())
    assert [r.choices[0].message.content for r in replies] == [f"request {i} request" for i in range(20)]
    assert len({r.id for r in replies}) == 20
    assert streamed == expected(6)
    assert completion.choices[0].text == "x y x"
    assert len(embedding.data[0].embedding) == 16
    assert [m.id for m in models.data] == [MODEL]
