"""Fixtures of the weights tests: a model server on 127.0.0.1, a weights directory, a cluster."""

from __future__ import annotations

import pytest
import pytest_twisted

from tests.support import cluster as _cluster

from .modelserver import ModelServer

# Real processes on 127.0.0.1 for the node-level test (tests/support/cluster.py).
cluster = _cluster.cluster


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
