"""The pieces under the screens: cells, the store's queue, following a log, the process's one reactor."""

from __future__ import annotations

import subprocess
import sys

import attrs

from llmgw import render
from llmgw.records import Progress
from llmgw.states import NodeState
from llmgw.tui import columns
from llmgw.tui.fake import node_view, replica_view
from llmgw.tui.store import FleetStore, urgent
from llmgw.tui.table import natural
from tests.support.cluster import environment

GB = 10**9


def test_cells_show_a_dash_for_what_was_not_reported_and_none_for_what_was_looked_for():
    old = node_view("n", engines=None, gpus=None, cpu=None, memory_total_bytes=None, filesystems=None, address=None)
    cells = [str(c) for c in columns.node_cells(old, None)]
    assert cells == ["n", "ready", "-", "-", "-", "-", "-", "-", "-"]
    looked = node_view("n", engines=[], gpus=[])
    assert columns.engines(looked).plain == "none"
    assert columns.gpus(looked) == "none"


def test_gpu_utilisation_shows_only_when_every_card_reported_it():
    cards = [{"index": 0, "name": "NVIDIA A100", "memory_total_bytes": 40 * GB, "memory_used_bytes": 10 * GB,
              "utilization_pct": 50},
             {"index": 1, "name": "NVIDIA A100", "memory_total_bytes": 40 * GB, "memory_used_bytes": 0,
              "utilization_pct": 10}]
    assert columns.gpus(node_view("n", gpus=cards)) == "2x A100 (10.0 GB / 80.0 GB used) 30%"
    cards[1]["utilization_pct"] = None
    assert columns.gpus(node_view("n", gpus=cards)) == "2x A100 (10.0 GB / 80.0 GB used)"


def test_progress_is_a_bar_with_a_total_and_bytes_without_one():
    def progress(done, total, rate):
        return columns.progress(Progress("https://x/m.gguf", "m.gguf", done, total, rate)).plain

    assert progress(0, 4 * GB, None) == "━━━━━━━━━━━━   0% 0 B / 4.0 GB"
    assert progress(4 * GB, 4 * GB, 2e9) == "━━━━━━━━━━━━ 100% 4.0 GB / 4.0 GB 2.0 GB/s"
    assert progress(1 * GB, None, 5e7) == "1.0 GB so far 50.0 MB/s"
    # A download under a gigabyte in megabytes, not "0.0 GB / 0.3 GB".
    assert progress(20_000_000, 253_000_000, None).endswith("8% 20.0 MB / 253 MB")


def test_one_size_formatter_picks_the_unit_that_suits():
    assert [render.size(n) for n in (None, 0, 999, 1_500, 253_000_000, 999_949_999, 1.5 * GB, 640 * GB, 2e12)] == [
        "-", "0 B", "999 B", "1.5 kB", "253 MB", "1.0 GB", "1.5 GB", "640 GB", "2.0 TB"]


def test_a_long_reason_is_cut_in_the_table_only():
    replica = replica_view("m/0", None, reason="x" * 200)
    assert len(columns.note(replica).plain) == columns.NOTE_WIDTH


def test_stale_is_shown_as_ctl_shows_it():
    assert columns.stale(replica_view("m/0", "n", stale=True)).plain == "stale"
    assert columns.stale(replica_view("m/0", "n", stale=False)).plain == ""
    assert columns.stale(replica_view("m/0", "n", stale=None)).plain == "?"
    assert columns.stale(replica_view("m/0", None)).plain == ""


def test_natural_order():
    assert sorted(["gpu10", "gpu2", "gpu1"], key=natural) == ["gpu1", "gpu2", "gpu10"]
    assert sorted([("echo", "10"), ("echo", "2")], key=natural) == [("echo", "2"), ("echo", "10")]


def test_a_heartbeat_is_not_urgent_but_a_state_or_cordon_is():
    base = node_view("n")
    assert not urgent(base, attrs.evolve(base, memory_available_bytes=1, seen_ago_s=0.0, last_seen=5.0))
    assert urgent(base, attrs.evolve(base, state=NodeState.UNREACHABLE))
    assert urgent(base, attrs.evolve(base, cordoned=True))
    assert urgent(None, base)


def test_the_store_keeps_only_a_nodes_latest_view_and_holds_them_while_syncing():
    now = [100.0]
    store = FleetStore(lambda: now[0])
    store.link_up()
    store.queue_node(node_view("n", state="lost"))
    assert store.take_nodes(figures=True) == {}, "nothing is applied before the snapshot"
    store.load([node_view("n", seen_ago_s=2.0)], [])
    assert store.take_nodes()["n"].state == NodeState.LOST, "what came after the snapshot's answer goes on top"
    store.load([node_view("n", seen_ago_s=2.0)], [])
    for free in (1, 2, 3):
        store.queue_node(node_view("n", memory_available_bytes=free * GB, seen_ago_s=0.0))
    assert store.take_nodes() == {}, "figures wait for the slow pass"
    taken = store.take_nodes(figures=True)
    assert taken["n"].memory_available_bytes == 3 * GB
    now[0] += 30
    assert store.seen_ago("n") == 30.0
    assert store.counts() == (1, 1, 0, 0)
    store.queue_node(node_view("n", state="unreachable"))
    assert store.take_nodes()["n"].state == NodeState.UNREACHABLE
    assert store.counts() == (1, 0, 0, 0)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment(), timeout=60)


def test_the_tui_process_uses_twisteds_client_never_autobahn_asyncio_and_installs_no_reactor_on_import():
    out = _python(
        "import sys\n"
        "import llmgw.tui, llmgw.tui.cli, llmgw.tui.app, llmgw.tui.backend\n"
        "print('reactor' if 'twisted.internet.reactor' in sys.modules else 'no reactor')\n"
        "print(sorted(m for m in sys.modules if m.startswith('autobahn.asyncio')))\n"
        "import txaio; print(txaio.using_twisted)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["no reactor", "[]", "True"]


def test_another_reactor_already_installed_is_refused_in_words():
    out = _python(
        "import asyncio\n"
        "from twisted.internet import reactor\n"
        "from llmgw.tui.backend import install_reactor, ReactorTaken\n"
        "try:\n"
        "    install_reactor(asyncio.new_event_loop())\n"
        "except ReactorTaken as e:\n"
        "    print(e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "is already installed in this process" in out.stdout


def test_the_stylesheets_are_shipped_with_the_package():
    """Textual reads each screen's .tcss beside its module; a wheel without them cannot start."""
    import configparser
    from fnmatch import fnmatch
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    shipped = config["options.package_data"].get("llmgw.tui", "").split()
    sheets = sorted(p.name for p in (root / "src" / "llmgw" / "tui").glob("*.tcss"))
    assert sheets, "the TUI's stylesheets are missing"
    missing = [name for name in sheets if not any(fnmatch(name, pattern) for pattern in shipped)]
    assert not missing, "add `llmgw.tui = *.tcss` under [options.package_data] in setup.cfg"
