"""A Responses API request becomes the chat completions request an engine serves.

The bodies are the ones the official openai client sends (captured from
``client.responses.create`` over a mock transport), so a change in what the
client sends shows here and not first in front of a user.
"""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from llmgw.router.errors import InvalidRequest
from llmgw.router.responses_in import HOSTED_TOOLS, to_chat


def sent(**create) -> dict:
    """The JSON body the openai client sends for ``client.responses.create(**create)``."""
    bodies = []

    def engine(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        return httpx2.Response(400, json={"error": {"message": "captured", "type": "invalid_request_error"}})

    client = openai.OpenAI(
        api_key="k", base_url="http://llmgw.test/v1", max_retries=0, http_client=httpx2.Client(transport=httpx2.MockTransport(engine))
    )
    with pytest.raises(openai.BadRequestError):
        client.responses.create(**create)
    return bodies[0]


def refused(body: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        to_chat(body)
    assert caught.value.status == 400
    return caught.value


def test_text_input_is_one_user_message():
    assert to_chat(sent(model="gemma", input="Say hi")) == {
        "model": "gemma",
        "messages": [{"role": "user", "content": "Say hi"}],
    }


def test_instructions_come_first_as_the_system_message():
    chat = to_chat(sent(model="gemma", instructions="Be brief.", input="Say hi"))
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]


def test_messages_of_every_role_and_part():
    chat = to_chat(
        sent(
            model="gemma",
            input=[
                {"role": "system", "content": "sys"},
                {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is this?"},
                        {"type": "input_image", "image_url": "https://example.org/cat.png", "detail": "low"},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "a cat", "annotations": []}],
                },
                {"role": "user", "content": [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}]},
            ],
        )
    )
    assert chat["messages"] == [
        # Engines' chat templates know "system", and many only one: developer
        # messages are sent as that, and adjacent ones as one.
        {"role": "system", "content": "sys\n\ndev"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.org/cat.png", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": "one\ntwo"},
    ]


def test_instructions_and_a_developer_message_are_one_system_message():
    chat = to_chat(sent(model="gemma", instructions="Be brief.", input=[
        {"role": "developer", "content": "cwd: /src"},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": "later"},
    ]))
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\n\ncwd: /src"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "later"},
    ]


def test_function_tools_and_tool_choice():
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    }
    chat = to_chat(sent(model="gemma", input="Weather in Paris?", tools=[tool], tool_choice="required", parallel_tool_calls=False))
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": tool["parameters"],
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == "required"
    assert chat["parallel_tool_calls"] is False
    named = to_chat(sent(model="gemma", input="x", tools=[tool], tool_choice={"type": "function", "name": "get_weather"}))
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_allowed_tools_sends_only_the_allowed_ones():
    tools = [{"type": "function", "name": n, "parameters": {"type": "object"}, "strict": None} for n in ("a", "b", "c")]
    chat = to_chat(
        sent(
            model="gemma",
            input="x",
            tools=tools,
            tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "b"}]},
        )
    )
    assert [t["function"]["name"] for t in chat["tools"]] == ["b"]
    assert chat["tool_choice"] == "required"


def test_function_call_round_trip():
    """The Agents SDK's second turn: the model's call and the code's answer to it."""
    chat = to_chat(
        sent(
            model="gemma",
            input=[
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21C"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": "{}"},
            ],
        )
    )
    assert chat["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
        },
    ]


def test_json_schema_and_json_object():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    chat = to_chat(
        sent(model="gemma", input="a number", text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}})
    )
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "num", "schema": schema, "strict": True}}
    assert to_chat(sent(model="gemma", input="x", text={"format": {"type": "json_object"}}))["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in to_chat(sent(model="gemma", input="x", text={"format": {"type": "text"}}))


def test_sampling_limits_and_streaming():
    chat = to_chat(sent(model="gemma", input="x", max_output_tokens=64, temperature=0.2, top_p=0.9, store=True, metadata={"a": "b"}))
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"]) == (64, 0.2, 0.9)
    assert "stream" not in chat and "store" not in chat and "metadata" not in chat
    assert to_chat({"model": "gemma", "input": "x", "max_output_tokens": 64.0})["max_tokens"] == 64
    streamed = to_chat({"model": "gemma", "input": "x", "stream": True})
    assert streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("kind", sorted(HOSTED_TOOLS))
def test_hosted_tools_are_refused_by_name(kind):
    error = refused({"model": "gemma", "input": "x", "tools": [{"type": "function", "name": "f"}, {"type": kind}]})
    assert error.param == "tools[1].type"
    assert repr(kind) in error.message and "hosted" in error.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ],
)
def test_what_needs_a_store_is_refused_naming_the_field(extra, param):
    error = refused({"model": "gemma", "input": "x", **extra})
    assert error.param == param
    assert "llmgw keeps no" in error.message


def test_store_and_background_false_are_accepted():
    assert to_chat(sent(model="gemma", input="x", store=True, background=False))["messages"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": 7, "input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": ["hi"]}, "input[0]"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}, "input[0].content[0].text"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input[0].content[0].file_id"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}]}, "input[0].content[0].image_url"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type"),
        ({"model": "m", "input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0].type"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
        ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
        ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]}, "input[0].output[0]"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].id"),
        ({"model": "m", "input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"model": "m", "input": "x", "instructions": ["a"]}, "instructions"),
        ({"model": "m", "input": "x", "tools": {}}, "tools"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": "{}"}]}, "tools[0].parameters"),
        ({"model": "m", "input": "x", "tools": [{"type": "custom", "name": "f"}]}, "tools[0].type"),
        ({"model": "m", "input": "x", "tool_choice": "any"}, "tool_choice"),
        ({"model": "m", "input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"model": "m", "input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"model": "m", "input": "x", "text": "json"}, "text"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": 1.5}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": True}, "max_output_tokens"),
        ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "input": "x", "temperature": 2.5}, "temperature"),
        ({"model": "m", "input": "x", "top_p": -0.1}, "top_p"),
        ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "x", "parallel_tool_calls": 1}, "parallel_tool_calls"),
        ({"model": "m", "input": "x", "store": "no"}, "store"),
        ({"model": "m", "input": "x", "background": "true"}, "background"),
    ],
)
def test_odd_input_is_refused_naming_the_field(body, param):
    error = refused(body)
    assert error.param == param
    assert error.message.startswith(param.split("[")[0]) or param in error.message


def test_a_body_that_is_not_an_object_is_refused():
    assert refused([]).status == 400  # type: ignore[arg-type]


def test_nesting_is_taken_to_max_depth_and_refused_past_it_naming_the_field():
    from llmgw.router.responses_in import MAX_DEPTH

    def nested(levels: int) -> dict:
        value: dict = {}
        for _ in range(levels - 1):
            value = {"a": value}
        return value

    # The body is one level, the metadata object the rest.
    assert "model" in to_chat({"model": "m", "input": "hi", "metadata": nested(MAX_DEPTH - 1)})
    error = refused({"model": "m", "input": "hi", "metadata": nested(MAX_DEPTH)})
    assert error.param == "metadata" and f"more than {MAX_DEPTH}" in error.message
    assert refused({"model": "m", "input": [[[[[[]]]]]] * 3 + [nested(MAX_DEPTH)]}).param == "input"


@pytest.mark.parametrize("name", ["", "a b", "get\nweather", 'x"y', "wetter_für_heute", "f" * 65, "天気"])
def test_a_function_name_is_what_openai_takes_or_refused_naming_where(name):
    tool = {"type": "function", "name": name, "parameters": {"type": "object"}}
    assert refused({"model": "m", "input": "hi", "tools": [tool]}).param == "tools[0].name"
    ok = {"type": "function", "name": "get_weather-2"}
    choice = {"type": "function", "name": name}
    assert refused({"model": "m", "input": "hi", "tools": [ok], "tool_choice": choice}).param == "tool_choice.name"
    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": name}]}
    assert refused({"model": "m", "input": "hi", "tools": [ok], "tool_choice": allowed}).param == "tool_choice.tools[0].name"


@pytest.mark.parametrize("body", [
    {"model": "m", "input": [{"type": "x" * 1_000_000}]},
    {"model": "m", "input": [{"role": "y" * 1_000_000, "content": "hi"}]},
    {"model": "m", "input": "hi", "max_output_tokens": "9" * 1_000_000},
    {"model": "m", "input": "hi", "temperature": 10**4000},
    {"model": "m", "input": "hi", "tool_choice": "z" * 1_000_000},
    {"model": "m", "input": "hi", "tools": [{"type": "function", "name": f"f{i}"} for i in range(10_000)],
     "tool_choice": {"type": "function", "name": "nope"}},
])
def test_a_refusal_shows_at_most_a_little_of_the_clients_value(body):
    assert len(refused(body).message) < 400


@pytest.mark.parametrize("tokens", [0, -1, 2**30 + 1, 10**20, 1.5, True])
def test_max_output_tokens_is_a_count_an_engine_can_hold(tokens):
    assert refused({"model": "m", "input": "hi", "max_output_tokens": tokens}).param == "max_output_tokens"
    assert to_chat({"model": "m", "input": "hi", "max_output_tokens": 2**30})["max_tokens"] == 2**30


def test_many_system_messages_are_joined_in_linear_time():
    import time

    started = time.monotonic()
    chat = to_chat({"model": "m", "instructions": "i", "input": [{"role": "developer", "content": "x" * 20}] * 80_000
                    + [{"role": "user", "content": "hi"}, {"role": "system", "content": "a"}, {"role": "system", "content": "b"}]})
    # Joined once a message it was a minute: each join copied the text so far.
    assert time.monotonic() - started < 5
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system"]
    assert chat["messages"][0]["content"] == "\n\n".join(["i"] + ["x" * 20] * 80_000)
    assert chat["messages"][2]["content"] == "a\n\nb"
