"""Fixtures for the fleet tests: the server is tests/support/cluster.py's, the agents bench/fleet.py's."""

from __future__ import annotations

from tests.support.cluster import cluster  # noqa: F401 - a fixture
