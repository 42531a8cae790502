"""Simulator processes for the tests (tests/support/sim.py), and the official client on the shared one."""

from __future__ import annotations

import openai
import pytest

from tests.support.sim import sim, start_sim  # noqa: F401 - fixtures


@pytest.fixture
def client(sim):  # noqa: F811 - the fixture imported above
    """The official openai client, retries off so a test sees each answer."""
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c
