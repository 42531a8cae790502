"""What the simulator says, as pure functions: reply words, token counts, JSON that parses."""

from __future__ import annotations

import json

import pytest

from llmgw.sim import api


def test_the_reply_is_made_of_the_last_user_message():
    tokens, words = api.chat_prompt({"messages": [
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second one"},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]})
    assert tokens == 9
    assert words == ["second", "one"]
    assert api.reply_text(words, 5) == "second one second one second"
    assert api.reply_text(words, 1) == "second"


def test_without_user_words_the_reply_falls_back():
    assert api.chat_prompt({"messages": [{"role": "system", "content": "only this"}, {"role": "user", "content": ""}]}) == (2, ["only", "this"])
    assert api.chat_prompt({"messages": [{"role": "user", "content": "   "}]}) == (0, ["sim"])


def test_streamed_tokens_join_to_the_whole_reply():
    words = ["a", "bb", "c"]
    events = api.Renderer("m", "fp", 1).stream(api.CHAT, "id", 1, include_usage=False)
    pieces = [json.loads(e[len(b"data: "):])["choices"][0]["delta"]["content"] for e in events.tokens(words, 0, 7)]
    assert "".join(pieces) == api.reply_text(words, 7)
    later = events.tokens(words, 3, 5)
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in later] == [" a", " bb"]


@pytest.mark.parametrize("model", ["plain", 'we"ird\\name %s %d', "ünïcode/model:7b"])
def test_every_response_is_json_whatever_the_model_is_called(model):
    r = api.Renderer(model, "llmgw-sim-1", 123)
    for kind in (api.CHAT, api.COMPLETION):
        whole = json.loads(r.whole(kind, "rid", 5, 'say "hi" \n', "stop", 3, 4))
        assert whole["model"] == model
        assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        events = r.stream(kind, "rid", 5, include_usage=True)
        raw = (events.opening + b"".join(events.tokens(["x"], 0, 2)) + events.closing("length", 3, 2)).decode()
        datas = [e[len("data: "):] for e in raw.split("\n\n") if e]
        assert datas[-1] == "[DONE]"
        chunks = [json.loads(d) for d in datas[:-1]]
        assert {c["model"] for c in chunks} == {model}
        assert chunks[-1]["usage"]["total_tokens"] == 5
        assert all(c["usage"] is None for c in chunks[:-1])
    assert json.loads(r.models)["data"][0]["id"] == model


def test_embeddings_depend_on_the_input_only():
    a = api.embedding_vector(b"hello", 16)
    assert a == api.embedding_vector(b"hello", 16)
    assert a != api.embedding_vector(b"hellp", 16)
    assert abs(sum(x * x for x in a) - 1) < 1e-9
    assert api.embedding_inputs({"input": [1, 2, 3]}) == [(3, b"ids:1,2,3")]
    assert [t for t, _ in api.embedding_inputs({"input": ["a b", "c"]})] == [2, 1]


@pytest.mark.parametrize(
    "payload, param",
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [1.5]}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
    ],
)
def test_completion_prompts_that_are_not_prompts(payload, param):
    with pytest.raises(api.ApiError) as e:
        api.completion_prompt(payload)
    assert (e.value.status, e.value.param) == (400, param)


def test_json_errors_are_openai_errors():
    for body in (b"", b"{", b"\xff", b"[" * 100000, b'"text"'):
        with pytest.raises(api.ApiError) as e:
            api.load_json(body)
        assert e.value.status == 400
        assert json.loads(e.value.body())["error"]["type"] == "invalid_request_error"
