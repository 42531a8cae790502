"""Two real agents given one state_dir: the second is refused in a sentence, the first serves on."""

from __future__ import annotations

import pytest

from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def test_a_second_agent_on_the_same_state_dir_exits_naming_the_first_and_a_third_starts_once_it_is_gone(cluster):
    shared = cluster.base / "node01" / "state"
    cluster.start_server()
    first = cluster.start_agent("node01")
    cluster.wait_node("node01", "ready")

    second = cluster.start_agent("node02", state_dir=shared)
    wait_for(lambda: not second.running(), 30, "the second agent to exit", detail=cluster.logs)
    assert second.proc.returncode != 0
    assert (
        f"llmgw-agent: state_dir {shared} is in use by pid {first.pid} (node node01): give this agent its own "
        "state_dir, node_id, weights_dirs and --pidfile; see docs/operations.rst 'Several agents on one host'"
    ) in second.output()
    assert "Traceback" not in second.output()
    assert first.running()
    assert cluster.nodes()["node01"]["state"] == "ready"

    first.stop()
    third = cluster.start_agent("node02", state_dir=shared)
    cluster.wait_node("node02", "ready")
    assert third.running()
