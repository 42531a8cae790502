"""Simulator processes for the tests: a shared default one, and a factory for those with knobs."""

from __future__ import annotations

import openai
import pytest
from simharness import SimProcess


@pytest.fixture(scope="module")
def sim():
    """A simulator with the defaults (no waiting), shared by a test module."""
    process = SimProcess()
    yield process
    process.stop()


@pytest.fixture
def start_sim():
    """start_sim(*flags) -> a SimProcess stopped at the end of the test."""
    started: list[SimProcess] = []

    def start(*args: str, model: str | None = None) -> SimProcess:
        process = SimProcess(*args, **({"model": model} if model else {}))
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def client(sim):
    """The official openai client, retries off so a test sees each answer."""
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c
