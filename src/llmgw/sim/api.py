"""The OpenAI API as the simulator reads and writes it: request fields in, response bytes out.

Pure functions and one renderer per model; no I/O and no clock.  Responses are
assembled from byte pieces prepared once per process (the model name, the
fingerprint) and once per request (the id), because formatting JSON through
``json.dumps`` for every response and every streamed token is most of the
cost of a simulator that does nothing else.

What the simulator "generates" is the prompt read back: output token *i* is
word *i mod k* of the last user message (``k`` its number of words), so a
test can say exactly what a reply contains.  A token is a word everywhere
(prompt_tokens counts the words of every message).

A chat request whose last message is the assistant's, sent with
``continue_final_message: true`` (vLLM's way to continue a message rather
than answer it), is continued: the reply goes on from token *j*, *j* being
the number of words of that message, and ends where the uninterrupted reply
would (``--output-tokens`` tokens in all, ``max_tokens`` counting only the
new ones).  So a reply cut anywhere and continued reads as the whole one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

CHAT, COMPLETION, EMBEDDING = "chat", "completion", "embedding"
DONE = b"data: [DONE]\n\n"


class ApiError(Exception):
    """An error answered in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: bytes = b"",
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


def load_json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as e:
        # UnicodeDecodeError is a ValueError too.
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return payload


def check_model(payload: dict[str, Any], served: str) -> None:
    model = payload.get("model")
    if model is None:
        raise ApiError(400, "you must provide a model parameter", param="model")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    if model != served:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise ApiError(400, "each content part must be an object", param="messages")
            text = part.get("text")
            if part.get("type") == "text" and isinstance(text, str):
                texts.append(text)
        return " ".join(texts)
    raise ApiError(400, "message content must be a string, a list of parts or null", param="messages")


def chat_prompt(payload: dict[str, Any]) -> tuple[int, list[str]]:
    """(prompt tokens, the words the reply is made of) of a chat request."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    tokens = 0
    last_user: list[str] = []
    last_said: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise ApiError(400, "each message must be an object with a role", param="messages")
        words = _text_of(message.get("content")).split()
        tokens += len(words)
        if words:
            last_said = words
            if message.get("role") == "user":
                last_user = words
    return tokens, last_user or last_said or ["sim"]


def continued_from(payload: dict[str, Any]) -> int:
    """Where a continued reply goes on from: the words of the final assistant message, or 0 (not a continuation).

    As vLLM: ``continue_final_message`` needs the last message to be the
    assistant's and ``add_generation_prompt`` false.
    """
    if payload.get("continue_final_message") is not True:
        return 0
    if payload.get("add_generation_prompt", True) is not False:
        raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true",
                       param="add_generation_prompt")
    messages = payload["messages"]
    last = messages[-1]
    if last.get("role") != "assistant":
        raise ApiError(400, "continue_final_message needs the last message to be the assistant's", param="messages")
    return len(_text_of(last.get("content")).split())


def completion_prompt(payload: dict[str, Any]) -> tuple[int, list[str]]:
    """(prompt tokens, the words the reply is made of) of a completions request."""
    words = _prompt_words(payload.get("prompt"), "prompt")
    return len(words), words or ["sim"]


def _prompt_words(prompt: Any, param: str) -> list[str]:
    """Words of a prompt given as text, texts, token ids or lists of token ids (ids read as words)."""
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and prompt:
        words: list[str] = []
        for item in prompt:
            if isinstance(item, str):
                words.extend(item.split())
            elif isinstance(item, int) and not isinstance(item, bool):
                words.append(str(item))
            elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                words.extend(str(t) for t in item)
            else:
                raise ApiError(400, f"{param} must be a string, a list of strings or of token ids", param=param)
        return words
    raise ApiError(400, f"{param} must be a non-empty string, list of strings or list of token ids", param=param)


def embedding_inputs(payload: dict[str, Any]) -> list[tuple[int, bytes]]:
    """(tokens, identity) of each input; the identity alone decides the vector."""
    raw = payload.get("input")
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            items = [raw]  # one input given as token ids
        else:
            items = raw
    else:
        raise ApiError(400, "input must be a string, a non-empty list of strings or of token ids", param="input")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((len(item.split()), item.encode("utf-8", "surrogatepass")))
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            out.append((len(item), b"ids:" + ",".join(map(str, item)).encode()))
        else:
            raise ApiError(400, "input must be a string, a non-empty list of strings or of token ids", param="input")
    return out


def embedding_vector(identity: bytes, dims: int) -> list[float]:
    """A unit vector that depends only on the input and the dimensions."""
    raw = struct.unpack("<%dh" % dims, hashlib.shake_256(identity).digest(2 * dims))
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]


def _positive_int(payload: dict[str, Any], name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"{name} must be a whole number, 1 or more", param=name)
    return value


def token_cap(payload: dict[str, Any]) -> int | None:
    """The request's limit on generated tokens: max_completion_tokens, else max_tokens."""
    cap = _positive_int(payload, "max_completion_tokens")
    return cap if cap is not None else _positive_int(payload, "max_tokens")


def stream_flags(payload: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = payload.get("stream")
    if stream is None:
        stream = False
    elif not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    options = payload.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        include_usage = options.get("include_usage") is True
    n = payload.get("n")
    if n is not None and n != 1:
        raise ApiError(400, "the simulator answers n=1 only", param="n")
    return stream, include_usage


def embedding_format(payload: dict[str, Any], default_dims: int) -> tuple[int, bool]:
    """(dimensions, base64?) of an embeddings request."""
    dims = _positive_int(payload, "dimensions") or default_dims
    if dims > 65536:
        raise ApiError(400, "dimensions must be 65536 or fewer", param="dimensions")
    encoding = payload.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise ApiError(400, "encoding_format must be float or base64", param="encoding_format")
    return dims, encoding == "base64"


def reply_text(words: list[str], n: int, start: int = 0) -> str:
    """Reply tokens ``start`` to ``start + n`` joined as the streamed pieces join (after token 0, each has its space)."""
    k = len(words)
    text = " ".join(words[i % k] for i in range(start, start + n))
    return " " + text if start and n else text


class Renderer:
    """Response bytes for one served model."""

    def __init__(self, model: str, fingerprint: str, created: int):
        self.model = model
        self._tail = b'"model":' + _quote(model).encode() + b',"system_fingerprint":' + _quote(fingerprint).encode() + b","
        self.models = json.dumps(
            {"object": "list", "data": [self.model_object(created)]}
        ).encode()
        self._created = created

    def model_object(self, created: int | None = None) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": created or self._created, "owned_by": "llmgw-sim"}

    def head(self, rid: str, obj: bytes, created: int) -> bytes:
        return b'{"id":"%s","object":"%s","created":%d,%s' % (rid.encode(), obj, created, self._tail)

    @staticmethod
    def usage(prompt: int, completion: int) -> bytes:
        return b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
            prompt,
            completion,
            prompt + completion,
        )

    def whole(self, kind: str, rid: str, created: int, text: str, finish: str, prompt: int, completion: int) -> bytes:
        """A non-streamed chat completion or completion."""
        if kind == CHAT:
            choice = b'"choices":[{"index":0,"message":{"role":"assistant","content":%s},"logprobs":null,"finish_reason":"%s"}],'
            head = self.head(rid, b"chat.completion", created)
        else:
            choice = b'"choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":"%s"}],'
            head = self.head(rid, b"text_completion", created)
        return b"".join(
            (head, choice % (_quote(text).encode(), finish.encode()), self.usage(prompt, completion), b"}")
        )

    def stream(self, kind: str, rid: str, created: int, include_usage: bool) -> StreamEvents:
        return StreamEvents(self, kind, rid, created, include_usage)

    def embeddings(self, vectors: list[list[float]], base64_encoded: bool, tokens: int) -> bytes:
        data = []
        for i, vector in enumerate(vectors):
            if base64_encoded:
                value: Any = base64.b64encode(struct.pack("<%df" % len(vector), *vector)).decode("ascii")
            else:
                value = vector
            data.append({"object": "embedding", "index": i, "embedding": value})
        return json.dumps(
            {"object": "list", "data": data, "model": self.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        ).encode()


class StreamEvents:
    """The server-sent events of one streamed response, each ``data: {...}\\n\\n``."""

    def __init__(self, renderer: Renderer, kind: str, rid: str, created: int, include_usage: bool):
        self._renderer = renderer
        self._kind = kind
        self._include_usage = include_usage
        obj = b"chat.completion.chunk" if kind == CHAT else b"text_completion"
        head = b"data: " + renderer.head(rid, obj, created)
        self._head = head
        self._finish_end = b'"}]' + (b',"usage":null' if include_usage else b"") + b"}\n\n"
        # With include_usage every chunk but the last carries "usage":null.
        usage_null = b',"usage":null' if include_usage else b""
        if kind == CHAT:
            self._prefix = head + b'"choices":[{"index":0,"delta":{"content":'
            self._suffix = b'},"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
            self._role = head + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
            self._finish = head + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
        else:
            self._prefix = head + b'"choices":[{"index":0,"text":'
            self._suffix = b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
            self._role = b""
            self._finish = head + b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"'

    @property
    def opening(self) -> bytes:
        """What goes before the first token (the assistant role, for chat); may be empty."""
        return self._role

    def tokens(self, words: list[str], start: int, stop: int) -> list[bytes]:
        """Events for reply tokens ``start`` to ``stop``: the first token has no leading space."""
        k = len(words)
        prefix, suffix = self._prefix, self._suffix
        out = []
        for i in range(start, stop):
            piece = words[i % k] if i == 0 else " " + words[i % k]
            out.append(prefix + _quote(piece).encode() + suffix)
        return out

    def closing(self, finish: str, prompt: int, completion: int) -> bytes:
        """The finish_reason event, the usage event if asked for, and [DONE]."""
        parts = [self._finish + finish.encode() + self._finish_end]
        if self._include_usage:
            parts.append(self._head + b'"choices":[],' + Renderer.usage(prompt, completion) + b"}\n\n")
        parts.append(DONE)
        return b"".join(parts)
