"""Continuing an answer on another engine after the one serving it failed mid-stream: the pure part.

When the engine streaming an answer dies, hangs or leaves after the first byte,
``llmgw.router.continuing.ContinuingExchange`` sends the original request
again to another replica of the model with what the client already has:

- chat: the text so far as a final assistant message, *continued* rather than
  answered (``continue_final_message: true, add_generation_prompt: false``,
  which vLLM reads; llama.cpp's server continues a trailing assistant message
  anyway, its "assistant prefill");
- completions: the prompt followed by the text so far;

``max_tokens``/``max_completion_tokens`` reduced by the tokens delivered, and
``stream_options.include_usage`` set so the continuation's usage is known.
The continuation's events are relayed with the first answer's ``id``,
``created`` and ``model`` (``Splice``), its opening role event dropped, and its
usage turned into the whole answer's: the first request's prompt tokens, the
completion tokens of both.

Nothing here does I/O.  ``Delivered`` reads what the first engine sent (the
raw bytes, head and chunked framing included) only when it is needed: while
the stream is healthy the router keeps the bytes and parses nothing, and it
parses them when they grow past ``COMPACT_BYTES`` (keeping the text only) or
when the engine fails.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.router.response import CHUNKED, ERROR, ParseError, ResponseParser

CHAT, COMPLETION = "chat", "completion"
CONTINUABLE_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION}
# Raw bytes of a stream kept before they are read down to their text.
COMPACT_BYTES = 256 * 1024
_DONE = b"[DONE]"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def refusal(path: str, body: dict) -> str | None:
    """Why the answer to this request could not be continued on another engine, as a metrics reason; None: it can.

    Decided from the request alone, when it arrives; what the answer holds
    (a tool call begun) is ``Delivered.refusal``'s to say.
    """
    if path not in CONTINUABLE_PATHS:
        return "route"
    n = body.get("n")
    if n is not None and n != 1:
        # Several choices interleave in one stream; each would need its own continuation.
        return "n"
    if body.get("logprobs") or body.get("top_logprobs"):
        # The continuation's logprobs are of another prompt's tokens.
        return "logprobs"
    if body.get("seed") is not None:
        # A client that gives a seed relies on the sampler's sequence, which a second engine restarts.
        return "seed"
    if path == "/v1/chat/completions":
        if body.get("continue_final_message"):
            # The client continues its own assistant message; the router's text would not be all of it.
            return "prefill"
        if not isinstance(body.get("messages"), list):
            return "prompt"
    else:
        if not isinstance(body.get("prompt"), str):
            return "prompt"
        if body.get("echo") or body.get("suffix"):
            return "echo"
    return None


class Delivered:
    """What the client has of an answer: its text, its tokens, and whether it may be continued from here."""

    __slots__ = ("kind", "limit", "parser", "head", "kept", "kept_len", "pending", "texts", "size", "tokens",
                 "tool_call", "finished", "broken", "ident", "created", "model", "between_chunks")

    def __init__(self, kind: str, limit: int):
        self.kind = kind
        # The most text kept (router.max_body_bytes): a longer answer is not continued.
        self.limit = limit
        self.parser = ResponseParser()
        self.head = None
        self.kept: list[bytes] = []
        self.kept_len = 0
        # The start of an event not yet complete.
        self.pending = b""
        self.texts: list[str] = []
        self.size = 0
        self.tokens = 0
        self.tool_call = False
        self.finished = False
        # Why the stream could not be read (a metrics reason), or "".
        self.broken = ""
        self.ident: Any = None
        self.created: Any = None
        self.model: Any = None
        self.between_chunks = True

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def keep(self, data: bytes) -> None:
        """Bytes as the engine sent them (the first: its head too); read only past COMPACT_BYTES."""
        self.kept.append(data)
        self.kept_len += len(data)
        if self.kept_len > COMPACT_BYTES:
            self.read()

    def read(self) -> None:
        """Read the bytes kept so far down to text."""
        kept, self.kept, self.kept_len = self.kept, [], 0
        for data in kept:
            if self.broken:
                return
            start = 0
            parser = self.parser
            if self.head is None:
                head = parser.head(data)
                if head is None:
                    continue
                if head.__class__ is ParseError:
                    self.broken = "unreadable"
                    return
                self.head = head
                data, start = parser.raw, parser.body_start
            out: list[bytes] = []
            if parser.body(data, start, out) == ERROR:
                self.broken = "unreadable"
                return
            self.between_chunks = parser.between_chunks() or self.head.framing != CHUNKED
            self.events(b"".join(out))

    def events(self, content: bytes) -> list[dict]:
        """Read SSE content: the events it completes, each decoded; text, tokens and ids taken from them."""
        buf = self.pending + content if self.pending else content
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *whole, self.pending = buf.split(b"\n\n")
        decoded = []
        for event in whole:
            payload = _data(event)
            if payload is None:
                continue
            if payload == _DONE:
                self.finished = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                self.broken = "unreadable"
                continue
            if not isinstance(obj, dict):
                self.broken = "unreadable"
                continue
            self._take(obj)
            decoded.append(obj)
        return decoded

    def _take(self, obj: dict) -> None:
        if self.ident is None:
            self.ident, self.created, self.model = obj.get("id"), obj.get("created"), obj.get("model")
        if "error" in obj:
            self.broken = "engine_error"
            return
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if self.kind == CHAT:
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(delta, dict) and (delta.get("tool_calls") or delta.get("function_call")):
                self.tool_call = True
        else:
            piece = choice.get("text")
        if isinstance(piece, str) and piece:
            self.texts.append(piece)
            self.size += len(piece)
            self.tokens += 1
        if choice.get("finish_reason"):
            self.finished = True

    def refusal(self) -> str | None:
        """Why the answer cannot be continued from what the client has; None: it can."""
        if self.kept:
            self.read()
        if self.broken:
            return self.broken
        if self.head is None or self.head.status != 200:
            return "status"
        if self.tool_call:
            return "tool_call"
        if self.finished:
            return "finished"
        if self.pending.strip() or not self.between_chunks:
            # The client holds part of an event: what comes next cannot be joined to it.
            return "mid_event"
        if self.size > self.limit:
            return "too_long"
        return None


def _data(event: bytes) -> bytes | None:
    """The data of one SSE event (its ``data:`` lines joined), or None for a comment or an empty event."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(lines).strip()


def continuation_body(path: str, body: dict, text: str, tokens: int) -> bytes | None:
    """The request that continues an answer from *text* (*tokens* of it delivered); None when no room is left.

    ``max_tokens`` and ``max_completion_tokens`` lose the tokens delivered; a
    request whose limit they reach has nothing left to continue.
    """
    out = dict(body)
    for cap in ("max_tokens", "max_completion_tokens"):
        value = out.get(cap)
        if type(value) is int:
            if value - tokens < 1:
                return None
            out[cap] = value - tokens
    if path == "/v1/chat/completions":
        out["messages"] = list(body["messages"]) + [{"role": "assistant", "content": text}]
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        out["prompt"] = body["prompt"] + text
    options = dict(out.get("stream_options") or {})
    options["include_usage"] = True
    out["stream_options"] = options
    out["stream"] = True
    return _dumps(out).encode()


def client_wants_usage(body: dict) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


class Splice:
    """A continuation's events as the client is to read them: the first answer's ids, one usage for the whole."""

    __slots__ = ("delivered", "base_tokens", "client_usage", "usage", "started", "role_dropped", "done")

    def __init__(self, delivered: Delivered, client_usage: bool):
        if delivered.kept:
            delivered.read()
        self.delivered = delivered
        # The tokens the client had when this continuation began.
        self.base_tokens = delivered.tokens
        self.client_usage = client_usage
        # (prompt, completion) of the whole answer once the continuation reported its usage.
        self.usage: tuple[int, int] | None = None
        # The continuation sent its first token (for the gap the client saw).
        self.started = False
        self.role_dropped = False
        self.done = False

    def events(self, content: bytes) -> list[bytes]:
        """The client's SSE events for this content of the continuation's body (without HTTP framing)."""
        delivered = self.delivered
        first_id, created, model = delivered.ident, delivered.created, delivered.model
        before = delivered.tokens
        buf = delivered.pending + content if delivered.pending else content
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *whole, delivered.pending = buf.split(b"\n\n")
        out: list[bytes] = []
        for event in whole:
            payload = _data(event)
            if payload is None:
                continue
            if payload == _DONE:
                self.done = True
                out.append(b"data: [DONE]\n\n")
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                delivered.broken = "unreadable"
                continue
            if not isinstance(obj, dict):
                continue
            # Its own ids, for a continuation of this continuation, stay the first answer's.
            delivered._take(obj)
            if "id" in obj:
                obj["id"] = first_id
            if "created" in obj:
                obj["created"] = created
            if "model" in obj:
                obj["model"] = model
            if not self._keep(obj):
                continue
            out.append(b"data: " + _dumps(obj).encode() + b"\n\n")
        if delivered.tokens > before:
            self.started = True
        return out

    def _keep(self, obj: dict) -> bool:
        """Rewrite one event's usage; False for an event the client is not to see."""
        usage = obj.get("usage")
        choices = obj.get("choices")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if type(prompt) is int and type(completion) is int:
                # The continuation's prompt holds what was delivered: take it back out to the answer's.
                whole_prompt = max(0, prompt - self.base_tokens)
                whole_completion = self.base_tokens + completion
                self.usage = (whole_prompt, whole_completion)
                usage = dict(usage, prompt_tokens=whole_prompt, completion_tokens=whole_completion,
                             total_tokens=whole_prompt + whole_completion)
                obj["usage"] = usage
            if not choices and not self.client_usage:
                return False
        if not self.client_usage and "usage" in obj:
            del obj["usage"]
        if not self.role_dropped and isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta")
            if isinstance(delta, dict) and "role" in delta and not delta.get("content") and not delta.get("tool_calls") \
                    and not choices[0].get("finish_reason"):
                # The client had its role event from the first engine.
                self.role_dropped = True
                return False
        return True
