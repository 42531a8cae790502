"""Building a continuation: what the client has, the request that goes on from it, and the events relayed after."""

from __future__ import annotations

import json

import pytest

from llmgw.router.continuation import (
    COMPACT_BYTES,
    Delivered,
    Splice,
    client_wants_usage,
    continuation_body,
    refusal,
)

CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def framed(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)


def chat_event(content=None, role=None, finish=None, tool_calls=None, rid="chatcmpl-1"):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls:
        delta["tool_calls"] = tool_calls
    return event({"id": rid, "object": "chat.completion.chunk", "created": 100, "model": "m",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def delivered_chat(*events: bytes, kind="chat", limit=1 << 20) -> Delivered:
    d = Delivered(kind, limit)
    d.keep(HEAD + framed(*events))
    return d


# -- what the request allows ----------------------------------------------------------


@pytest.mark.parametrize("path, body, reason", [
    (CHAT_PATH, {"messages": [], "n": 2}, "n"),
    (CHAT_PATH, {"messages": [], "logprobs": True}, "logprobs"),
    (CHAT_PATH, {"messages": [], "top_logprobs": 3}, "logprobs"),
    (COMPLETIONS_PATH, {"prompt": "x", "logprobs": 2}, "logprobs"),
    (CHAT_PATH, {"messages": [], "seed": 7}, "seed"),
    (CHAT_PATH, {"messages": [], "continue_final_message": True}, "prefill"),
    (CHAT_PATH, {"messages": "not a list"}, "prompt"),
    (COMPLETIONS_PATH, {"prompt": [1, 2, 3]}, "prompt"),
    (COMPLETIONS_PATH, {"prompt": "x", "echo": True}, "echo"),
    ("/v1/embeddings", {"input": "x"}, "route"),
    ("/v1/responses", {"input": "x"}, "route"),
    (CHAT_PATH, {"messages": [], "n": 1, "seed": None, "logprobs": False}, None),
    (COMPLETIONS_PATH, {"prompt": "x"}, None),
])
def test_each_request_that_cannot_be_continued_says_why(path, body, reason):
    assert refusal(path, body) == reason


# -- what the client has --------------------------------------------------------------


def test_the_text_and_tokens_delivered_are_read_from_the_raw_stream():
    d = delivered_chat(chat_event("", role="assistant"), chat_event("Hello"), chat_event(" world"))
    assert d.refusal() is None
    assert (d.text, d.tokens, d.ident, d.created, d.model) == ("Hello world", 2, "chatcmpl-1", 100, "m")


def test_a_stream_read_in_pieces_split_anywhere_reads_the_same():
    raw = HEAD + framed(chat_event("", role="assistant"), chat_event("a"), chat_event(" b"), chat_event(" c"))
    for cut in range(1, len(raw)):
        d = Delivered("chat", 1 << 20)
        d.keep(raw[:cut])
        d.keep(raw[cut:])
        assert d.refusal() is None and d.text == "a b c", cut


def test_a_half_emitted_tool_call_is_not_continued():
    call = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a"}}]
    assert delivered_chat(chat_event("", role="assistant"), chat_event(tool_calls=call)).refusal() == "tool_call"


def test_a_client_holding_half_an_event_is_not_continued():
    whole = chat_event("Hello")
    d = Delivered("chat", 1 << 20)
    d.keep(HEAD + framed(whole) + b"%x\r\n%s" % (len(whole), whole[:10]))
    assert d.refusal() == "mid_event"
    d = delivered_chat(whole, whole[:10])
    assert d.refusal() == "mid_event"


def test_an_answer_that_finished_an_engine_error_or_garbage_is_not_continued():
    assert delivered_chat(chat_event("a"), chat_event(finish="stop")).refusal() == "finished"
    assert delivered_chat(chat_event("a"), event({"error": {"message": "x"}})).refusal() == "engine_error"
    assert delivered_chat(chat_event("a"), b"data: {not json\n\n").refusal() == "unreadable"
    d = Delivered("chat", 1 << 20)
    d.keep(HEAD.replace(b"200 OK", b"500 Internal Server Error") + framed(chat_event("a")))
    assert d.refusal() == "status"


def test_text_over_the_limit_is_not_continued():
    assert delivered_chat(chat_event("x" * 100), limit=99).refusal() == "too_long"
    assert delivered_chat(chat_event("x" * 99), limit=99).refusal() is None


def test_raw_bytes_are_read_down_to_text_past_compact_bytes():
    d = Delivered("chat", 1 << 30)
    d.keep(HEAD)
    piece = framed(chat_event("y" * 1000))
    for _ in range(COMPACT_BYTES // len(piece) + 2):
        d.keep(piece)
    assert d.kept_len < COMPACT_BYTES and d.tokens > 0
    assert d.refusal() is None and set(d.text) == {"y"}


def test_completions_read_their_text_field():
    d = Delivered("completion", 1 << 20)
    d.keep(HEAD + framed(event({"id": "cmpl-1", "created": 5, "model": "m",
                                "choices": [{"index": 0, "text": "once", "finish_reason": None}]})))
    assert d.refusal() is None and d.text == "once" and d.tokens == 1


# -- the continuation request ---------------------------------------------------------


def test_chat_goes_on_from_the_text_as_a_final_assistant_message_continued():
    body = {"model": "m", "stream": True, "max_tokens": 100, "max_completion_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}]}
    out = json.loads(continuation_body(CHAT_PATH, body, "Hello wor", 3))
    assert out["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello wor"}]
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert (out["max_tokens"], out["max_completion_tokens"]) == (97, 47)
    assert out["stream_options"] == {"include_usage": True} and out["stream"] is True
    # The client's own body is left as it came.
    assert len(body["messages"]) == 1 and "stream_options" not in body


def test_completions_go_on_from_the_prompt_and_the_text():
    out = json.loads(continuation_body(COMPLETIONS_PATH, {"prompt": "Once upon", "max_tokens": 10,
                                                          "stream_options": {"include_usage": False}}, " a time", 2))
    assert out["prompt"] == "Once upon a time" and out["max_tokens"] == 8
    assert out["stream_options"] == {"include_usage": True}


def test_a_limit_the_delivered_tokens_reach_leaves_nothing_to_continue():
    assert continuation_body(CHAT_PATH, {"messages": [], "max_tokens": 3}, "a b c", 3) is None
    assert continuation_body(CHAT_PATH, {"messages": [], "max_tokens": 4}, "a b c", 3) is not None


def test_whether_the_client_asked_for_usage():
    assert client_wants_usage({"stream_options": {"include_usage": True}})
    assert not client_wants_usage({"stream_options": {"include_usage": False}})
    assert not client_wants_usage({"stream_options": "yes"}) and not client_wants_usage({})


# -- the continuation's events --------------------------------------------------------


def splice_for(client_usage: bool) -> Splice:
    return Splice(delivered_chat(chat_event("", role="assistant"), chat_event("a"), chat_event(" b")), client_usage)


def read(events: list[bytes]) -> list:
    return [e.removeprefix(b"data: ").strip() if e.startswith(b"data: [") else json.loads(e[6:]) for e in events]


def test_the_continuation_is_relayed_under_the_first_answers_id_without_its_role_event():
    splice = splice_for(client_usage=True)
    later = [chat_event("", role="assistant", rid="chatcmpl-2"), chat_event(" c", rid="chatcmpl-2"),
             chat_event(finish="stop", rid="chatcmpl-2"),
             event({"id": "chatcmpl-2", "created": 200, "model": "m2", "choices": [],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}), b"data: [DONE]\n\n"]
    out = read(splice.events(b"".join(later)))
    assert [e["id"] for e in out[:-1]] == ["chatcmpl-1"] * 3
    assert all(e["created"] == 100 and e["model"] == "m" for e in out[:-1])
    assert out[0]["choices"][0]["delta"] == {"content": " c"}
    # The continuation's prompt held the 2 tokens delivered: the whole answer's usage is the first prompt's.
    assert out[2]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    assert splice.usage == (10, 4) and out[-1] == b"[DONE]" and splice.done and splice.started
    assert splice.delivered.text == "a b c"


def test_without_usage_asked_for_the_client_sees_none_though_the_router_counts_it():
    splice = splice_for(client_usage=False)
    with_usage_null = json.loads(chat_event(" c")[6:])
    with_usage_null["usage"] = None
    out = read(splice.events(event(with_usage_null) + event(
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1}})))
    assert len(out) == 1 and "usage" not in out[0]
    assert splice.usage == (10, 3)


def test_events_split_across_reads_are_relayed_whole():
    splice = splice_for(client_usage=True)
    raw = chat_event(" c") + chat_event(" d")
    out = []
    for i in range(0, len(raw), 7):
        out += splice.events(raw[i:i + 7])
    assert [e["choices"][0]["delta"]["content"] for e in read(out)] == [" c", " d"]
    assert splice.delivered.tokens == 4


# -- the switches ---------------------------------------------------------------------


def test_a_model_can_turn_continuation_off_in_server_yaml_and_the_table_carries_it_to_routers(tmp_path):
    from twisted.internet.task import Clock

    from llmgw.config import load_server_config
    from llmgw.config.routing import RouterSettings
    from llmgw.router.service import Router
    from llmgw.views import EndpointTable

    for name in ("ca.crt", "s.crt", "s.key"):
        (tmp_path / name).write_text("")
    (tmp_path / "server.yaml").write_text(
        'listen: {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: s.crt, key: s.key}\nprofiles:\n  s: {engine: sim}\n'
        "models:\n  a: {profile: s}\n  b: {profile: s, continuation: false}\n")
    models = load_server_config(str(tmp_path / "server.yaml")).models
    assert (models["a"].continuation, models["b"].continuation) == (True, False)
    router = Router(Clock(), RouterSettings(), "tcp:0:interface=127.0.0.1", follows_table=True)
    router.apply_table(EndpointTable(no_continuation=["b"]))
    assert router._factory.no_continuation == frozenset({"b"})


def test_continuation_max_attempts_is_read_and_checked(tmp_path):
    from llmgw.config.router import load_router_config
    from llmgw.errors import ConfigError

    path = tmp_path / "router.yaml"
    path.write_text('listen: {api: "tcp:8000"}\nrouter: {endpoints: [{model: m, url: "http://127.0.0.1:1"}], continuation: {max_attempts: 3}}\n')
    assert load_router_config(str(path)).router.continuation.max_attempts == 3
    path.write_text('listen: {api: "tcp:8000"}\nrouter: {endpoints: [{model: m, url: "http://127.0.0.1:1"}], continuation: {max_attempts: -1}}\n')
    with pytest.raises(ConfigError, match="router.continuation.max_attempts"):
        load_router_config(str(path))
