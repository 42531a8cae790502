"""What a replica still fetching and a node's page show first, drawn by the page's own functions."""

from __future__ import annotations

from twisted.web.template import flattenString, tags

from llmgw.admin import pages
from llmgw.admin.auth import Operator
from llmgw.records import Progress
from llmgw.states import ReplicaState
from llmgw.tui.fake import node_view, replica_view

OPERATOR = Operator("127.0.0.1", True)
ASKED_LOG = tags.section(tags.h2("Log: the node's answer"), tags.p("no shard tiny/0/0 on this node", class_="bad"))


def html(tag) -> str:
    out: list[bytes] = []
    flattenString(None, tag).addCallback(out.append)
    return out[0].decode()


def test_a_fetching_replicas_page_shows_its_download_where_its_log_would_be():
    replica = replica_view("tiny/0", "node01", state=ReplicaState.FETCHING,
                           progress=Progress("hf://acme/tiny", "model.safetensors", 120_000_000, 253_000_000))
    page = html(pages.replica_page("", OPERATOR, replica, ASKED_LOG, 10))
    assert "tiny/0/0 has not started, so it has no log yet: fetching its weights: model.safetensors: " \
           "120 MB of 253 MB" in page
    assert "no shard" not in page and 'class="bad"' not in page

    started = replica_view("tiny/0", "node01", state=ReplicaState.STARTING)
    assert "no shard tiny/0/0 on this node" in html(pages.replica_page("", OPERATOR, started, ASKED_LOG, 10))


def test_a_nodes_page_shows_what_it_is_before_its_log():
    log = tags.section(tags.h2("Log: agent"), tags.pre("\n".join(f"line {i}" for i in range(200)), class_="log"))
    page = html(pages.node_page("", OPERATOR, node_view("node01"), [], log, None, 10, now=1_700_000_000.0))
    assert page.index("<h2>Reported</h2>") < page.index("<h2>GPUs</h2>") < page.index("<h2>Log: agent</h2>")
    assert page.index("<h2>Filesystems</h2>") < page.index("<h2>Log: agent</h2>")
