"""The admin page shows a node's words as text, escaped as ctl shows them, and a node's malformed answer in words.

The server is a real process and the node a real session on its hub over
TLS (``tests/ctl/hostile.py``).  Before, a `logs` answer of the wrong shape
was a 500 with a traceback in the server's log, and a log line's escape
sequences and bidi overrides went into the page as they came.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import pytest_twisted
from twisted.internet import threads

from tests.ctl.hostile import HostileNode, raw_in

pytestmark = pytest.mark.integration

ESCAPED = "\\x1b]52;c;cm0gLXJmIH4vKg==\\x07"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest_twisted.ensureDeferred
async def test_a_nodes_words_on_the_node_page_and_in_logs_json_are_text_and_escaped(cluster):
    cluster.start_server()
    node = await HostileNode(cluster).join()
    try:
        code, page = await threads.deferToThread(get, f"{cluster.admin}/node?id=node01")
        json_code, follow = await threads.deferToThread(get, f"{cluster.admin}/logs.json?node=node01")
        cluster_code, front = await threads.deferToThread(get, f"{cluster.admin}/")
    finally:
        node.leave()
    assert (code, json_code, cluster_code) == (200, 200, 200), page
    for body in (page, front):
        assert raw_in(body) == [], body
        assert "<script>alert" not in body and "<i>" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
        assert "javascript:" not in body
    # The warning, the engine's reason and the log's lines, each escaped.
    assert page.count(ESCAPED) >= 3, page
    assert f"{ESCAPED}\\x1b[2J" in page and "after\\nforged line" in page
    lines = json.loads(follow)["lines"]
    assert lines[1] == "after\\nforged line" and lines[0].startswith(ESCAPED)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("answer", [
    {"node": "node01", "source": "agent", "lines": 5},
    {"node": "node01", "source": "agent", "lines": "one long string"},
    {"node": "node01", "source": "agent", "sources": [{"a": 1}]},
    "not a mapping",
])
async def test_a_logs_answer_of_the_wrong_shape_is_a_sentence_on_the_page_not_a_500(cluster, answer):
    cluster.start_server()
    node = await HostileNode(cluster).join()
    node.answers["logs"] = answer
    try:
        code, page = await threads.deferToThread(get, f"{cluster.admin}/node?id=node01")
        json_code, words = await threads.deferToThread(get, f"{cluster.admin}/logs.json?node=node01")
    finally:
        node.leave()
    assert code == 200, page
    assert "node01 answered logs with something llmgw cannot read (LogsAnswer" in page, page
    assert json_code == 502 and words.startswith("node01 answered logs with something llmgw cannot read"), words
    assert "Traceback" not in cluster.server.output()


def test_a_downloads_words_which_the_pages_script_sets_as_they_come_are_escaped_where_they_are_made():
    from llmgw.admin import pages
    from llmgw.records import Progress

    words = pages.download_words(Progress(source="https://x/m.gguf", file_name="m\u202efgg.exe\x1b", bytes_done=1))
    assert words == "m\\u202efgg.exe\\x1b: 1 B of -"
