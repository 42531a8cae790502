"""Fixtures shared by the whole suite: a cluster CA and certificates made by `llmgw pki`."""

from __future__ import annotations

import pytest

from llmgw import pki as pkimod


def _make_pki(directory, cluster: str):
    pkimod.init_ca(directory, name=cluster)
    pkimod.issue(directory, "llmgw-server", "server", sans=("localhost", "127.0.0.1"))
    for node in ("node01", "node02"):
        pkimod.issue(directory, node, "node")
    pkimod.issue(directory, "alice", "operator")
    pkimod.issue(directory, "r1", "router")
    return directory


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """The cluster's CA directory: ca.crt, llmgw-server, node01, node02, alice (operator), r1 (router)."""
    return _make_pki(tmp_path_factory.mktemp("pki") / "pki", "test-cluster")


@pytest.fixture(scope="session")
def other_pki(tmp_path_factory):
    """A second, unrelated CA with certificates of the same names."""
    return _make_pki(tmp_path_factory.mktemp("other-pki") / "pki", "other-cluster")
