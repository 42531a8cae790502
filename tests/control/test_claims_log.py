"""A node that invents shard ids cannot fill the server's log, nor grow its metrics by a series per id.

Refusals are logged once per (node, shard), within a budget of lines per node
per window; the rest are counted and summed up in one line when the window
ends.  The world is test_reconciler's: a real Fleet on a test clock.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent

from llmgw.control.claims import ClaimRefused, Why
from llmgw.control.collector import FleetCollector
from llmgw.control.lograte import LINES, WINDOW_S, LogBudget
from llmgw.link import uris
from llmgw.records import Inventory, ShardStatus
from llmgw.roles import ROLE_NODE
from llmgw.wire import to_wire
from tests.control.test_claims import served, spec  # noqa: F401 - fixture
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.support.wait import until

INVENTED = 1000


def invent(world, node_id, n, prefix="ghost"):
    for i in range(n):
        with pytest.raises(ClaimRefused):
            world.fleet.shard_status(node_id, ShardStatus(spec(f"{prefix}{i}/0/0"), "ready"))


def warnings(events) -> list[str]:
    return [formatEvent(e) for e in events if e["log_level"] == LogLevel.warn]


def test_a_node_inventing_ids_gets_its_budget_of_lines_then_one_summary_per_window(served):
    with capturedLogs() as events:
        invent(served, "node03", INVENTED)
        assert len(warnings(events)) == LINES
        served.clock.advance(WINDOW_S)
    lines = warnings(events)
    assert len(lines) == LINES + 1
    assert lines[-1].startswith(f"{INVENTED - LINES} more refused claims from node03 were not logged in the last "
                                f"{WINDOW_S:g} s")
    assert served.fleet.claims.refused == {("node03", Why.NOT_PLACED): INVENTED}
    # A new window, a new budget: what it says next is heard.
    with capturedLogs() as events:
        invent(served, "node03", 3, prefix="late")
    assert len(warnings(events)) == 3


def test_one_nodes_flood_does_not_silence_another(served):
    invent(served, "node03", INVENTED)
    with capturedLogs() as events:
        invent(served, "node01", 1)
    assert [line.split(":")[0] for line in warnings(events)] == ["refused"]
    assert "node01 may not report ghost0/0/0" in warnings(events)[0]


def test_ids_with_dots_and_wildcards_are_refused_and_bounded_the_same(served):
    with capturedLogs() as events:
        for i in range(INVENTED):
            shard_id = f"echo/*.{i}/0"
            with pytest.raises(ClaimRefused) as caught:
                served.fleet.shard_status("node03", ShardStatus(spec(shard_id), "ready"))
            assert caught.value.why == Why.SPEC
    assert len(warnings(events)) == LINES


def test_the_refusals_metric_has_a_series_per_node_and_reason_never_per_invented_id(served):
    invent(served, "node03", INVENTED)
    registry = CollectorRegistry()
    registry.register(FleetCollector(served.fleet, served.clock))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    samples = [s for s in families["llmgw_node_claims_refused"].samples if s.name.endswith("_total")]
    assert [(s.labels, s.value) for s in samples] == [({"node": "node03", "reason": "not placed"}, INVENTED)]


def test_a_budget_is_at_least_one_line_in_a_window():
    with pytest.raises(ValueError):
        LogBudget(Clock(), "refused claims", lines=0)
    with pytest.raises(ValueError):
        LogBudget(Clock(), "refused claims", window_s=0)


@pytest_twisted.ensureDeferred
async def test_a_register_full_of_invented_shards_writes_no_more_than_the_budget(plane):  # noqa: F811
    # The node answers no stop (it has no such procedure): each stop's failure was a line of its own.
    node = await plane.attach("node03", ROLE_NODE)
    shards = [ShardStatus(spec(f"ghost{i}/0/0"), "ready", endpoint="http://10.0.0.9:40001") for i in range(200)]
    with capturedLogs() as events:
        answer = await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node03", address="10.0.0.3",
                                                                        shards=shards)))
        assert len(answer["refused"]) == 200
        # 200 refusals and 200 failed stops: all but the budget left out.
        await until(lambda: plane.fleet.claims.log_budget.left_out("node03") == 400 - LINES, "every stop to fail")
    about = [line for line in (formatEvent(e) for e in events) if "node03" in line and "registered" not in line]
    assert len(about) == LINES, about


@pytest_twisted.ensureDeferred
async def test_server_yaml_sets_the_budget_and_a_control_plane_keeps_to_it(tmp_path, clock):
    # fleet.refusal_log_lines and fleet.refusal_log_window_s reach the claims'
    # budget through the control plane, as at start and on every reload.
    from twisted.internet import defer, reactor
    from autobahn.wamp.types import ComponentConfig

    from llmgw.config.server import load_server_config
    from llmgw.control.catalog import Catalog
    from llmgw.control.fleet import Fleet
    from llmgw.control.plane import ControlSession
    from llmgw.link.hub import Hub
    from tests.control.test_plane import server_yaml

    path = server_yaml(tmp_path, "b5000")
    path.write_text(path.read_text() + "fleet: {refusal_log_lines: 3, refusal_log_window_s: 10}\n")
    control = ControlSession(ComponentConfig(realm=uris.REALM), lambda emit: Fleet(clock, emit),
                             Catalog(load_server_config(path)), clock)
    joined = defer.Deferred()
    control.on("ready", lambda *a: joined.called or joined.callback(None))
    Hub(reactor).attach_local(control)
    await joined.addTimeout(5, reactor)
    control.fleet.register("node03", None, Inventory(node_id="node03", engines=[]))
    with capturedLogs() as events:
        invent(control, "node03", 10)
        clock.advance(10)
    lines = warnings(events)
    assert len(lines) == 4 and lines[-1].startswith("7 more refused claims from node03 were not logged in the last 10 s")
