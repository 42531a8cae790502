"""The journal's and the figures' records cross the link whole; a kind this side does not know is refused."""

import pytest

from llmgw.history import Figures, JournalEntry, JournalKind, JournalPage, Scope, Series
from llmgw.wire import WireError, from_wire, to_wire


def test_a_page_comes_back_as_it_was_sent():
    page = JournalPage([JournalEntry(7, 1.5, JournalKind.EVICTED, "qwen/0", "to make room", "node03", "qwen",
                                     "qwen/0")], 7, 2)
    assert from_wire(JournalPage, to_wire(page)) == page


def test_an_unknown_kind_is_refused():
    wire = to_wire(JournalEntry(1, 1.0, JournalKind.PLACED, "qwen/0"))
    wire["kind"] = "exploded"
    with pytest.raises(WireError):
        from_wire(JournalEntry, wire)


def test_a_long_reason_is_cut_not_refused():
    wire = to_wire(JournalEntry(1, 1.0, JournalKind.FAILED, "qwen/0", "x"))
    wire["reason"] = "y" * 10_000
    assert len(from_wire(JournalEntry, wire).reason) <= 2048


def test_figures_keep_unknown_points_unknown():
    figures = Figures(10.0, 100.0, [Series(Scope.NODE, "node01", "gpu_util_pct", "%", [None, 50.0])])
    assert from_wire(Figures, to_wire(figures)).series[0].points == [None, 50.0]
