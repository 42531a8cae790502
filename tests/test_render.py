"""The words ctl, the dashboard and the admin page share (``llmgw.render``): a dash for what was not said, never a zero."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llmgw import render
from llmgw.answers import CordonAnswer, DrainAnswer
from llmgw.views import NodeView
from llmgw.wire import from_wire

GB = 1_000_000_000


def node(**kw):
    """A node view as ctl decodes it from an answer holding these keys."""
    return from_wire(NodeView, {"id": "node05", "state": "ready", **kw})


LIBGOMP = "needs libgomp.so.1, which this node does not have: apt-get install libgomp1"
ENGINES = [
    {"name": "llama.cpp", "version": "b5000", "state": "installed", "origin": "server.yaml",
     "path": "/var/lib/llmgw/engines/llama.cpp/b5000/llama-server"},
    {"name": "llama.cpp", "version": "b6000", "state": "installing", "origin": "server.yaml",
     "reason": "downloading llama-b6000-bin-ubuntu-x64.zip 12/16 MB"},
    {"name": "vllm", "state": "broken", "origin": "server.yaml", "reason": LIBGOMP},
    {"name": "sglang", "state": "absent", "reason": "not in the catalog's engines, nor in agent.yaml"},
    {"name": "sim", "version": "0.1.0", "state": "installed", "origin": "builtin"},
]


def test_engines_not_reported_are_a_dash_and_none_found_is_none():
    assert render.engines(node()) == "-"
    assert render.engines(node(engines=[])) == "none"
    assert render.engines(node(engines=[ENGINES[3]])) == "none"
    # An agent older than install states: what it saw run, unmarked.
    assert render.engines(node(engines=[{"name": "llama.cpp", "version": "b4000", "path": "/usr/bin/llama-server"}])) \
        == "llama.cpp b4000"


def test_a_node_without_gpus_says_none_and_one_not_asked_says_dash():
    assert render.gpus(node(gpus=[])) == "none"
    assert render.gpus(node()) == "-"


def test_gpus_are_grouped_by_model_with_memory_in_use():
    cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GB, "memory_used_bytes": GB}
             for i in range(8)]
    assert render.gpus(node(gpus=cards)) == "8x H100 80GB HBM3 (8.0 GB / 640 GB used)"


def test_shared_filesystems_are_shown_apart_from_local_disk():
    n = node(filesystems=[
        {"mountpoint": "/", "shared": False, "free_bytes": 50 * GB, "total_bytes": 200 * GB},
        {"mountpoint": "/lustre", "shared": True, "free_bytes": 8000 * GB, "total_bytes": 10000 * GB},
    ])
    assert render.disk(n) == "50.0 GB free / 200 GB, shared 8.0 TB free / 10.0 TB"


def test_a_filesystem_without_figures_is_unknown_not_empty():
    assert render.disk(node(filesystems=[{"mountpoint": "/srv", "free_bytes": None, "total_bytes": None}])) == "-"
    assert render.memory(node(memory_total_bytes=None, memory_available_bytes=5)) == "-"


def test_the_seam_between_two_reads_of_a_log_is_where_the_new_lines_start():
    assert render.new_lines_start([], ["a"]) == 0
    assert render.new_lines_start(["a", "b", "c"], ["b", "c", "d"]) == 2  # the log moved on
    assert render.new_lines_start(["a", "b"], ["a", "b"]) == 2
    assert render.new_lines_start(["a", "b"], ["x", "y"]) is None
    assert render.new_lines_start(["x", "x"], ["x", "x", "x"]) == 2


def test_a_wider_second_read_shows_only_what_was_written_since():
    log = [f"line {i}" for i in range(1000)]
    # ctl logs -f reads -n lines, then a wider window: the first read is inside the second.
    assert render.new_lines(log[800:900], log[500:903]) == log[900:903]
    assert render.new_lines(log[800:900], log[500:900]) == []
    # Repeated lines: the longest tail of the first read decides where the seam is.
    repeats = ["start", "GET /metrics", "GET /metrics", "POST /v1/chat", "GET /metrics"]
    assert render.new_lines(repeats[:4], repeats) == ["GET /metrics"]


@pytest.mark.parametrize("answer, words", [
    (CordonAnswer("node05", True), "node05: cordoned"),
    (CordonAnswer("node05", False), "node05: uncordoned"),
    (DrainAnswer("node05", True, []), "node05: cordoned; asked to stop 0 shard(s)"),
    (DrainAnswer("node05", True, ["echo/0/0", "big/1/\x1b[2J"]),
     "node05: cordoned; asked to stop 2 shard(s): echo/0/0, big/1/\\x1b[2J"),
    (DrainAnswer("node05", True, None), "node05: cordoned"),  # a drain that did not say what it stopped
])
def test_a_node_verbs_answer_says_what_it_did(answer, words):
    assert render.node_verb_text(answer) == words


#: What the shared words may not import: a package of a process, or of one process's UI.
PROCESS_PARTS = ("llmgw.agent", "llmgw.control", "llmgw.router", "llmgw.link", "llmgw.ctl", "llmgw.tui",
                 "llmgw.admin", "llmgw.process", "llmgw.sim", "llmgw.engines", "llmgw.config", "llmgw.pki")


def test_the_shared_words_import_no_part_of_a_process():
    """ctl, the dashboard and the admin page use them, so none of those owns them, nor any other process package."""
    tree = ast.parse(Path(render.__file__).read_text("utf-8"))
    imported = [(n.lineno, n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [(n.lineno, a.name) for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    crossing = [f"llmgw/render.py:{line}: imports {name}" for line, name in imported
                for part in PROCESS_PARTS if name == part or name.startswith(part + ".")]
    assert crossing == []
