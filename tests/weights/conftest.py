"""Fixtures of the weights tests: a model server on 127.0.0.1 and a weights directory."""

from __future__ import annotations

import pytest
import pytest_twisted

from .modelserver import ModelServer


@pytest_twisted.async_yield_fixture
async def http():
    srv = ModelServer().start()
    yield srv
    await srv.stop()


@pytest_twisted.async_yield_fixture
async def other_http():
    """A second server: another origin, like Hugging Face's CDN."""
    srv = ModelServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
def weights_dir(tmp_path):
    path = tmp_path / "llmgw-weights"
    path.mkdir()
    return path
