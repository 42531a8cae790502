"""Fixtures for the integration tests: see harness.py for the processes they start."""

from __future__ import annotations

import pytest
from harness import Cluster


@pytest.fixture
def cluster(tmp_path, pki):
    c = Cluster(tmp_path, pki)
    yield c
    c.stop()
