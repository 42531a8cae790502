"""What the control plane hands an operator from a node: the node's answer read into its record, its refusal in bounded words.

The control plane and the sessions are attached to an in-process hub (as
``tests/control/test_plane.py`` does); what crosses processes is
``tests/ctl/test_node_words.py``'s.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError

from llmgw.control import relay
from llmgw.link import uris
from llmgw.records import Inventory, WeightsFile, WeightsReport
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR
from llmgw.weightnames import cache_name
from llmgw.wire import to_wire
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures
from tests.ctl.hostile import WORDS, raw_in

FETCHED = "/data/weights/" + cache_name("https://example.org/dropped.gguf")


async def node_with(plane, **answers):  # noqa: F811 - the fixture, passed in
    node = await plane.attach("node01", ROLE_NODE)
    for verb, said in answers.items():
        def answer(*args, said=said):
            if isinstance(said, Exception):
                raise said
            return said
        await node.register(answer, uris.node_uri("node01", verb))
    report = WeightsReport(files=[WeightsFile(FETCHED, 7)], listed=True, cache_dir="/data/weights")
    await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id="node01", weights=report)))
    return node, await plane.attach("alice", ROLE_OPERATOR)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("said, wrong", [
    ({"removed": 5}, "CollectResult.removed: expected a list, got int 5"),
    ({"refused": {FETCHED: 7}}, "CollectResult.refused." + FETCHED[:40] + ": expected str, got int 7"),
    ([FETCHED], "CollectResult: expected a mapping, got list"),
])
async def test_a_collect_answer_of_the_wrong_shape_names_the_node_and_the_field(plane, said, wrong):  # noqa: F811
    _, alice = await node_with(plane, collect_weights=said)
    with pytest.raises(ApplicationError) as e:
        await alice.call(uris.CP_WEIGHTS, True)
    assert e.value.error == uris.ERROR_NOT_ANSWERING
    assert e.value.args[0].startswith(f"node01 answered collect_weights with something llmgw cannot read ({wrong}")


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("verb, call", [
    ("cordon", (uris.CP_CORDON, "node01")),
    ("collect_weights", (uris.CP_WEIGHTS, True)),
    ("logs", (uris.CP_LOGS, "node01")),
])
async def test_a_nodes_refusal_reaches_the_operator_under_its_name_bounded_and_escaped(plane, verb, call):  # noqa: F811
    long = WORDS + " and on" * 1000
    _, alice = await node_with(plane, **{verb: ApplicationError("com.example.anything", long)})
    with pytest.raises(ApplicationError) as e:
        await alice.call(*call)
    # Whatever error the node chose, the operator hears a refusal: the node's words, not its URIs.
    assert e.value.error == uris.ERROR_REFUSED
    words = e.value.args[0]
    assert words.startswith("node01: \\x1b]52;c;") and words.endswith("…")
    assert len(words) == len("node01: ") + relay.ERROR_CHARS
    assert raw_in(words) == []


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("n", [-1, "200", 2.5, True, None])
async def test_the_lines_an_operator_asks_for_are_a_number(plane, n):  # noqa: F811
    _, alice = await node_with(plane, logs={"node": "node01", "source": "agent", "lines": ["x"] * 20_000})
    with pytest.raises(ApplicationError) as e:
        await alice.call(uris.CP_LOGS, "node01", None, n)
    assert e.value.error == uris.ERROR_INVALID_ARGUMENT
    assert e.value.args[0].startswith("llmgw.cp.logs: n is a number of lines, 0 or more (at most 10000 are sent), not ")


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("n", [relay.LOG_LINES + 1, 2**70])
async def test_more_lines_than_the_relay_holds_asks_the_node_for_as_many_as_it_holds(plane, n):  # noqa: F811
    asked = []
    node, alice = await node_with(plane)

    def logs(source, n):
        asked.append(n)
        return {"node": "node01", "source": "agent", "lines": ["x"] * 20_000}

    await node.register(logs, uris.node_uri("node01", uris.NODE_LOGS))
    answer = await alice.call(uris.CP_LOGS, "node01", None, n)
    assert asked == [relay.LOG_LINES] and len(answer["lines"]) == relay.LOG_LINES


@pytest_twisted.ensureDeferred
async def test_a_node_that_sends_more_than_it_was_asked_is_cut_to_the_newest_lines_within_the_bytes(plane):  # noqa: F811
    line = "y" * 4000
    _, alice = await node_with(plane, logs={"node": "node99", "source": "agent", "lines": [line] * 10_000 + ["last"]})
    answer = await alice.call(uris.CP_LOGS, "node01", None, relay.LOG_LINES)
    assert answer["node"] == "node01"
    assert answer["lines"][-1] == "last"
    size = sum(len(x) + 1 for x in answer["lines"])
    assert relay.LOG_BYTES - 4001 < size <= relay.LOG_BYTES


@pytest_twisted.ensureDeferred
async def test_a_nodes_words_in_the_servers_log_are_escaped(plane):  # noqa: F811
    from twisted.logger import formatEvent, globalLogPublisher

    from llmgw.records import EnginePlan
    from llmgw.wire import from_wire
    from tests.control.test_plane import plan_of

    await node_with(plane, set_engines=ApplicationError(uris.ERROR_REFUSED, WORDS))
    lines = []

    def observe(event):
        text = formatEvent(event)
        if "did not take the new engine plan" in text:
            lines.append(text)

    globalLogPublisher.addObserver(observe)
    try:
        await plane.push_engines(from_wire(EnginePlan, plan_of("b6000")))
    finally:
        globalLogPublisher.removeObserver(observe)
    (line,) = lines
    assert line.startswith("node01 did not take the new engine plan (\\x1b]52;c;"), line
    assert raw_in(line) == []
