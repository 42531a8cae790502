"""The admin page of a real server reads the journal and the figures through its own hub (``ControlSource``)."""

from __future__ import annotations

import re

import pytest
import pytest_twisted
from twisted.internet import threads

from tests.admin.test_node_words import get

pytestmark = pytest.mark.integration


@pytest_twisted.ensureDeferred
async def test_the_cluster_page_of_a_real_server_shows_its_journal_and_a_nodes_page_its_cordon(cluster):
    cluster.start_server()
    cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")
    assert cluster.ctl("cordon", "node01").returncode == 0
    code, front = await threads.deferToThread(get, f"{cluster.admin}/")
    assert code == 200, front
    assert "could not be read" not in front, front
    kinds = re.findall(r'<tr data-seq="\d+" data-kind="([^"]+)">', front)
    assert {"server started", "node registered", "node cordoned"} <= set(kinds), kinds
    code, node = await threads.deferToThread(get, f"{cluster.admin}/node?id=node01")
    assert code == 200 and "could not be read" not in node
    assert "server started" not in re.findall(r'data-kind="([^"]+)"', node)  # only node01's own
    assert "node cordoned" in re.findall(r'data-kind="([^"]+)"', node)
