"""The simulator continues a final assistant message as vLLM does: the reply goes on where the text stops."""

from __future__ import annotations

import json

import pytest

from llmgw.sim import api
from tests.support.net import connect, post, read_response, sse_events
from tests.support.sim import MODEL

WORDS = "one two three four five"


def test_a_reply_cut_anywhere_and_continued_reads_as_the_whole_one():
    words = WORDS.split()
    whole = api.reply_text(words, 12)
    for cut in range(13):
        assert api.reply_text(words, cut) + api.reply_text(words, 12 - cut, cut) == whole


def continued(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": WORDS}, {"role": "assistant", "content": text}],
            "continue_final_message": True, "add_generation_prompt": False, **extra}


def test_continue_final_message_starts_after_the_assistants_words():
    assert api.continued_from(continued("one two three")) == 3
    assert api.continued_from({"messages": [{"role": "user", "content": WORDS}]}) == 0
    assert api.continued_from(dict(continued("one two"), continue_final_message=False)) == 0


@pytest.mark.parametrize("payload, param", [
    (dict(continued("one"), add_generation_prompt=True), "add_generation_prompt"),
    ({k: v for k, v in continued("one").items() if k != "add_generation_prompt"}, "add_generation_prompt"),
    (dict(continued("one"), messages=[{"role": "user", "content": WORDS}]), "messages"),
])
def test_a_continuation_vllm_would_refuse_is_a_400_naming_the_field(payload, param):
    with pytest.raises(api.ApiError) as e:
        api.continued_from(payload)
    assert e.value.status == 400 and e.value.param == param


def _ask(sim, payload: dict):
    with connect(sim.port) as s:
        s.sendall(post("/v1/chat/completions", dict(payload, model=MODEL)))
        return read_response(s.makefile("rb"))


@pytest.mark.parametrize("paced", [False, True])
def test_a_streamed_continuation_goes_on_and_ends_where_the_whole_reply_ends(start_sim, paced):
    sim = start_sim("--output-tokens", "8", *(("--tokens-per-s", "500") if paced else ()))
    status, _, body = _ask(sim, {"messages": [{"role": "user", "content": WORDS}], "stream": True})
    whole = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in sse_events(body)[:-1])
    status, _, body = _ask(sim, continued("one two three", stream=True, stream_options={"include_usage": True}))
    assert status == 200
    events = [json.loads(e) for e in sse_events(body)[:-1]]
    rest = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert "one two three" + rest == whole
    # The prompt counts the assistant's words; the completion, the 5 new tokens.
    assert events[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 5, "total_tokens": 13}


def test_max_tokens_counts_only_the_new_tokens(start_sim):
    sim = start_sim("--output-tokens", "8")
    status, _, body = _ask(sim, continued("one two", max_tokens=2))
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == " three four"
    assert answer["choices"][0]["finish_reason"] == "length"
