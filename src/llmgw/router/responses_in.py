"""A Responses API request, as a chat completions request an engine serves.

``to_chat(body)`` takes the JSON body a client sent to ``POST /v1/responses``
(OpenAI's shape, as the official clients and the Agents SDK send it) and
returns the body of the ``/v1/chat/completions`` request that does the same
work on any engine.  What cannot be done without a store of earlier responses
or OpenAI's hosted tools is refused with ``InvalidRequest`` naming the field,
the way OpenAI names it (``input[2].content[0].file_id``).  Fields the
translation has no use for (``store``, ``metadata``, ``user``, ``include``,
``reasoning``, ``truncation`` ...) are accepted and not sent on; the answer
echoes the ones the Response object carries (responses_out.py).

docs/router.rst, "The Responses API", lists what is translated and what not.
"""

from __future__ import annotations

import re
from typing import Any

from llmgw.router.bodies import MAX_TOKENS
from llmgw.router.errors import InvalidRequest

# OpenAI's built-in tools: they run on OpenAI's servers, so no engine has them.
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "computer",
        "computer_use_preview",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)

# Fields that need a response OpenAI stored earlier, or a conversation it keeps.
_STATEFUL = ("previous_response_id", "conversation", "prompt", "context_management")

_MESSAGE_ROLES = ("user", "assistant", "system", "developer")
_TOOL_CHOICES = ("none", "auto", "required")
_IMAGE_DETAILS = ("auto", "low", "high")
_SKIPPED_ITEMS = ("reasoning",)
# Levels of objects and lists a request may nest: OpenAI allows a schema 10;
# Python's JSON encoder gives out near 1,000, at a depth that depends on the
# stack it is called from, and a request is encoded again for the engine and
# echoed in every Response.
MAX_DEPTH = 64
# A function's name as OpenAI takes it: engines write it into a prompt and
# into a grammar, where a quote or a newline is not a name.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A value of the client's shown in a message: enough to recognise it.
_SHOWN_CHARS = 80


def to_chat(body: dict) -> dict:
    """The /v1/chat/completions body that answers the Responses request ``body``."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param=None)
    _refuse_deep(body)
    _refuse_stateful(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model must be the name of a model, a string: GET /v1/models lists them", param="model")
    chat: dict[str, Any] = {"model": model, "messages": _messages(body)}
    tools = _tools(body.get("tools"))
    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        tools, choice = _tool_choice(tool_choice, tools)
        chat["tool_choice"] = choice
    if tools:
        chat["tools"] = tools
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        chat["parallel_tool_calls"] = _bool(parallel, "parallel_tool_calls")
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if type(max_output_tokens) is float and max_output_tokens.is_integer():
            max_output_tokens = int(max_output_tokens)  # 64.0 is JSON's 64 too
        if type(max_output_tokens) is not int or not 1 <= max_output_tokens <= MAX_TOKENS:
            raise InvalidRequest(
                f"max_output_tokens must be a whole number from 1 to {MAX_TOKENS}, got {_shown(max_output_tokens)}",
                param="max_output_tokens",
            )
        chat["max_tokens"] = max_output_tokens
    for name, top in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is not None:
            chat[name] = _number(value, name, top)
    stream = body.get("stream")
    if stream is not None and _bool(stream, "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _refuse_deep(body: dict) -> None:
    for name, value in body.items():
        if _nests_over(value, MAX_DEPTH - 1):
            raise InvalidRequest(
                f"{name} is nested more than {MAX_DEPTH} objects or lists deep, more than llmgw translates: "
                "flatten it (a JSON schema can name its parts in $defs)",
                param=name,
            )


def _nests_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and lists more than ``limit`` levels; no recursion, so no depth breaks it."""
    level, depth = [value], 0
    while True:
        containers = [v for v in level if v.__class__ is dict or v.__class__ is list]
        if not containers:
            return False
        depth += 1
        if depth > limit:
            return True
        level = [x for v in containers for x in (v.values() if v.__class__ is dict else v)]


def _refuse_stateful(body: dict) -> None:
    for name in _STATEFUL:
        if body.get(name) is not None:
            raise InvalidRequest(
                f"{name} is not supported: llmgw keeps no responses or conversations; "
                "send the whole conversation in input instead",
                param=name,
            )
    background = body.get("background")
    if background is not None and _bool(background, "background"):
        raise InvalidRequest(
            "background mode is not supported: llmgw keeps no responses to poll; "
            "send the request with stream: true or wait for its answer",
            param="background",
        )
    store = body.get("store")
    if store is not None:
        _bool(store, "store")


# Messages -----------------------------------------------------------------------


def _messages(body: dict) -> list[dict]:
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if given is None:
        raise InvalidRequest("input is required: a string, or a list of messages and tool outputs", param="input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    if not isinstance(given, list):
        raise InvalidRequest(
            f"input must be a string or a list of items, got {_kind(given)}", param="input"
        )
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object, got {_kind(item)}", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _add_call(messages, item, where)
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        elif kind in _SKIPPED_ITEMS:
            continue
        elif kind == "item_reference":
            raise InvalidRequest(
                f"{where} is an item_reference: llmgw keeps no items to refer to; send the item itself",
                param=f"{where}.id",
            )
        else:
            raise InvalidRequest(
                f"{where}.type {_shown(kind)} is not supported: llmgw translates message, function_call "
                "and function_call_output items",
                param=f"{where}.type",
            )
    return _joined_systems(messages)


def _joined_systems(messages: list[dict]) -> list[dict]:
    """``messages`` with each run of adjacent system messages of text made one.

    instructions, then a developer message (as Codex sends): many chat
    templates take one system message.  Joined once a run, not once a message,
    which copied the text so far each time: 40,000 of them were half a minute.
    """
    out: list[dict] = []
    run: list[str] = []
    for message in messages:
        if message["role"] == "system" and isinstance(message["content"], str):
            run.append(message["content"])
            continue
        if run:
            out.append({"role": "system", "content": "\n\n".join(run)})
            run = []
        out.append(message)
    if run:
        out.append({"role": "system", "content": "\n\n".join(run)})
    return out


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise InvalidRequest(
            f"{where}.role must be one of {', '.join(_MESSAGE_ROLES)}, got {_shown(role)}", param=f"{where}.role"
        )
    content = item.get("content")
    # Engines' chat templates know "system"; few know OpenAI's "developer".
    chat_role = "system" if role == "developer" else role
    if isinstance(content, str):
        return {"role": chat_role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{where}.content must be a string or a list of parts, got {_kind(content)}", param=f"{where}.content"
        )
    parts = [_part(part, role, f"{where}.content[{j}]") for j, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        # A string is what every chat template reads; vLLM joins text parts with newlines too.
        return {"role": chat_role, "content": "\n".join(part["text"] for part in parts)}
    return {"role": chat_role, "content": parts}


def _part(part: Any, role: str, where: str) -> dict:
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where} must be an object, got {_kind(part)}", param=where)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": _string(part.get("text"), f"{where}.text")}
    if kind == "refusal" and role == "assistant":
        return {"type": "text", "text": _string(part.get("refusal"), f"{where}.refusal")}
    if kind == "input_image" and role != "assistant":
        if part.get("file_id") is not None:
            raise InvalidRequest(
                f"{where}.file_id is not supported: llmgw keeps no files; send the image as image_url "
                "(a URL or a data: URL)",
                param=f"{where}.file_id",
            )
        image: dict[str, Any] = {"url": _string(part.get("image_url"), f"{where}.image_url")}
        detail = part.get("detail")
        if detail in _IMAGE_DETAILS:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        raise InvalidRequest(
            f"{where} is an input_file: llmgw translates text and images only", param=f"{where}.type"
        )
    raise InvalidRequest(
        f"{where}.type {_shown(kind)} is not a part a {role} message may hold here: "
        + ("output_text or refusal" if role == "assistant" else "input_text or input_image"),
        param=f"{where}.type",
    )


def _add_call(messages: list[dict], item: dict, where: str) -> None:
    call = {
        "id": _string(item.get("call_id"), f"{where}.call_id"),
        "type": "function",
        "function": {
            "name": _string(item.get("name"), f"{where}.name"),
            "arguments": _string(item.get("arguments"), f"{where}.arguments"),
        },
    }
    last = messages[-1] if messages else None
    # An assistant's text and the calls that follow it are one chat message;
    # so are calls made together.
    if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), (str, type(None))):
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict, where: str) -> dict:
    call_id = _string(item.get("call_id"), f"{where}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        texts = []
        for j, part in enumerate(output):
            part_where = f"{where}.output[{j}]"
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
                raise InvalidRequest(
                    f"{part_where} must be an input_text part: a chat engine takes text from tools",
                    param=part_where,
                )
            texts.append(_string(part.get("text"), f"{part_where}.text"))
        output = "".join(texts)
    elif not isinstance(output, str):
        raise InvalidRequest(
            f"{where}.output must be a string or a list of input_text parts, got {_kind(output)}",
            param=f"{where}.output",
        )
    return {"role": "tool", "tool_call_id": call_id, "content": output}


# Tools and formats ----------------------------------------------------------------


def _tools(given: Any) -> list[dict]:
    if given is None:
        return []
    if not isinstance(given, list):
        raise InvalidRequest(f"tools must be a list, got {_kind(given)}", param="tools")
    tools = []
    for i, tool in enumerate(given):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where} must be an object, got {_kind(tool)}", param=where)
        kind = tool.get("type")
        if kind in HOSTED_TOOLS:
            raise InvalidRequest(
                f"{where} is OpenAI's hosted tool {_shown(kind)}, which no engine here runs: "
                "llmgw passes function tools only; define it as a function your code runs",
                param=f"{where}.type",
            )
        if kind != "function":
            raise InvalidRequest(
                f"{where}.type {_shown(kind)} is not supported: llmgw passes function tools only",
                param=f"{where}.type",
            )
        function: dict[str, Any] = {"name": _function_name(tool.get("name"), f"{where}.name")}
        description = tool.get("description")
        if description is not None:
            function["description"] = _string(description, f"{where}.description")
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise InvalidRequest(
                    f"{where}.parameters must be a JSON schema object, got {_kind(parameters)}",
                    param=f"{where}.parameters",
                )
            function["parameters"] = parameters
        strict = tool.get("strict")
        if strict is not None:
            function["strict"] = _bool(strict, f"{where}.strict")
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(given: Any, tools: list[dict]) -> tuple[list[dict], Any]:
    if isinstance(given, str):
        if given not in _TOOL_CHOICES:
            raise InvalidRequest(
                f"tool_choice must be one of {', '.join(_TOOL_CHOICES)} or an object, got {_shown(given)}",
                param="tool_choice",
            )
        return tools, given
    if not isinstance(given, dict):
        raise InvalidRequest(f"tool_choice must be a string or an object, got {_kind(given)}", param="tool_choice")
    kind = given.get("type")
    names = {tool["function"]["name"] for tool in tools}
    if kind == "function":
        name = _function_name(given.get("name"), "tool_choice.name")
        if name not in names:
            named = ", ".join(sorted(names)[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
            raise InvalidRequest(
                f"tool_choice.name {_shown(name)} is not among tools, which name {named or 'none'}",
                param="tool_choice.name",
            )
        return tools, {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        mode = given.get("mode")
        if mode not in ("auto", "required"):
            raise InvalidRequest("tool_choice.mode must be auto or required", param="tool_choice.mode")
        allowed = given.get("tools")
        if not isinstance(allowed, list):
            raise InvalidRequest("tool_choice.tools must be a list", param="tool_choice.tools")
        keep = set()
        for i, tool in enumerate(allowed):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise InvalidRequest(
                    f"tool_choice.tools[{i}] must be a function tool: llmgw passes function tools only",
                    param=f"tool_choice.tools[{i}]",
                )
            keep.add(_function_name(tool.get("name"), f"tool_choice.tools[{i}].name"))
        # Chat engines know no allowed-tools list: the ones not allowed are not sent.
        return [tool for tool in tools if tool["function"]["name"] in keep], mode
    if kind in HOSTED_TOOLS:
        raise InvalidRequest(
            f"tool_choice.type {_shown(kind)} is OpenAI's hosted tool, which no engine here runs", param="tool_choice.type"
        )
    raise InvalidRequest(
        f"tool_choice.type {_shown(kind)} is not supported: use function or allowed_tools", param="tool_choice.type"
    )


def _response_format(text: Any) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest(f"text must be an object, got {_kind(text)}", param="text")
    given = text.get("format")
    if given is None:
        return None
    if not isinstance(given, dict):
        raise InvalidRequest(f"text.format must be an object, got {_kind(given)}", param="text.format")
    kind = given.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = given.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                f"text.format.schema must be a JSON schema object, got {_kind(schema)}", param="text.format.schema"
            )
        json_schema: dict[str, Any] = {"name": _string(given.get("name"), "text.format.name"), "schema": schema}
        if given.get("description") is not None:
            json_schema["description"] = _string(given.get("description"), "text.format.description")
        if given.get("strict") is not None:
            json_schema["strict"] = _bool(given.get("strict"), "text.format.strict")
        return {"type": "json_schema", "json_schema": json_schema}
    raise InvalidRequest(
        f"text.format.type must be text, json_object or json_schema, got {_shown(kind)}", param="text.format.type"
    )


# Values ---------------------------------------------------------------------------


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be a string, got {_kind(value)}", param=where)
    return value


def _function_name(value: Any, where: str) -> str:
    name = _string(value, where)
    if _FUNCTION_NAME.fullmatch(name) is None:
        raise InvalidRequest(
            f"{where} {_shown(name)} is not a function name: 1 to 64 letters, digits, _ and - (as OpenAI takes it)",
            param=where,
        )
    return name


def _shown(value: Any) -> str:
    """A client's value in a message: a string or number quoted and cut short, anything else named by its kind."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = repr(value[: _SHOWN_CHARS + 1] if isinstance(value, str) else value)
        return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
    return "null" if value is None else _kind(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{where} must be true or false, got {_kind(value)}", param=where)
    return value


def _number(value: Any, where: str, top: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
        raise InvalidRequest(f"{where} must be a number from 0 to {top:g}, got {_shown(value)}", param=where)
    return value


def _kind(value: Any) -> str:
    """What a JSON value is, in the words of JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({_shown(value)})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
