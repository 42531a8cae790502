"""An engine's chat completion becomes the Response, and its chunk stream the event stream, that the official client reads.

Each test puts the translation between the openai client and a canned engine
answer over a mock transport: the client's request goes through ``to_chat``,
the engine's answer through ``from_chat`` or ``ResponsesStream``.  Every
Response is validated by openai's own ``Response`` model and every event by
its ``ResponseStreamEvent`` union, and the streams are read by the client's
``responses.stream`` accumulator, which refuses an event out of order.
"""

from __future__ import annotations

import json

import httpx2
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from llmgw.router.responses_in import to_chat
from llmgw.router.responses_out import MAX_TOOL_CALLS, ResponsesStream, from_chat

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
RID = "resp_0123456789abcdef0123456789abcdef"
CREATED = 1_780_000_000


def chunk(content=None, tool_calls=None, finish=None, usage=None, refusal=None) -> dict:
    delta = {}
    if content is not None:
        delta["content"] = content
    if refusal is not None:
        delta["refusal"] = refusal
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else []
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gemma", "choices": choices, "usage": usage}


def call_delta(index, arguments, call_id=None, name=None) -> dict:
    function = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    delta = {"index": index, "type": "function", "function": function}
    if call_id is not None:
        delta["id"] = call_id
    return delta


def completion(content="Hello", finish="stop", tool_calls=None, usage=(12, 3), refusal=None) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if refusal is not None:
        message["refusal"] = refusal
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "/models/gemma.gguf",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        answer["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return answer


def sse_events(data: bytes) -> list[dict]:
    """The events of an SSE body, each checked against openai's event union and its ``event:`` line."""
    events = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        kind, payload = block.split("\n")
        event = json.loads(payload.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


class Engine:
    """An engine behind the translation: answers with one canned completion, or a canned chunk stream."""

    def __init__(self, answer: dict | None = None, chunks: list[dict] | None = None, max_chars: int | None = None):
        self.answer = answer
        self.chunks = chunks or []
        self.max_chars = max_chars
        self.chat_requests: list[dict] = []
        self.sse = b""

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        chat = to_chat(body)
        self.chat_requests.append(chat)
        if not chat.get("stream"):
            response = from_chat(self.answer or completion(), body, RID, CREATED)
            Response.model_validate(response)
            return httpx2.Response(200, json=response)
        kw = {} if self.max_chars is None else {"max_chars": self.max_chars}
        stream = ResponsesStream(body, RID, CREATED, body["model"], **kw)
        out = [stream.start()] + [stream.feed(c) for c in self.chunks] + [stream.finish()]
        self.sse = b"".join(out)
        sse_events(self.sse)
        return httpx2.Response(200, content=self.sse, headers={"content-type": "text/event-stream"})

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            api_key="k",
            base_url="http://llmgw.test/v1",
            max_retries=0,
            http_client=httpx2.Client(transport=httpx2.MockTransport(self)),
        )


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
    "strict": True,
}


# Whole answers ---------------------------------------------------------------------


def test_text_answer():
    engine = Engine(completion("Hello there", usage=(12, 3)))
    response = engine.client().responses.create(model="gemma", instructions="Be brief.", input="Say hi", temperature=0.5)
    assert response.id == RID and response.object == "response" and response.status == "completed"
    assert response.output_text == "Hello there"
    assert response.output[0].id.startswith("msg_")
    # The model is the one the client named, not the engine's file name.
    assert response.model == "gemma"
    assert (response.instructions, response.temperature) == ("Be brief.", 0.5)
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (12, 3, 15)
    assert response.incomplete_details is None


def test_usage_absent_when_the_engine_does_not_say():
    assert from_chat(completion(usage=None), {"model": "gemma"}, RID, CREATED)["usage"] is None


def test_function_call_round_trip():
    call = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    engine = Engine(completion(None, finish="tool_calls", tool_calls=[call]))
    client = engine.client()
    first = client.responses.create(model="gemma", input="Weather in Paris?", tools=[WEATHER], tool_choice="auto")
    [item] = first.output
    assert (item.type, item.call_id, item.name, item.arguments) == ("function_call", "call_7", "get_weather", '{"city":"Paris"}')
    assert item.id.startswith("fc_")
    assert first.tools[0].name == "get_weather" and first.tool_choice == "auto"

    engine.answer = completion("It is 18C in Paris.")
    second = client.responses.create(
        model="gemma",
        input=[*first.output, {"type": "function_call_output", "call_id": "call_7", "output": "18C"}],
        tools=[WEATHER],
    )
    assert second.output_text == "It is 18C in Paris."
    assert engine.chat_requests[1]["messages"] == [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "content": "18C"},
    ]


def test_text_and_calls_together_and_an_answer_replayed():
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
    ]
    engine = Engine(completion("Checking both.", finish="tool_calls", tool_calls=calls))
    client = engine.client()
    first = client.responses.create(model="gemma", input="Paris and Rome?", tools=[WEATHER])
    assert [item.type for item in first.output] == ["message", "function_call", "function_call"]
    assert len({item.id for item in first.output}) == 3
    client.responses.create(model="gemma", input=[*first.output], tools=[WEATHER])
    assert engine.chat_requests[1]["messages"] == [{"role": "assistant", "content": "Checking both.", "tool_calls": calls}]


def test_json_schema_parsed_by_the_client():
    class City(pydantic.BaseModel):
        name: str
        population: int

    engine = Engine(completion('{"name":"Paris","population":2100000}'))
    parsed = engine.client().responses.parse(model="gemma", input="Paris?", text_format=City)
    assert parsed.output_parsed == City(name="Paris", population=2100000)
    sent = engine.chat_requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True
    assert sent["json_schema"]["schema"]["required"] == ["name", "population"]


def test_length_is_incomplete_with_its_reason():
    engine = Engine(completion("Once upon a", finish="length"))
    response = engine.client().responses.create(model="gemma", input="A story", max_output_tokens=16)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.max_output_tokens == 16


def test_reasoning_is_a_reasoning_item_before_the_message():
    answer = completion("42")
    answer["choices"][0]["message"]["reasoning_content"] = "Six times seven."
    response = Response.model_validate(from_chat(answer, {"model": "gemma"}, RID, CREATED))
    reasoning, message = response.output
    assert (reasoning.type, reasoning.content[0].text, reasoning.id[:3]) == ("reasoning", "Six times seven.", "rs_")
    assert response.output_text == "42"


def test_refusal_is_a_refusal_part():
    response = from_chat(completion(None, refusal="I can't help with that."), {"model": "gemma"}, RID, CREATED)
    Response.model_validate(response)
    assert response["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]


def test_an_empty_answer_is_an_empty_message():
    response = Response.model_validate(from_chat(completion(""), {"model": "gemma"}, RID, CREATED))
    assert response.output_text == "" and len(response.output) == 1


@pytest.mark.parametrize("chat", [{}, {"choices": []}, {"choices": ["x"]}, [], {"object": "list", "data": []}])
def test_an_answer_that_is_not_a_chat_completion_is_refused(chat):
    with pytest.raises(ValueError, match="not a chat completion"):
        from_chat(chat, {"model": "gemma"}, RID, CREATED)


# Streams -------------------------------------------------------------------------------


def kinds(events: list) -> list[str]:
    return [e.type if hasattr(e, "type") else e["type"] for e in events]


def test_streamed_text():
    engine = Engine(chunks=[chunk(""), chunk("Hel"), chunk("lo"), chunk(finish="stop"), chunk(usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7})])
    with engine.client().responses.stream(model="gemma", input="Say hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert engine.chat_requests[0]["stream_options"] == {"include_usage": True}
    assert kinds(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.snapshot for e in events if e.type == "response.output_text.delta"] == ["Hel", "Hello"]
    assert final.output_text == "Hello" and final.status == "completed"
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (5, 2, 7)


def test_streamed_tool_call_arguments():
    engine = Engine(
        chunks=[
            chunk(tool_calls=[call_delta(0, "", call_id="call_9", name="get_weather")]),
            chunk(tool_calls=[call_delta(0, '{"city":')]),
            chunk(tool_calls=[call_delta(0, '"Paris"}')]),
            chunk(finish="tool_calls"),
        ]
    )
    with engine.client().responses.stream(model="gemma", input="Weather?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert kinds(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2].item
    assert (added.type, added.call_id, added.name, added.arguments) == ("function_call", "call_9", "get_weather", "")
    assert events[4].snapshot == '{"city":"Paris"}'
    assert events[5].arguments == '{"city":"Paris"}'
    [item] = final.output
    assert (item.call_id, item.arguments, item.status) == ("call_9", '{"city":"Paris"}', "completed")


def test_text_then_interleaved_parallel_calls_and_a_late_name():
    engine = Engine(
        chunks=[
            chunk("Checking."),
            chunk(tool_calls=[call_delta(0, '{"city":', call_id="call_a", name="get_weather")]),
            # An engine that names the call after its first arguments: the item waits for the name.
            chunk(tool_calls=[call_delta(1, '{"city":', call_id="call_b")]),
            chunk(tool_calls=[call_delta(1, "", name="get_weather"), call_delta(0, '"Paris"}')]),
            chunk(tool_calls=[call_delta(1, '"Rome"}')]),
            chunk(finish="tool_calls"),
        ]
    )
    with engine.client().responses.stream(model="gemma", input="Paris and Rome?", tools=[WEATHER]) as stream:
        list(stream)
        final = stream.get_final_response()
    message, paris, rome = final.output
    assert message.content[0].text == "Checking."
    assert (paris.call_id, paris.arguments) == ("call_a", '{"city":"Paris"}')
    assert (rome.call_id, rome.name, rome.arguments) == ("call_b", "get_weather", '{"city":"Rome"}')


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_streamed_reasoning(field):
    engine = Engine(chunks=[{"choices": [{"index": 0, "delta": {field: "Six times"}}]},
                            {"choices": [{"index": 0, "delta": {field: " seven."}}]}, chunk("42"), chunk(finish="stop")])
    with engine.client().responses.stream(model="gemma", input="6*7?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert kinds(events)[2:7] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.output_item.added",
    ]
    reasoning, message = final.output
    assert (reasoning.type, reasoning.content[0].text, reasoning.status) == ("reasoning", "Six times seven.", "completed")
    assert final.output_text == "42"
    # A client that sends the answer back as input sends the reasoning too; the engine is not given it.
    assert to_chat({"model": "gemma", "input": [r.to_dict() for r in final.output]})["messages"] == [
        {"role": "assistant", "content": "42"}
    ]


def test_streamed_length_ends_incomplete():
    engine = Engine(chunks=[chunk("Once upon"), chunk(finish="length")])
    with engine.client().responses.stream(model="gemma", input="A story", max_output_tokens=2) as stream:
        events = list(stream)
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output[0].content[0].text == "Once upon"


def test_streamed_refusal():
    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma")
    events = sse_events(stream.start() + stream.feed(chunk(refusal="No.")) + stream.finish())
    assert "response.refusal.delta" in kinds(events) and "response.refusal.done" in kinds(events)
    assert events[-1]["response"]["output"][0]["content"] == [{"type": "refusal", "refusal": "No."}]


def test_fail_ends_the_stream_with_response_failed():
    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma")
    data = stream.start() + stream.feed(chunk("Hel")) + stream.fail("the engine went away", "upstream_failed")
    events = sse_events(data)
    assert events[-1]["type"] == "response.failed"
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed"
    assert (failed.error.code, failed.error.message) == ("server_error", "the engine went away")
    assert stream.feed(chunk("lo")) == b"" and stream.finish() == b"" and stream.fail("again", "x") == b""


def test_fail_before_start_is_an_error_event():
    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma")
    [event] = sse_events(stream.fail("no engine answered", "upstream_failed"))
    assert (event["type"], event["code"], event["message"]) == ("error", "upstream_failed", "no engine answered")
    assert stream.start() == b"" and stream.finish() == b""


def test_an_engine_error_mid_stream_fails_it():
    engine = Engine(chunks=[chunk("Hel"), {"error": {"object": "error", "message": "out of memory", "code": 500}}, chunk("lo")])
    with engine.client().responses.stream(model="gemma", input="Say hi") as stream:
        events = list(stream)
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "out of memory"
    assert events[-1].response.output[0].content[0].text == "Hel"


def test_what_a_stream_holds_is_bounded():
    """Past max_chars of text and arguments the stream fails instead of holding more."""
    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma", max_chars=100)
    out = [stream.start()]
    for _ in range(30):
        out.append(stream.feed(chunk("x" * 9)))
    events = sse_events(b"".join(out))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert len(text) == 99
    assert events[-1]["type"] == "response.failed"
    assert "100 characters" in events[-1]["response"]["error"]["message"]
    assert stream.finish() == b""

    arguments = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma", max_chars=100)
    out = [arguments.start(), arguments.feed(chunk(tool_calls=[call_delta(0, "", call_id="c", name="f")]))]
    out += [arguments.feed(chunk(tool_calls=[call_delta(0, "y" * 60)])) for _ in range(3)]
    events = sse_events(b"".join(out))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["output"][0]["arguments"] == "y" * 60


def test_the_number_of_tool_calls_is_bounded():
    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma")
    out = [stream.start()]
    out += [stream.feed(chunk(tool_calls=[call_delta(i, "{}", call_id=f"c{i}", name="f")])) for i in range(MAX_TOOL_CALLS + 5)]
    events = sse_events(b"".join(out))
    assert kinds(events).count("response.output_item.added") == MAX_TOOL_CALLS
    assert events[-1]["type"] == "response.failed"


def test_every_response_object_in_a_stream_echoes_the_request():
    request = {"model": "gemma", "input": "x", "instructions": "Be brief.", "tools": [WEATHER], "tool_choice": "required",
               "text": {"format": {"type": "json_object"}}, "top_p": 0.5, "parallel_tool_calls": False}
    stream = ResponsesStream(request, RID, CREATED, "gemma")
    events = sse_events(stream.start() + stream.feed(chunk("{}")) + stream.finish())
    for event in events:
        if "response" in event:
            response = Response.model_validate(event["response"])
            assert (response.id, response.created_at, response.model) == (RID, CREATED, "gemma")
            assert (response.instructions, response.tool_choice, response.top_p) == ("Be brief.", "required", 0.5)
            assert response.parallel_tool_calls is False and response.tools[0].name == "get_weather"
            assert response.text.format.type == "json_object"


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": 1},
        {"prompt_tokens": 3, "completion_tokens": 10**30},
        {"prompt_tokens": 3, "completion_tokens": 2.5},
        {"prompt_tokens": "3", "completion_tokens": 2},
    ],
)
def test_usage_out_of_range_is_not_reported(usage):
    assert from_chat(dict(completion(), usage=usage), {"model": "gemma"}, RID, CREATED)["usage"] is None
    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma")
    stream.start()
    stream.feed(chunk(usage=usage))
    assert _completed(stream.finish())["response"]["usage"] is None


def test_usage_details_are_parts_of_their_counts():
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 10**12},
             "completion_tokens_details": {"reasoning_tokens": 9}}
    answer = from_chat(dict(completion(), usage=usage), {"model": "gemma"}, RID, CREATED)["usage"]
    Response.model_validate(from_chat(dict(completion(), usage=usage), {"model": "gemma"}, RID, CREATED))
    assert answer["input_tokens_details"]["cached_tokens"] == 0 and answer["output_tokens_details"]["reasoning_tokens"] == 2


def _completed(events: bytes) -> dict:
    return json.loads(events.rstrip(b"\n").rsplit(b"\ndata: ", 1)[1])


def test_a_whole_answer_of_more_tool_calls_than_a_stream_holds_is_refused_not_cut():
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(MAX_TOOL_CALLS + 1)]
    with pytest.raises(ValueError, match=f"{MAX_TOOL_CALLS + 1} tool calls, more than"):
        from_chat(completion(content=None, tool_calls=calls), {"model": "gemma"}, RID, CREATED)
    answer = from_chat(completion(content=None, tool_calls=calls[:MAX_TOOL_CALLS]), {"model": "gemma"}, RID, CREATED)
    assert len(answer["output"]) == MAX_TOOL_CALLS


def test_a_call_streamed_in_many_pieces_is_held_in_linear_time():
    import time

    stream = ResponsesStream({"model": "gemma"}, RID, CREATED, "gemma")
    out = [stream.start(), stream.feed(chunk(tool_calls=[call_delta(0, "", call_id="c0", name="write")]))]
    started = time.monotonic()
    out += [stream.feed(chunk(tool_calls=[call_delta(0, "a" * 80)])) for _ in range(50_000)]
    # Joined once a piece, the 4 MB of arguments were copied 50,000 times: minutes.
    assert time.monotonic() - started < 10
    completed = _completed(stream.finish())
    assert completed["type"] == "response.completed" and completed["response"]["output"][0]["arguments"] == "a" * 4_000_000
