"""Answers as ctl, the dashboard and the admin page read them: what fits is taken at once, what does not is refused in words.

``from_wire`` takes a plain value that fits its field in one step; these
are the values beside that step, which must still be refused, or kept as
they were, exactly as before it.
"""

from __future__ import annotations

import argparse

import pytest

from llmgw.errors import LlmgwError
from llmgw.records import PROSE
from llmgw.states import EngineState
from llmgw.text import printable
from llmgw.views import NODE_SHARDS, CordonAnswer, DrainAnswer, NodeView, ReloadAnswer
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


ODD_ANSWERS = [
    (CordonAnswer, {"node": 5, "cordoned": True}, "CordonAnswer.node: expected str, got int 5"),
    (CordonAnswer, {"node": "n1\x1b[2J", "cordoned": True},
     "CordonAnswer.node: control character U+001B at 2, which a name may not hold"),
    (CordonAnswer, {"node": "n1"}, "CordonAnswer.cordoned: missing"),
    (CordonAnswer, {"node": "n1", "cordoned": "yes"}, "CordonAnswer.cordoned: expected bool, got str 'yes'"),
    (DrainAnswer, {"node": "n1", "cordoned": True, "stopped": "echo/0/0"},
     "DrainAnswer.stopped: expected a list, got str 'echo/0/0'"),
    (DrainAnswer, {"node": "n1", "cordoned": True, "stopped": ["echo/0/0"] * (NODE_SHARDS + 1)},
     f"DrainAnswer.stopped: {NODE_SHARDS + 1} entries, more than the {NODE_SHARDS} it may have"),
    (ReloadAnswer, {"changes": "all of them"}, "ReloadAnswer.changes: expected a list, got str 'all of them'"),
    (ReloadAnswer, {"changes": [1]}, "ReloadAnswer.changes[0]: expected str, got int 1"),
    (ReloadAnswer, ["a change"], "ReloadAnswer: expected a mapping, got list ['a change']"),
]


@pytest.mark.parametrize("kind, answer, words", ODD_ANSWERS)
def test_an_odd_answer_to_a_node_verb_or_a_reload_is_refused_in_words_by_ctl_the_dashboard_and_the_admin_page(
        kind, answer, words):
    from llmgw.admin import source
    from llmgw.admin.site import SourceError
    from llmgw.ctl.main import decode
    from llmgw.tui import backend

    with pytest.raises(LlmgwError) as ctl:
        decode(kind, answer, "llmgw.cp.drain")
    assert str(ctl.value) == (f"llmgw.cp.drain answered something this ctl cannot read ({printable(words)}); is the "
                              "server a much older or newer llmgw?")
    with pytest.raises(backend.ActionFailed) as dashboard:
        backend._decode(kind, answer, "llmgw.cp.drain")
    assert str(dashboard.value) == f"llmgw.cp.drain answered something this dashboard cannot read: {words}"
    with pytest.raises(SourceError) as page:
        source._decode(kind, answer)
    assert str(page.value) == f"the control plane answered something this page cannot read ({words})"


def test_a_reloads_words_are_kept_as_sent_and_printed_escaped(capsys):
    from llmgw.ctl import tables
    from llmgw.ctl.main import _print, decode

    answer = decode(ReloadAnswer, {"changes": ["models.echo: \x1b[2Jgone", "x" * 5000], "newer": 1}, "llmgw.cp.reload")
    assert answer.changes[0] == "models.echo: \x1b[2Jgone" and len(answer.changes[1]) <= PROSE  # words: cut, not refused
    _print(argparse.Namespace(json=False), answer, tables.reload_text)
    printed = capsys.readouterr().out
    assert printed.startswith("reloaded: models.echo: \\x1b[2Jgone; xxx") and "\x1b" not in printed


def test_the_answers_wire_form_is_the_one_older_readers_read_by_key():
    from llmgw.wire import to_wire

    assert to_wire(CordonAnswer("n1", False)) == {"node": "n1", "cordoned": False}
    assert to_wire(DrainAnswer("n1", True, ["echo/0/0"])) == {"node": "n1", "cordoned": True, "stopped": ["echo/0/0"]}
    assert to_wire(ReloadAnswer(["a"])) == {"changes": ["a"]}
