"""Fixtures for the integration tests: the processes they start are tests/support/cluster.py's."""

from __future__ import annotations

from tests.support.cluster import cluster  # noqa: F401 - a fixture
