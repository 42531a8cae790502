"""A chat completions answer, as the Response object of the Responses API.

``from_chat`` turns an engine's ``chat.completion`` JSON into the Response a
client of ``POST /v1/responses`` reads; ``ResponsesStream`` turns the engine's
``chat.completion.chunk`` stream into the Responses event stream, in the order
OpenAI sends it and the official clients' accumulators accept:

    response.created, response.in_progress,
    per output item: response.output_item.added,
        a message: response.content_part.added, response.output_text.delta ...,
            response.output_text.done, response.content_part.done
        a reasoning item (the engine's reasoning_content): the same, with
            response.reasoning_text.delta ... and .done
        a function call: response.function_call_arguments.delta ...,
            response.function_call_arguments.done
    response.output_item.done (each item, in output order),
    response.completed | response.incomplete | response.failed

Items stay open until the engine's stream ends, so an engine that interleaves
parallel tool calls is followed as it goes.  The stream holds the text and the
arguments it has relayed (the final events repeat them whole), so it holds at
most ``max_chars`` characters and ``MAX_TOOL_CALLS`` calls: past either, it
ends with response.failed instead of growing.  Pure functions and one state
object: no Twisted, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.router.bodies import token_count

# Characters of text and arguments one stream holds: 4 Mi, some 1 M tokens,
# more than any engine's context gives out in one answer.
MAX_CHARS = 4 * 1024 * 1024
# Tool calls in one answer; more is an engine gone wrong.
MAX_TOOL_CALLS = 128

# The codes the clients' ResponseError accepts; anything else is a server_error.
_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded", "invalid_prompt"})

# A text part's delta and done events, by the part's type.
_DELTA = {
    "output_text": "response.output_text.delta",
    "refusal": "response.refusal.delta",
    "reasoning_text": "response.reasoning_text.delta",
}
_DONE = {
    "output_text": "response.output_text.done",
    "refusal": "response.refusal.done",
    "reasoning_text": "response.reasoning_text.done",
}

# Chat's finish_reason -> Responses' incomplete_details.reason.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def from_chat(chat: dict, request: dict, response_id: str, created: int) -> dict:
    """The Response object for the engine's chat completion ``chat``, answering ``request``.

    ValueError when ``chat`` has no choice to translate: the engine did not answer a chat completion.
    """
    base = _base(response_id)
    choices = chat.get("choices") if isinstance(chat, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices, so it is not a chat completion")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    finish = choice.get("finish_reason")
    status = "incomplete" if finish in _INCOMPLETE else "completed"
    output: list[dict] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {"id": f"rs_{base}", "type": "reasoning", "summary": [], "status": status, "content": [_part("reasoning_text", reasoning)]}
        )
    content = message.get("content")
    refusal = message.get("refusal")
    calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    if isinstance(refusal, str) and refusal:
        output.append(_message_item(base, "refusal", refusal, status))
    elif (isinstance(content, str) and content) or not calls:
        output.append(_message_item(base, "output_text", content if isinstance(content, str) else "", status))
    if len(calls) > MAX_TOOL_CALLS:
        # The stream ends with response.failed past the limit; a whole answer does not lose calls silently either.
        raise ValueError(f"the answer makes {len(calls)} tool calls, more than llmgw's Responses translation "
                         f"holds ({MAX_TOOL_CALLS})")
    for n, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        output.append(
            _call_item(
                base,
                n,
                _str(call.get("id")) or _call_id(base, n),
                _str(function.get("name")),
                _str(function.get("arguments")),
                "completed",
            )
        )
    return response_object(
        request, response_id, created, _model(request, chat), status, output, _usage(chat), _incomplete(finish)
    )


def response_object(
    request: dict,
    response_id: str,
    created: int,
    model: str,
    status: str,
    output: list[dict],
    usage: dict | None,
    incomplete_details: dict | None = None,
    error: dict | None = None,
) -> dict:
    """A Response: its own fields, and the request's that the clients read back."""
    text = request.get("text") if isinstance(request.get("text"), dict) else {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete_details,
        "instructions": request.get("instructions") if isinstance(request.get("instructions"), str) else None,
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": request.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": _echo_tools(request.get("tools")),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": usage,
        "user": request.get("user") if isinstance(request.get("user"), str) else None,
        "metadata": request.get("metadata") if isinstance(request.get("metadata"), dict) else {},
    }


class ResponsesStream:
    """One streamed answer: engine chunks in, Responses events (SSE bytes) out."""

    def __init__(self, request: dict, response_id: str, created: int, model: str, *, max_chars: int = MAX_CHARS):
        self._request = request
        self._id = response_id
        self._base = _base(response_id)
        self._created = created
        self._model = model
        self._max_chars = max_chars
        self._held = 0
        self._sequence = 0
        self._items: list[dict] = []  # the output items, in output order
        # An item's id -> its text (a message's, a reasoning item's) or a call's arguments so far, joined at
        # the end: joined once a delta, a long call's arguments were copied again with every piece.
        self._texts: dict[str, list[str]] = {}
        self._message: dict | None = None
        self._reasoning: dict | None = None
        self._calls: dict[int, dict] = {}  # the engine's tool call index -> its item
        self._pending: dict[int, dict] = {}  # a call whose name has not come yet
        self._finish: Any = None
        self._usage: dict | None = None
        self._ended = False

    def start(self) -> bytes:
        """response.created and response.in_progress."""
        if self._ended or self._sequence:
            return b""
        response = self._response("in_progress", [])
        return self._event("response.created", response=response) + self._event("response.in_progress", response=response)

    def feed(self, chunk: dict) -> bytes:
        """The events for one parsed chat.completion.chunk."""
        if self._ended or not isinstance(chunk, dict):
            return b""
        error = chunk.get("error")
        if isinstance(error, dict):
            return self.fail(_str(error.get("message")) or "the engine failed", "server_error")
        usage = _usage(chunk)
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return b""
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self._finish = choice.get("finish_reason")
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return b""
        out = []
        # llama.cpp and older vLLM say reasoning_content, newer vLLM reasoning.
        for field in ("reasoning_content", "reasoning"):
            reasoning = delta.get(field)
            if isinstance(reasoning, str) and reasoning:
                out.append(self._text_delta("reasoning_text", reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            out.append(self._text_delta("output_text", content))
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            out.append(self._text_delta("refusal", refusal))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    out.append(self._call_delta(call))
                if self._ended:
                    break
        return b"".join(out)

    def finish(self) -> bytes:
        """The .done events of every item, then response.completed (or .incomplete)."""
        if self._ended:
            return b""
        out = []
        for index in sorted(self._pending):
            # A call whose name never came is still a call: the client sees it, named "".
            out.append(self._add_call(index, self._pending.pop(index), ""))
        if self._message is None and not self._calls:
            out.append(self._open_text("output_text"))
        status = "incomplete" if self._finish in _INCOMPLETE else "completed"
        for index, item in enumerate(self._items):
            if item["type"] != "function_call":
                out.append(self._close_text(index, item, status))
            else:
                item["status"] = "completed"
                item["arguments"] = "".join(self._texts[item["id"]])
                out.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=index,
                        arguments=item["arguments"],
                    )
                )
                out.append(self._event("response.output_item.done", output_index=index, item=item))
        self._ended = True
        response = self._response(status, self._items, _incomplete(self._finish))
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out.append(self._event(kind, response=response))
        return b"".join(out)

    def fail(self, message: str, code: str) -> bytes:
        """response.failed: the answer broke off; ``message`` says why.  Before start(): an error event."""
        if self._ended:
            return b""
        self._ended = True
        if self._sequence == 0:
            return self._event("error", code=code, message=message, param=None)
        error = {"code": code if code in _ERROR_CODES else "server_error", "message": message}
        output = [dict(item, status="incomplete") for item in self._items]
        for index, item in enumerate(self._items):
            # The text and arguments relayed so far, as the client's accumulator holds them.
            if item["type"] == "function_call":
                output[index]["arguments"] = "".join(self._texts[item["id"]])
            else:
                output[index]["content"] = [_part(item["content"][0]["type"], "".join(self._texts[item["id"]]))]
        response = self._response("failed", output, error=error)
        return self._event("response.failed", response=response)

    # Text -------------------------------------------------------------------------

    def _text_delta(self, part: str, delta: str) -> bytes:
        item = self._reasoning if part == "reasoning_text" else self._message
        out = b""
        if item is None:
            out = self._open_text(part)
            item = self._reasoning if part == "reasoning_text" else self._message
            assert item is not None
        # Text and a refusal in one answer: the client keeps the first kind's part.
        part = item["content"][0]["type"]
        if not self._hold(len(delta)):
            return out + self._overflow()
        self._texts[item["id"]].append(delta)
        fields: dict[str, Any] = {"item_id": item["id"], "output_index": self._items.index(item), "content_index": 0}
        if part == "output_text":
            fields["logprobs"] = []
        return out + self._event(_DELTA[part], delta=delta, **fields)

    def _open_text(self, part: str) -> bytes:
        """A message (output_text, refusal) or a reasoning item (reasoning_text), added with its one part."""
        if part == "reasoning_text":
            item: dict = {"id": f"rs_{self._base}", "type": "reasoning", "summary": [], "status": "in_progress", "content": []}
            self._reasoning = item
        else:
            item = {"id": f"msg_{self._base}", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            self._message = item
        self._texts[item["id"]] = []
        self._items.append(item)
        index = len(self._items) - 1
        added = self._event("response.output_item.added", output_index=index, item=dict(item))
        item["content"] = [_part(part, "")]
        return added + self._event(
            "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=_part(part, "")
        )

    def _close_text(self, index: int, item: dict, status: str) -> bytes:
        text = "".join(self._texts[item["id"]])
        part = _part(item["content"][0]["type"], text)
        item["content"] = [part]
        item["status"] = status
        fields: dict[str, Any] = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if part["type"] == "output_text":
            fields["logprobs"] = []
        said = {"refusal": text} if part["type"] == "refusal" else {"text": text}
        return (
            self._event(_DONE[part["type"]], **said, **fields)
            + self._event("response.content_part.done", part=part, item_id=item["id"], output_index=index, content_index=0)
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    # Tool calls --------------------------------------------------------------------

    def _call_delta(self, call: dict) -> bytes:
        index = call.get("index", 0)
        if type(index) is not int:
            index = 0
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = _str(function.get("arguments"))
        if not self._hold(len(arguments)):
            return self._overflow()
        item = self._calls.get(index)
        if item is not None:
            return self._arguments(index, item, arguments)
        pending = self._pending.setdefault(index, {"call_id": "", "arguments": []})
        if len(self._calls) + len(self._pending) > MAX_TOOL_CALLS:
            return self._overflow()
        pending["call_id"] = pending["call_id"] or _str(call.get("id"))
        pending["arguments"].append(arguments)
        name = _str(function.get("name"))
        if not name:
            return b""
        return self._add_call(index, self._pending.pop(index), name)

    def _add_call(self, index: int, pending: dict, name: str) -> bytes:
        n = len(self._calls)
        item = _call_item(self._base, n, pending["call_id"] or _call_id(self._base, n), name, "", "in_progress")
        self._calls[index] = item
        self._texts[item["id"]] = []
        self._items.append(item)
        added = self._event("response.output_item.added", output_index=len(self._items) - 1, item=dict(item))
        return added + self._arguments(index, item, "".join(pending["arguments"]))

    def _arguments(self, index: int, item: dict, delta: str) -> bytes:
        if not delta:
            return b""
        self._texts[item["id"]].append(delta)
        return self._event(
            "response.function_call_arguments.delta",
            item_id=item["id"],
            output_index=self._items.index(item),
            delta=delta,
        )

    # Plumbing ----------------------------------------------------------------------

    def _hold(self, chars: int) -> bool:
        self._held += chars
        return self._held <= self._max_chars

    def _overflow(self) -> bytes:
        return self.fail(
            f"the answer is longer than llmgw's Responses translation holds ({self._max_chars} characters "
            f"of text and arguments, {MAX_TOOL_CALLS} tool calls); ask for fewer max_output_tokens, "
            "or use /v1/chat/completions, which llmgw relays without holding it",
            "server_error",
        )

    def _response(
        self, status: str, output: list[dict], incomplete: dict | None = None, error: dict | None = None
    ) -> dict:
        return response_object(
            self._request, self._id, self._created, self._model, status, output, self._usage, incomplete, error
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _message_item(base: str, part: str, text: str, status: str) -> dict:
    return {
        "id": f"msg_{base}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [_part(part, text)],
    }


def _part(kind: str, text: str) -> dict:
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    if kind == "reasoning_text":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(base: str, n: int, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "id": f"fc_{base}{n:04x}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _call_id(base: str, n: int) -> str:
    return f"call_{base}{n:04x}"


def _usage(chat: Any) -> dict | None:
    """Chat's usage in the Responses' words; None when the engine did not report it."""
    usage = chat.get("usage") if isinstance(chat, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    prompt_details = usage.get("prompt_tokens_details")
    cached = token_count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
    completion_details = usage.get("completion_tokens_details")
    reasoning = token_count(completion_details.get("reasoning_tokens")) if isinstance(completion_details, dict) else None
    return {
        "input_tokens": prompt,
        # Parts of the counts above, so never more than them.
        "input_tokens_details": {"cached_tokens": min(cached or 0, prompt), "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(reasoning or 0, completion)},
        "total_tokens": prompt + completion,
    }


def _incomplete(finish: Any) -> dict | None:
    reason = _INCOMPLETE.get(finish) if isinstance(finish, str) else None
    return {"reason": reason} if reason else None


def _echo_tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        return []
    return [
        {
            "type": "function",
            "name": tool.get("name"),
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
            "strict": tool.get("strict"),
        }
        for tool in tools
        if isinstance(tool, dict) and tool.get("type") == "function"
    ]


def _model(request: dict, chat: Any) -> str:
    model = request.get("model")
    if isinstance(model, str) and model:
        return model
    return _str(chat.get("model")) if isinstance(chat, dict) else ""


def _base(response_id: str) -> str:
    return response_id.removeprefix("resp_")


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
