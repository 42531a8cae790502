"""`ctl top`: the latest bucket per model, key and node, `-` for what nobody reported, names escaped."""

from __future__ import annotations

import argparse
import json

import pytest
from twisted.internet import defer

from llmgw.ctl import top
from llmgw.history import PAGE_MOST, Figures, Scope, Series
from llmgw.link import uris
from llmgw.wire import to_wire

END = 1_000_010.0


def figures(*series: Series) -> Figures:
    return Figures(10.0, END, list(series))


def model(name: str, **values) -> list[Series]:
    return [Series(Scope.MODEL, name, series, unit, [values.get(series)])
            for series, unit in (("requests_per_s", "req/s"), ("tokens_in_per_s", "tok/s"),
                                 ("tokens_out_per_s", "tok/s"), ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"),
                                 ("errors_per_s", "req/s"), ("queue", "requests"))]


def node(name: str, mem=None, gpu=None, gpu_mem=None) -> list[Series]:
    return [Series(Scope.NODE, name, "memory_used_pct", "%", [mem]), Series(Scope.NODE, name, "gpu_util_pct", "%", [gpu]),
            Series(Scope.NODE, name, "gpu_memory_used_pct", "%", [gpu_mem])]


def test_the_tables_show_each_figure_and_a_dash_for_what_was_not_reported():
    text = top.top_text(figures(*model("qwen", requests_per_s=5.04, tokens_in_per_s=1234.6, tokens_out_per_s=300,
                                       ttft_p50_ms=37.5, ttft_p99_ms=240.2, errors_per_s=0.0),
                                *node("node01", 75.0, None, 50.0)), now=END + 3)
    lines = text.splitlines()
    assert "(3 s ago)" in lines[0]
    header = lines[2].split()
    assert header[:2] == ["MODEL", "REQ/S"]
    assert lines[3].split() == ["qwen", "5.0", "1,235", "300", "38", "240", "0.00", "-"]
    assert lines[5].split()[0] == "NODE"
    assert lines[6].split() == ["node01", "75", "-", "50"]
    assert "KEY" not in text  # no keys: no key table


def test_keys_get_their_table_and_a_missing_scope_says_so():
    text = top.top_text(figures(Series(Scope.KEY, "alice", "requests_per_s", "req/s", [2.0]),
                                Series(Scope.KEY, "alice", "tokens_per_s", "tok/s", [None])), now=END)
    assert "no model has figures in this bucket" in text
    assert "no node has figures in this bucket" in text
    assert [line.split() for line in text.splitlines() if line.startswith("alice")] == [["alice", "2.0", "-"]]


def test_a_hostile_name_reaches_the_terminal_escaped():
    text = top.top_text(figures(*model("evil\x1b[2J\nname", requests_per_s=1.0),
                                *node("node\x07", 1.0, 1.0, 1.0)), now=END)
    assert "\x1b" not in text and "\x07" not in text
    # Each name stays on its row, with its figures.
    assert text.splitlines()[3].split()[:2] == ["evil\\x1b[2J\\nname", "1.0"]
    assert text.splitlines()[-1].split() == ["node\\x07", "1", "1", "1"]


def test_json_is_per_scope_per_name_with_null_for_unreported():
    out = top.top_json(figures(*model("qwen", requests_per_s=4.900000095367432), *node("node01", 75.0)))
    assert out["bucket_s"] == 10.0 and out["end"] == END
    assert out["model"]["qwen"]["requests_per_s"] == 4.9  # the server's float32, to the digits it holds
    assert out["model"]["qwen"]["queue"] is None
    assert out["node"]["node01"] == {"memory_used_pct": 75.0, "gpu_util_pct": None, "gpu_memory_used_pct": None}
    assert out["key"] == {}


class Session:
    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def call(self, uri, **kwargs):
        self.calls.append((uri, kwargs))
        return defer.succeed(self.answer)


@pytest.mark.parametrize("as_json", [True, False])
def test_the_command_asks_for_the_latest_bucket_and_prints_it(capsys, as_json):
    session = Session(to_wire(figures(*model("qwen", requests_per_s=5.0))))
    args = argparse.Namespace(json=as_json, watch=False)
    done = defer.ensureDeferred(top.cmd_top(session, args))
    assert self_result(done) == 0
    assert session.calls == [(uris.CP_FIGURES, {"buckets": 1})]
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out)["model"]["qwen"]["requests_per_s"] == 5.0
    else:
        assert "qwen" in out and "5.0" in out


def test_an_answer_this_ctl_cannot_read_says_which_procedure():
    from llmgw.errors import LlmgwError

    session = Session({"bucket_s": -1, "end": 0, "series": []})
    done = defer.ensureDeferred(top.cmd_top(session, argparse.Namespace(json=True, watch=False)))
    failure = []
    done.addErrback(failure.append)
    assert failure and failure[0].check(LlmgwError)
    assert uris.CP_FIGURES in str(failure[0].value)


def self_result(d: defer.Deferred):
    results = []
    d.addBoth(results.append)
    assert results, "the command did not finish at once"
    if hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


def test_an_answer_at_its_most_series_says_it_is_cut():
    many = [Series(Scope.NODE, f"node{n:05d}", "memory_used_pct", "%", [1.0]) for n in range(PAGE_MOST)]
    assert "the first 10000 series only" in top.top_text(figures(*many), now=END)
    assert "series only" not in top.top_text(figures(*many[:10]), now=END)
