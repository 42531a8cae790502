"""A node's words reach the operator's terminal escaped, and its malformed answers as a sentence naming it.

The server and `llmgw ctl` are real processes; the node is a real session
on the hub over TLS with node01's certificate (``tests/ctl/hostile.py``).
Before, `ctl nodes` and `ctl logs` wrote a node's escape sequences to the
terminal as they came (a clipboard write, a cleared screen), and a `logs`
answer of the wrong shape came back to ctl unchecked, a traceback.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import threads

from tests.ctl.hostile import CLIPBOARD, HostileNode, raw_in
from tests.support.cluster import cluster  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

ESCAPED_CLIPBOARD = "\\x1b]52;c;cm0gLXJmIH4vKg==\\x07"


def ctl(cluster, *args):
    return threads.deferToThread(cluster.ctl, *args)


@pytest_twisted.ensureDeferred
async def test_a_nodes_words_are_shown_escaped_in_ctl_nodes_logs_and_its_refusals(cluster):
    cluster.start_server()
    node = await HostileNode(cluster).join()
    try:
        nodes = await ctl(cluster, "nodes")
        logs = await ctl(cluster, "logs", "node01")
        follow_first = await ctl(cluster, "logs", "node01", "-n", "5")
        cordon = await ctl(cluster, "cordon", "node01")
    finally:
        node.leave()
    assert nodes.returncode == 0, nodes.stderr
    assert raw_in(nodes.stdout) == [], nodes.stdout
    assert ESCAPED_CLIPBOARD in nodes.stdout and "\\u202egnp.exe" in nodes.stdout
    # The warning and the engine's reason each stay on the node's own line.
    assert [line for line in nodes.stdout.splitlines() if "forged" in line] == [
        line for line in nodes.stdout.splitlines() if line.startswith("  node01: ") and "forged" in line]

    assert logs.returncode == 0, logs.stderr
    assert raw_in(logs.stdout) == [], logs.stdout
    assert logs.stdout.splitlines()[1:] == [
        ESCAPED_CLIPBOARD + "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m evil\\u202egnp.exe [b]bold[/b] [@click=app.quit]quit[/] "
        "<script>alert(1)</script>\\rforged",
        "after\\nforged line",  # one line as the node sent it, not a second it chose
    ]
    assert "other sources: x [b]b[/b]" in logs.stdout.splitlines()[0]
    assert raw_in(follow_first.stdout) == []

    assert cordon.returncode == 4, cordon.stderr
    assert raw_in(cordon.stderr) == [], cordon.stderr
    assert f"llmgw: node01: {ESCAPED_CLIPBOARD}" in cordon.stderr and "llmgw.error" not in cordon.stderr


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("answer, wrong", [
    ({"node": "node01", "source": "agent", "lines": 5}, "LogsAnswer.lines: expected a list, got int 5"),
    ({"node": "node01", "source": "agent", "lines": [1, 2]}, "LogsAnswer.lines[0]: expected str, got int 1"),
    ({"node": "node01", "source": CLIPBOARD, "lines": []}, "LogsAnswer.source: control character U+001B at 0"),
    ({"node": "node01", "source": "agent", "sources": "agent"}, "LogsAnswer.sources: expected a list, got str"),
    (["agent"], "LogsAnswer: expected a mapping, got list"),
    (None, "LogsAnswer: expected a mapping, got null"),
])
async def test_a_logs_answer_of_the_wrong_shape_is_a_sentence_naming_the_node(cluster, answer, wrong):
    cluster.start_server()
    node = await HostileNode(cluster).join()
    node.answers["logs"] = answer
    try:
        out = await ctl(cluster, "logs", "node01")
    finally:
        node.leave()
    assert out.returncode == 4, out.stdout
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("llmgw: node01 answered logs with something llmgw "
                                 f"cannot read ({wrong}"), out.stderr
    assert raw_in(out.stderr) == []


@pytest_twisted.ensureDeferred
async def test_a_node_that_sends_more_lines_than_asked_is_cut_to_the_last_lines_asked_for(cluster):
    cluster.start_server()
    node = await HostileNode(cluster).join()
    node.answers["logs"] = {"node": "node02", "source": "agent", "lines": [f"line {i}" for i in range(50)]}
    try:
        out = await ctl(cluster, "logs", "node01", "-n", "3")
    finally:
        node.leave()
    assert out.returncode == 0, out.stderr
    # Its own name, whatever the node called itself, and three lines, not fifty.
    assert out.stdout.splitlines() == ["# node01 agent: last 3 lines", "line 47", "line 48", "line 49"]
