"""What the router reads in OpenAI bodies without decoding them twice: the prompt's prefix and the token usage.

``prompt_prefix`` reads the request body the router decoded anyway (for the
model and the stream flag).  ``read_usage`` reads the *end* of an engine's
response as bytes: an OpenAI response, and a stream's last event before
``[DONE]``, end with ``"usage": {...}``, so finding the last ``"usage"`` and
decoding just that object costs microseconds where decoding a whole
completion (or a megabyte of embeddings) would cost milliseconds.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX_CHARS = 2048


def _text(value: Any) -> str:
    """The text of a content, prompt or input: a string, text parts, strings, or token ids (spelled in decimal)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return ""
    parts = []
    size = 0
    for item in value:
        if isinstance(item, str):
            text = item
        elif isinstance(item, dict):
            text = item.get("text")
            if not isinstance(text, str):
                continue
        elif isinstance(item, int):
            text = "%d " % item
        elif isinstance(item, list):
            text = _text(item)
        else:
            continue
        parts.append(text)
        size += len(text)
        if size >= PREFIX_CHARS:
            break
    return "".join(parts)


def _messages(messages: Any) -> str:
    """The contents of chat messages (or Responses input items) in order, up to PREFIX_CHARS."""
    if not isinstance(messages, list):
        return ""
    out: list[str] = []
    size = 0
    for message in messages:
        if isinstance(message, dict):
            # A Responses function_call_output item carries its text in "output".
            text = _text(message.get("content") if "content" in message else message.get("output"))
            out.append(text)
            size += len(text)
            if size >= PREFIX_CHARS:
                break
    return "".join(out)


# The field holding the prompt, for the routes whose prompt is one field.
_PROMPT_FIELD = {
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/rerank": "query", "/rerank": "query", "/v2/rerank": "query",
    "/v1/score": "text_1", "/score": "text_1",
    "/v1/tokenize": "prompt", "/tokenize": "prompt",
    "/v1/detokenize": "tokens", "/detokenize": "tokens",
}


def prompt_prefix(path: str, body: dict) -> str:
    """The prompt's leading text, at most PREFIX_CHARS characters (what affinity hashes).

    Chat: the messages' contents; Responses: the instructions, then the
    input; rerank: the query; score: text_1; tokenize: the prompt (or the
    messages); detokenize: the token ids; embeddings: the input.  Other
    routes (audio) have none.
    """
    if path == "/v1/chat/completions":
        return _messages(body.get("messages"))[:PREFIX_CHARS]
    if path == "/v1/responses":
        instructions = body.get("instructions")
        head = instructions if isinstance(instructions, str) else ""
        given = body.get("input")
        return (head + (given if isinstance(given, str) else _messages(given)))[:PREFIX_CHARS]
    field = _PROMPT_FIELD.get(path)
    if field is None:
        return ""
    if field == "prompt" and "prompt" not in body and "messages" in body:
        return _messages(body.get("messages"))[:PREFIX_CHARS]
    return _text(body.get(field))[:PREFIX_CHARS]


_decoder = json.JSONDecoder()


def read_usage(tail: bytes) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from the last ``"usage": {...}`` in ``tail``, None for what is not there."""
    i = tail.rfind(b'"usage"')
    while i >= 0:
        if i == 0 or tail[i - 1] != 0x5C:  # not an escaped quote inside a string
            text = tail[i + 7 : i + 7 + 2048].decode("utf-8", "replace").lstrip()
            if text.startswith(":"):
                text = text[1:].lstrip()
                if text.startswith("{"):
                    try:
                        usage, _ = _decoder.raw_decode(text)
                    except ValueError:
                        return None, None
                    return token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))
            return None, None
        i = tail.rfind(b'"usage"', 0, i)
    return None, None


# The most tokens one answer may report: no engine's context holds a billion, and a
# larger count is an engine gone wrong that would drain a key's budget at once.
MAX_TOKENS = 1 << 30


def token_count(value: Any) -> int | None:
    """An engine's token count when it is a whole number from 0 to MAX_TOKENS, else None (not reported)."""
    return value if type(value) is int and 0 <= value <= MAX_TOKENS else None
