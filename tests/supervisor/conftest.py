"""The supervisor tests' fixture: a Harness (helpers.py) that kills whatever the test started."""

from __future__ import annotations

import pytest_twisted

from .helpers import Harness


@pytest_twisted.async_yield_fixture
async def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    await h.teardown()
