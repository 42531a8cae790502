"""A node's machine (``llmgw.control.nodemachine``), walked pair by pair: every state against every input."""

from __future__ import annotations

import itertools

import pytest

from llmgw.control.nodemachine import NodeInput, node_after
from llmgw.states import NodeState

N, I = NodeState, NodeInput
# Written out again rather than read from the module, so that an edge added,
# dropped or redirected there fails here.
NODE_EDGES = {
    (N.READY, I.LINK_CLOSED): N.UNREACHABLE,
    (N.READY, I.SILENT): N.UNREACHABLE,
    (N.READY, I.SILENT_LONG): N.LOST,
    (N.UNREACHABLE, I.SILENT_LONG): N.LOST,
    (N.UNREACHABLE, I.HEARD): N.READY,
    (N.LOST, I.HEARD): N.READY,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(NodeState, NodeInput)),
                         ids=lambda v: v.name)
def test_each_input_moves_a_node_where_the_table_says_or_leaves_it_alone(state, event):
    assert node_after(state, event) == NODE_EDGES.get((state, event), state)
