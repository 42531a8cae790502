"""The official openai Python client calls the Responses API through a real llmgw-router, as a user would.

``client.responses.create`` plain and streaming against the simulator (which
has no Responses API of its own: the router translates to chat completions and
back), a function tool round trip and a ``text.format`` JSON schema against
the stand-in engine that calls tools (tests/support/toolengine.py), chat
completions still as before, and the ``X-Request-Id`` the router returns.
Each streaming event must parse in the client with no warning.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings

import openai
import pydantic
import pytest

from tests.support.routerproc import RouterProcess
from tests.support.surface import SIM, TOOLS, surface  # noqa: F401 - fixture

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
    "strict": True,
}
HEX32 = re.compile(r"[0-9a-f]{32}")


class City(pydantic.BaseModel):
    name: str
    population: int


@pytest.fixture
def client(surface):
    with openai.OpenAI(base_url=surface.base_url, api_key="sk-test", max_retries=0, timeout=30) as made:
        yield made


@pytest.fixture(autouse=True)
def no_warnings():
    """A warning the client gives while parsing what the router sent fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A process harness's log file closed late is the garbage collector's word, not the client's.
        warnings.simplefilter("ignore", ResourceWarning)
        yield
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_a_plain_response_from_the_simulator(client):
    response = client.responses.create(model=SIM, input="the quick brown fox", max_output_tokens=16)
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == SIM
    assert [item.type for item in response.output] == ["message"]
    [message] = response.output
    assert message.role == "assistant" and message.id.startswith("msg_")
    assert [part.type for part in message.content] == ["output_text"]
    # The simulator echoes the prompt, one word a token, max_output_tokens of them.
    assert response.output_text.split() == ("the quick brown fox " * 4).split()
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (4, 16, 20)
    assert HEX32.fullmatch(response._request_id or ""), "the client did not read an X-Request-Id"


def test_instructions_reach_the_engine_as_the_system_message(client, surface):
    response = client.responses.create(model=TOOLS, instructions="Be brief.", input="hello there")
    assert response.output_text == "hello there"
    bodies, _ = surface.tools.recorded()
    assert bodies[-1]["messages"] == [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "hello there"}]


def test_a_streamed_response_arrives_as_the_events_the_client_parses(client):
    events = list(client.responses.create(model=SIM, input="one two three", stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_item.added" in types and "response.content_part.added" in types
    assert "response.output_text.done" in types and "response.output_item.done" in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1, "the text came in one piece: it was not streamed"
    completed = events[-1].response
    assert "".join(deltas) == completed.output_text
    # The simulator's 16 tokens, its whole answer.
    assert completed.output_text.split() == ("one two three " * 6).split()[:16]
    assert completed.status == "completed" and completed.usage.output_tokens == 16
    assert events[0].response.id == completed.id and events[0].response.status == "in_progress"


def test_the_streaming_helper_accumulates_the_same_response(client):
    with client.responses.stream(model=SIM, input="red green blue") as stream:
        final = stream.get_final_response()
    assert final.output_text.split() == ("red green blue " * 6).split()[:16]
    assert final.usage.output_tokens == 16


def test_an_answer_cut_at_max_output_tokens_is_incomplete_streamed_or_not(client):
    """As OpenAI answers: status incomplete, incomplete_details.reason max_output_tokens."""
    cut = client.responses.create(model=SIM, input="one two three", max_output_tokens=5)
    assert (cut.status, cut.incomplete_details and cut.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert cut.output_text.split() == "one two three one two".split()
    events = list(client.responses.create(model=SIM, input="one two three", max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete"
    last = events[-1].response
    assert (last.status, last.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert last.output_text == cut.output_text and last.usage.output_tokens == 5


def test_a_function_tool_round_trip(client, surface):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(model=TOOLS, input=asked, tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id and call.id.startswith("fc_")
    second = client.responses.create(
        model=TOOLS, tools=[WEATHER],
        input=[*asked, *first.output, {"type": "function_call_output", "call_id": call.call_id,
                                       "output": json.dumps({"celsius": 21})}])
    assert second.output_text == 'the tool said: {"celsius": 21}'
    bodies, _ = surface.tools.recorded()
    [sent] = bodies[-2]["tools"]
    assert sent["type"] == "function"
    assert {k: sent["function"].get(k) for k in ("name", "description", "parameters")} == {
        k: WEATHER[k] for k in ("name", "description", "parameters")}
    then = bodies[-1]["messages"]
    assert [m["role"] for m in then] == ["user", "assistant", "tool"]
    assert then[1]["tool_calls"][0]["id"] == then[2]["tool_call_id"] == call.call_id


def test_a_streamed_function_call_arrives_as_argument_deltas(client):
    events = list(client.responses.create(model=TOOLS, input="Weather in Paris?", tools=[WEATHER], stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments
    assert json.loads(done.arguments) == {"city": "Paris"}
    [call] = [i for i in events[-1].response.output if i.type == "function_call"]
    assert call.name == "get_weather" and call.arguments == done.arguments


def test_a_json_schema_text_format_is_parsed_by_the_client(client, surface):
    response = client.responses.parse(model=TOOLS, input="A city, please.", text_format=City)
    assert response.output_parsed == City(name="Paris", population=3)
    bodies, _ = surface.tools.recorded()
    form = bodies[-1]["response_format"]
    assert form["type"] == "json_schema" and form["json_schema"]["name"] == "City"
    assert form["json_schema"]["schema"]["required"] == ["name", "population"]


def test_what_llmgw_does_not_keep_is_refused_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=SIM, input="hi", previous_response_id="resp_0123")
    assert refused.value.param == "previous_response_id", refused.value.body
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=SIM, input="hi", tools=[{"type": "web_search"}])
    assert "web_search" in refused.value.message, refused.value.body
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve("resp_0123")
    assert "store" in missing.value.message, missing.value.body


def test_chat_completions_still_work_streaming_and_not(client):
    reply = client.chat.completions.create(model=SIM, messages=[{"role": "user", "content": "alpha beta"}],
                                           max_tokens=4)
    assert reply.choices[0].message.content.split() == "alpha beta alpha beta".split()
    chunks = list(client.chat.completions.create(model=SIM, messages=[{"role": "user", "content": "alpha beta"}],
                                                 max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split() == "alpha beta alpha beta".split()
    assert chunks[-1].usage.completion_tokens == 4


def test_the_clients_request_id_is_returned_and_reaches_the_engine(client, surface):
    raw = client.responses.with_raw_response.create(model=TOOLS, input="trace me",
                                                    extra_headers={"X-Request-Id": "ticket-4711"})
    assert raw.headers.get("x-request-id") == "ticket-4711"
    assert raw.parse().output_text == "trace me"
    _, ids = surface.tools.recorded()
    assert ids[-1] == "ticket-4711"
    raw = client.chat.completions.with_raw_response.create(
        model=TOOLS, messages=[{"role": "user", "content": "again"}], extra_headers={"X-Request-Id": "ticket-4712"})
    assert raw.headers.get("x-request-id") == "ticket-4712"
    assert surface.tools.recorded()[1][-1] == "ticket-4712"


def test_without_one_the_router_makes_a_request_id_for_answers_and_errors(client):
    raw = client.responses.with_raw_response.create(model=SIM, input="hi", max_output_tokens=2)
    made = raw.headers.get("x-request-id")
    assert made and HEX32.fullmatch(made), made
    raw = client.chat.completions.with_raw_response.create(model=SIM, messages=[{"role": "user", "content": "x"}])
    assert HEX32.fullmatch(raw.headers.get("x-request-id") or ""), raw.headers
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="no-such-model", input="hi")
    quoted = unknown.value.response.headers.get("x-request-id")
    assert quoted and HEX32.fullmatch(quoted)
    assert quoted in json.dumps(unknown.value.body), unknown.value.body


def test_an_engine_that_dies_mid_stream_ends_it_with_response_failed(start_sim, tmp_path):
    slow = start_sim("--tokens-per-s", "20", "--output-tokens", "200")
    with RouterProcess(tmp_path, {SIM: slow.base_url}) as router, \
            openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk", max_retries=0, timeout=30) as client:
        events = []
        for event in client.responses.create(model=SIM, input="one two three", stream=True):
            events.append(event)
            if event.type == "response.output_text.delta" and slow.proc.poll() is None:
                slow.proc.kill()  # the engine is gone after its first token
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.failed", types
    failed = events[-1].response
    assert failed.status == "failed" and failed.error and failed.error.message, failed
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("stream", [False, True])
def test_an_engines_error_is_the_error_the_client_raises(start_sim, tmp_path, stream):
    failing = start_sim("--fail-rate", "1")
    with RouterProcess(tmp_path, {SIM: failing.base_url}) as router, \
            openai.OpenAI(base_url=router.base_url + "/v1", api_key="sk", max_retries=0, timeout=30) as client:
        with pytest.raises(openai.InternalServerError) as failed:
            client.responses.create(model=SIM, input="hi", stream=stream)
    assert failed.value.status_code == 500 and "simulated failure" in failed.value.message, failed.value.body
    assert failed.value.code == "simulated_failure"
    assert HEX32.fullmatch(failed.value.response.headers.get("x-request-id") or "")


def test_a_keys_models_and_token_budget_hold_for_the_responses_api(tmp_path, surface):
    """The key's allowlist refuses another model, and the translated answers' usage is charged to its budget."""
    token = "sk-llmgw-responses"
    sha = hashlib.sha256(token.encode()).hexdigest()
    # Each answer of the simulator here is 4 + 16 tokens: two spend a budget of 30, and the third is refused.
    keys = f"  keys: [{{name: team-a, sha256: {sha}, models: [{SIM}], tokens_per_minute: 30}}]\n"
    with RouterProcess(tmp_path, {SIM: surface.sim.base_url, TOOLS: surface.tools.base_url}, keys) as router:
        def client(key: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=router.base_url + "/v1", api_key=key, max_retries=0, timeout=30)

        with pytest.raises(openai.AuthenticationError):
            client("sk-wrong").responses.create(model=SIM, input="hi")
        with pytest.raises((openai.PermissionDeniedError, openai.NotFoundError)) as refused:
            client(token).responses.create(model=TOOLS, input="hi")
        assert TOOLS in refused.value.message, refused.value.body
        for _ in range(2):
            assert client(token).responses.create(model=SIM, input="the quick brown fox").usage.total_tokens == 20
        with pytest.raises(openai.RateLimitError) as limited:
            client(token).responses.create(model=SIM, input="the quick brown fox")
        assert limited.value.code == "rate_limit_exceeded", limited.value.body
        assert int(limited.value.response.headers["retry-after"]) >= 1
