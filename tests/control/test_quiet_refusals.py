"""An operator's question the control plane answers with a refusal writes nothing to the server's log.

A dashboard polls a log every 2 s; a refusal logged per call let any
operator (or a dashboard left on a forgotten node) write the server's log
at will.  The control plane is attached in process, on a ``task.Clock``.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from llmgw.link import uris
from llmgw.records import Inventory
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR
from llmgw.wire import to_wire
from tests.control.test_plane import clock, plane  # noqa: F401 - fixtures: the control plane on a task.Clock

POLLS = 3


@pytest_twisted.ensureDeferred
async def test_polling_a_node_that_is_not_there_or_does_not_answer_logs_nothing(plane):
    alice = await plane.attach("alice", ROLE_OPERATOR)
    for i in range(25):
        node = await plane.attach(f"node{i:02}", ROLE_NODE)
        await node.call(uris.AGENT_REGISTER, to_wire(Inventory(node_id=f"node{i:02}")))
    warnings = []

    def observe(event):
        if event.get("log_level") in (LogLevel.warn, LogLevel.error, LogLevel.critical):
            warnings.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    try:
        for _ in range(POLLS):
            with pytest.raises(ApplicationError) as missing:
                await alice.call(uris.CP_LOGS, "ghost" * 1000)
            # node01 registered no logs procedure: it does not answer.
            with pytest.raises(ApplicationError) as silent:
                await alice.call(uris.CP_LOGS, "node01")
    finally:
        globalLogPublisher.removeObserver(observe)
    assert warnings == []
    assert missing.value.error == uris.ERROR_NO_SUCH_NODE
    said = missing.value.args[0]
    # Bounded: the operator's words cut, ten of the known nodes named, and where the rest are.
    assert said.startswith("no node 'ghostghost") and "…" in said and len(said) < 800, said
    assert "known: node00, node01, node02, node03, node04, node05, node06, node07, node08, node09 and 15 more" in said
    assert silent.value.error == uris.ERROR_NOT_ANSWERING and "node01" in silent.value.args[0]
