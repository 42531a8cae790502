"""The official openai Node client calls client.responses.create through a real llmgw-router.

tests/support/node/responses.mjs runs each case with the pinned client
(tests/support/nodeclient.py installs it under build/node-openai) and prints
what the client parsed as JSON; a case passes when that is right and the
client wrote nothing to stderr (a warning of an event it did not expect is a
failure).  Without node or the package the tests skip saying so, and fail
under CI=true.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.support import nodeclient
from tests.support.surface import SIM, TOOLS, surface  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def node():
    return nodeclient.node_client()


@pytest.fixture
def call(node, surface):
    """call(model, case) -> the JSON responses.mjs printed, once it exited 0 with an empty stderr."""

    def run(model: str, case: str) -> dict:
        done = nodeclient.run(*node, "responses.mjs", surface.base_url, model, case)
        said = f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        assert done.returncode == 0 and done.stderr == "", said
        return json.loads(done.stdout)

    return run


def test_a_plain_response(call):
    got = call(SIM, "plain")
    assert (got["object"], got["status"], got["model"]) == ("response", "completed", SIM)
    assert got["id"].startswith("resp_") and got["output_types"] == ["message"]
    assert got["output_text"] == got["text"] and got["text"].split() == ("the quick brown fox " * 4).split()
    assert got["usage"]["input_tokens"] == 4 and got["usage"]["output_tokens"] == 16
    assert got["usage"]["total_tokens"] == 20
    assert re.fullmatch(r"[0-9a-f]{32}", got["request_id"] or ""), got  # the client read X-Request-Id


def test_a_streamed_response(call):
    got = call(SIM, "stream")
    types = got["types"]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert types.count("response.output_text.delta") > 1
    assert got["sequence"] == list(range(len(types)))
    assert got["text"] == got["completed"]["text"] and got["text"].split() == ("one two three " * 6).split()[:16]
    assert got["completed"]["status"] == "completed" and got["completed"]["usage"]["output_tokens"] > 0
    # responses.stream's finalResponse, built from the events in the order they came.
    assert got["final"]["text"] == got["text"]
    assert got["final"]["status"] == "completed"


def test_a_function_tool_round_trip(call):
    got = call(TOOLS, "tool")
    assert got["call"] is not None, got["first"]
    assert got["first"]["output_types"] == ["function_call"]
    assert (got["call"]["name"], json.loads(got["call"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert got["call"]["id"].startswith("fc_") and got["call"]["call_id"]
    assert got["second"]["output_text"] == 'the tool said: {"celsius":21}'


def test_a_streamed_function_call(call):
    got = call(TOOLS, "tool_stream")
    assert got["types"].count("response.function_call_arguments.delta") > 1, got["types"]
    assert got["types"][-1] == "response.completed"
    assert got["call"]["name"] == "get_weather" and json.loads(got["call"]["arguments"]) == {"city": "Paris"}
    assert got["final"]["output_types"] == ["function_call"]


def test_a_json_schema_text_format(call):
    got = call(TOOLS, "json")
    assert got["output_parsed"] == {"name": "Paris", "population": 3}
    assert got["status"] == "completed"
