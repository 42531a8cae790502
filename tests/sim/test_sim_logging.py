"""What the simulator writes to its log: a line per API request, none for the polls it gets every second."""

from __future__ import annotations

import pytest

from llmgw.sim.options import parse

POLLS = 5


def polled_then_asked(sim) -> list[str]:
    """*sim*'s lines once it has answered POLLS /metrics and /health polls and then one API request."""
    for _ in range(POLLS):
        assert sim.request("GET", "/metrics")[0] == 200
        assert sim.request("GET", "/health")[0] == 200
    assert sim.request("GET", "/v1/models")[0] == 200
    # Lines are written in the order the requests were answered: once the
    # API request's line is there, any poll's line would be too.
    sim.wait_for_line(lambda line: "GET /v1/models" in line)
    return list(sim.lines)


def test_the_polls_are_not_logged_but_an_api_request_is(start_sim):
    lines = polled_then_asked(start_sim())
    assert [line for line in lines if "/metrics" in line or "/health" in line] == []
    assert sum("GET /v1/models 200" in line for line in lines) == 1


def test_log_polls_logs_them_too(start_sim):
    lines = polled_then_asked(start_sim("--log-polls"))
    assert sum("GET /metrics 200" in line for line in lines) == POLLS
    assert sum("GET /health 200" in line for line in lines) == POLLS


@pytest.mark.parametrize("value, polls", [("1", True), ("0", False), ("", False)])
def test_llmgw_verbose_turns_the_poll_lines_on(monkeypatch, value, polls):
    monkeypatch.setenv("LLMGW_VERBOSE", value)
    assert parse(["--model", "m"]).log_polls is polls
