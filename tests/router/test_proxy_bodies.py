"""The prompt prefix the scorer hashes, and the token usage read from the end of a response."""

from __future__ import annotations

import json

import pytest

from llmgw.router.bodies import PREFIX_CHARS, prompt_prefix, read_usage


@pytest.mark.parametrize(
    "path, body, prefix",
    [
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": "A. "}, {"role": "user", "content": "B"}]}, "A. B"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:..."}}, {"type": "text", "text": "describe"}]}]}, "describe"),
        ("/v1/chat/completions", {"messages": "not a list"}, ""),
        ("/v1/chat/completions", {"messages": [None, {"content": None}, {"content": "x"}]}, "x"),
        ("/v1/completions", {"prompt": "once upon"}, "once upon"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "ab"),
        ("/v1/completions", {"prompt": [1, 23]}, "1 23 "),
        ("/v1/completions", {"prompt": [[12, 3]]}, "12 3 "),
        ("/v1/completions", {}, ""),
        ("/v1/embeddings", {"input": ["first", "second"]}, "firstsecond"),
        ("/v1/embeddings", {"input": 42}, ""),
        ("/v1/responses", {"instructions": "Be brief. ", "input": "hello"}, "Be brief. hello"),
        ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                                     {"type": "function_call", "name": "f", "arguments": "{}"},
                                     {"type": "function_call_output", "call_id": "c", "output": " sunny"}]}, "hi sunny"),
        ("/v1/rerank", {"query": "what is x", "documents": ["a", "b"]}, "what is x"),
        ("/rerank", {"query": "q"}, "q"),
        ("/v1/score", {"text_1": "q", "text_2": ["a"]}, "q"),
        ("/tokenize", {"prompt": "tok me"}, "tok me"),
        ("/tokenize", {"messages": [{"role": "user", "content": "chat tok"}]}, "chat tok"),
        ("/detokenize", {"tokens": [5, 6]}, "5 6 "),
        ("/v1/audio/transcriptions", {"model": "w"}, ""),
    ],
)
def test_prompt_prefix(path, body, prefix):
    assert prompt_prefix(path, body) == prefix


def test_prompt_prefix_stops_at_2048_characters_even_for_huge_prompts():
    messages = [{"role": "user", "content": "y" * 1000} for _ in range(10_000)]
    assert prompt_prefix("/v1/chat/completions", {"messages": messages}) == "y" * PREFIX_CHARS
    assert prompt_prefix("/v1/completions", {"prompt": list(range(1_000_000))}).startswith("0 1 2 3 ")
    assert len(prompt_prefix("/v1/completions", {"prompt": list(range(1_000_000))})) == PREFIX_CHARS


@pytest.mark.parametrize(
    "tail, usage",
    [
        (b'{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":16,"total_tokens":20}}', (4, 16)),
        (b'..."usage": {"prompt_tokens": 4, "total_tokens": 4}}', (4, None)),
        (b'"usage":{"prompt_tokens":3,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}},"x":null}', (3, 2)),
        # A stream without include_usage: only nulls.
        (b'data: {"usage":null}\n\ndata: [DONE]\n\n', (None, None)),
        # The last one wins: the usage event comes after the chunks' nulls.
        (b'data: {"usage":null}\n\ndata: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":5}}\n\ndata: [DONE]\n\n', (1, 5)),
        # A reply that talks about "usage" is not the usage.
        (b'{"content":"the \\"usage\\": {\\"prompt_tokens\\": 9}","usage":{"prompt_tokens":2,"completion_tokens":7}}', (2, 7)),
        (b'"usage":{"prompt_tokens":2,"completion_tokens":7}, "content":"say \\"usage\\""', (2, 7)),
        (b'{"usage":{"prompt_tokens":-1,"completion_tokens":true}}', (None, None)),
        # Past a billion is an engine gone wrong, not a count to charge a key's budget.
        (b'{"usage":{"prompt_tokens":1073741824,"completion_tokens":1073741825}}', (1073741824, None)),
        (b'{"usage":{"prompt_tokens":1e3,"completion_tokens":100000000000000000000000000000}}', (None, None)),
        (b'{"usage":{"prompt_tokens":1,', (None, None)),
        (b"<html>502 Bad Gateway</html>", (None, None)),
        (b"", (None, None)),
    ],
)
def test_read_usage(tail, usage):
    assert read_usage(tail) == usage


def test_read_usage_of_a_whole_openai_response():
    body = json.dumps({"id": "x", "choices": [{"message": {"content": "usage " * 100}}],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 100, "total_tokens": 112}}).encode()
    assert read_usage(body) == (12, 100)
