"""Views as ctl reads them: what fits is taken at once, what does not is refused in words.

``from_wire`` takes a plain value that fits its field in one step; these
are the values beside that step, which must still be refused, or kept as
they were, exactly as before it.  The answers to commands are read as
``tests/test_answers.py`` says.
"""

from __future__ import annotations

import pytest

from llmgw.states import EngineState
from llmgw.views import NodeView
from llmgw.wire import WireError, from_wire


@pytest.mark.parametrize("fields, words", [
    ({"hostname": 5}, "NodeView.hostname: expected str, got int 5"),
    ({"seen_ago_s": float("nan")}, "NodeView.seen_ago_s: nan is not a finite number"),
    ({"seen_ago_s": float("-inf")}, "NodeView.seen_ago_s: -inf is not a finite number"),
    ({"seen_ago_s": True}, "NodeView.seen_ago_s: expected a number, got bool True"),
    ({"seen_ago_s": 10**400}, "NodeView.seen_ago_s: 10**400 is above 2**63-1, the most it may be"),
    ({"memory_total_bytes": True}, "NodeView.memory_total_bytes: expected an integer, got bool True"),
    ({"memory_total_bytes": 5.0}, "NodeView.memory_total_bytes: expected an integer, got float 5.0"),
    ({"memory_total_bytes": 2**70}, "NodeView.memory_total_bytes: 2**70 is above 2**63-1, the most it may be"),
    ({"gpus": [{"index": 0, "utilization_pct": 101}]}, "NodeView.gpus[0].utilization_pct: 101 is above 100, the most it may be"),
    ({"gpus": [{"index": 0, "name": "H100\x07"}]}, "NodeView.gpus[0].name: control character U+0007 at 4, which a name may not hold"),
    ({"engines": [{"name": "vllm", "state": "exploded"}]},
     "NodeView.engines[0].state: 'exploded' is not one of installing, installed, broken, absent"),
    ({"cordoned": 1}, "NodeView.cordoned: expected bool, got int 1"),
])
def test_a_value_that_does_not_fit_is_refused_naming_its_field(fields, words):
    with pytest.raises(WireError) as refused:
        from_wire(list[NodeView], [{"id": "n1"}, {"id": "n2", **fields}])
    assert str(refused.value) == words.replace("NodeView.", "list[1].", 1)  # a page names the node's place in it


def test_what_fits_is_kept_as_sent_and_absent_stays_none():
    view = from_wire(NodeView, {"id": "n1", "seen_ago_s": 5, "last_seen": 1.5, "memory_total_bytes": -1,
                                "cordoned": None, "engines": [{"name": "vllm", "state": "installed"}],
                                "warnings": ["x" * 5000]})
    assert view.seen_ago_s == 5.0 and type(view.seen_ago_s) is float
    assert view.last_seen == 1.5 and view.memory_total_bytes == -1
    assert view.cordoned is None and view.hostname is None and view.gpus is None
    assert view.engines[0].state is EngineState.INSTALLED
    assert len(view.warnings[0]) == 5000  # a view's warnings have no bound of their own
