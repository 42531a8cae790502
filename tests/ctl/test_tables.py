"""What `ctl nodes`, `replicas`, `status`, `weights` and `reload` print: a dash for what a node did not say, never a zero."""

from __future__ import annotations

from llmgw.answers import ReloadAnswer, WeightsAnswer
from llmgw.ctl import tables
from llmgw.views import FleetStatus, ReplicaView
from llmgw.wire import from_wire
from tests.test_render import ENGINES, GB, LIBGOMP, node

def test_an_old_agent_that_reports_nothing_shows_dashes_not_zeros():
    table = tables.nodes_table([node()])
    row = table.splitlines()[1]
    assert row.split() == ["node05", "ready", "-", "-", "-", "-", "-", "-", "-"]
    assert "0" not in row.replace("node05", "")


def test_engines_show_each_build_with_a_mark_for_one_that_cannot_run_yet_and_its_words_underneath():
    table = tables.nodes_table([node(engines=ENGINES)])
    header, row, *notes = table.splitlines()
    assert header.split()[7] == "ENGINES"
    assert "llama.cpp b5000, llama.cpp b6000 (installing), vllm (broken), sim 0.1.0" in row
    assert "sglang" not in row  # absent: every node's, said only in --json and the details
    assert notes == [
        "  node05: llama.cpp b6000 installing: downloading llama-b6000-bin-ubuntu-x64.zip 12/16 MB",
        f"  node05: vllm broken: {LIBGOMP}",
    ]


def test_ctl_nodes_json_carries_every_engine_entry_with_its_state_reason_and_origin(capsys):
    import argparse
    import json

    from llmgw.ctl.main import _print

    _print(argparse.Namespace(json=True), [node(engines=ENGINES)], tables.nodes_table)
    (printed,) = json.loads(capsys.readouterr().out)
    assert [(e["name"], e["version"], e["state"], e["origin"]) for e in printed["engines"]] == [
        ("llama.cpp", "b5000", "installed", "server.yaml"), ("llama.cpp", "b6000", "installing", "server.yaml"),
        ("vllm", None, "broken", "server.yaml"), ("sglang", None, "absent", None), ("sim", "0.1.0", "installed", "builtin"),
    ]
    assert printed["engines"][2]["reason"] == LIBGOMP


def test_a_cpu_without_avx2_is_flagged_and_the_warning_is_printed_under_the_table():
    n = node(cpu={"model": "QEMU Virtual CPU version 2.5+", "logical_cores": 4, "avx2": False},
             warnings=["CPU QEMU Virtual CPU version 2.5+ has no AVX2"])
    table = tables.nodes_table([n])
    assert "QEMU Virtual CPU version 2.5+ (4) NO AVX2!" in table
    assert table.splitlines()[-1] == "  node05: CPU QEMU Virtual CPU version 2.5+ has no AVX2"


def test_a_node_that_is_not_ready_says_why():
    table = tables.nodes_table([node(state="lost", reason="no heartbeat for 130 s", seen_ago_s=130)])
    assert "2m ago" in table
    assert "node05: lost: no heartbeat for 130 s" in table


def test_replicas_show_their_reason_on_a_line_underneath_and_stale_flags():
    table = tables.replicas_table(from_wire(list[ReplicaView], [
        {"model": "echo", "replica": "echo/0", "state": "ready", "nodes": ["node01"],
         "endpoint": "http://10.0.0.1:4000", "age_s": 190, "stale": True, "reason": None},
        {"model": "big", "replica": "big/0", "state": "pending", "nodes": [], "endpoint": None,
         "age_s": None, "stale": None, "reason": "no node can hold it: node05: has 8 GB of memory, needs 24"},
        {"model": "old", "replica": "old/0", "state": "ready", "nodes": ["node02"], "endpoint": "http://x:1",
         "age_s": 5, "stale": None, "reason": None},
    ]))
    lines = table.splitlines()
    assert lines[1].split() == ["echo", "echo/0", "ready", "node01", "http://10.0.0.1:4000", "3m", "stale"]
    assert lines[2].split()[:4] == ["big", "big/0", "pending", "-"]
    assert lines[3] == "    no node can hold it: node05: has 8 GB of memory, needs 24"
    assert lines[4].split()[-1] == "?"  # an agent too old to report a fingerprint: unknown, not matching


def test_a_failed_replica_shows_its_engines_last_lines_under_its_reason():
    tail = [f"line {i}" for i in range(1, 16)]
    table = tables.replicas_table(from_wire(list[ReplicaView], [
        {"model": "echo", "replica": "echo/0", "state": "failed", "nodes": ["node01"],
         "reason": "node01: exited with code 2 (next try in 5 s)",
         "shards": [{"shard": "echo/0/0", "node": "node01", "state": "failed", "reason": "exited with code 2",
                     "output_tail": tail}]},
        # An older server sends no output_tail: the reason alone, as before.
        {"model": "old", "replica": "old/0", "state": "failed", "nodes": ["node02"], "reason": "exited with code 1",
         "shards": [{"shard": "old/0/0", "node": "node02", "state": "failed"}]},
    ]))
    lines = table.splitlines()
    assert lines[2:5] == ["    node01: exited with code 2 (next try in 5 s)",
                          "      last lines of echo/0/0 on node01:", "      line 6"]
    assert lines[13] == "      line 15"
    assert lines[14].split()[:3] == ["old", "old/0", "failed"]
    assert lines[15:] == ["    exited with code 1"]


MULTI = {"model": "big", "replica": "big/0", "state": "starting", "nodes": ["node01"], "age_s": 12, "shards": [
    {"shard": "big/0/0", "node": "node01", "state": "starting", "rank": 0, "age_s": 12, "started": True,
     "waiting": "waiting for its rendezvous to accept connections"},
    {"shard": "big/0/1", "node": "node02", "rank": 1, "age_s": 12, "started": False,
     "waiting": "waiting for rank 0's rendezvous on node01"},
    {"shard": "big/0/2", "node": "node03", "rank": 2, "age_s": 130, "started": True, "state": "ready"},
]}


def test_each_rank_of_a_multi_node_replica_has_a_line_with_its_node_state_age_and_what_it_waits_for():
    table = tables.replicas_table(from_wire(list[ReplicaView], [MULTI]))
    assert table.splitlines()[2:] == [
        "    rank 0 node01 starting 12s: waiting for its rendezvous to accept connections",
        "    rank 1 node02 not started 12s: waiting for rank 0's rendezvous on node01",
        "    rank 2 node03 ready 2m",
    ]


def test_a_failed_rank_says_its_nodes_words_and_an_older_servers_ranks_show_dashes():
    failed = {**MULTI, "state": "failed", "reason": "node02: killed by signal 9 (next try in 1 s)", "shards": [
        {"shard": "big/0/0", "node": "node01", "state": "ready", "rank": 0},
        {"shard": "big/0/1", "node": "node02", "state": "failed", "rank": 1, "reason": "killed by signal 9"},
    ]}
    # An older server sends neither rank nor age nor what a rank waits for.
    older = {**MULTI, "replica": "big/1", "shards": [{"shard": "big/1/0", "node": "node04", "state": "starting"},
                                                   {"shard": "big/1/1", "node": "node05", "state": "starting"}]}
    lines = tables.replicas_table(from_wire(list[ReplicaView], [failed, older])).splitlines()
    assert lines[2:5] == ["    node02: killed by signal 9 (next try in 1 s)",
                          "    rank 0 node01 ready -", "    rank 1 node02 failed -: killed by signal 9"]
    assert lines[6:] == ["    rank - node04 starting -", "    rank - node05 starting -"]


def test_a_single_rank_replica_gets_no_rank_lines():
    one = {**MULTI, "shards": [{**MULTI["shards"][0], "waiting": "waiting for its health probe"}]}
    assert len(tables.replicas_table(from_wire(list[ReplicaView], [one])).splitlines()) == 2


def test_ctl_replicas_json_carries_each_ranks_node_state_age_and_wait(capsys):
    import argparse
    import json

    from llmgw.ctl.main import _print

    _print(argparse.Namespace(json=True), from_wire(list[ReplicaView], [MULTI]), tables.replicas_table)
    (printed,) = json.loads(capsys.readouterr().out)
    assert [(s["rank"], s["node"], s["state"], s["age_s"], s["started"], s["waiting"]) for s in printed["shards"]] == [
        (0, "node01", "starting", 12, True, "waiting for its rendezvous to accept connections"),
        (1, "node02", None, 12, False, "waiting for rank 0's rendezvous on node01"),
        (2, "node03", "ready", 130, True, None),
    ]


def test_status_counts_ready_against_desired():
    text = tables.status_text(from_wire(FleetStatus, {
        "models": [{"model": "echo", "engine": "sim", "ready": 1, "desired": 2,
                    "states": {"ready": 1, "pending": 1}, "stale": 0}],
        "nodes": {"ready": 2, "lost": 1}}))
    assert text.splitlines()[1].split()[:4] == ["echo", "sim", "1", "2"]
    assert text.splitlines()[-1] == "nodes: 1 lost, 2 ready"


def test_status_with_ha_lists_every_server_its_role_and_epoch():
    text = tables.status_text(from_wire(FleetStatus, {"nodes": {"ready": 2}, "servers": [
        {"name": "serverA", "role": "standby", "url": "wss://a:7443/"},
        {"name": "serverB", "role": "leader", "epoch": 12, "url": "wss://b:7443/", "api_url": "https://b:8080"}]}))
    lines = text.splitlines()
    assert lines[-3].split() == ["SERVER", "ROLE", "EPOCH", "HUB", "API"]
    assert lines[-2].split() == ["serverA", "standby", "-", "wss://a:7443/", "-"]
    assert lines[-1].split() == ["serverB", "leader", "12", "wss://b:7443/", "https://b:8080"]


def test_a_figure_an_older_server_did_not_send_shows_as_a_dash():
    text = tables.status_text(from_wire(FleetStatus, {"models": [{"model": "echo"}]}))
    assert text.splitlines()[1].split() == ["echo", "-", "-", "-", "-", "-"]


def test_ctl_weights_lists_each_unwanted_file_and_says_how_to_collect_it():
    answer = from_wire(WeightsAnswer, {"unwanted": {"node05": [{"path": "/w/llmgw-x", "size_bytes": 5 * GB}]},
                                       "collected": None})
    assert tables.weights_text(answer).splitlines() == [
        "node05  5.0 GB  /w/llmgw-x", "(llmgw ctl weights --collect asks the nodes to remove them)"]


def test_ctl_weights_counts_what_was_removed_and_prints_why_a_node_refused():
    answer = from_wire(WeightsAnswer, {
        "unwanted": {"node05": [{"path": "/w/a", "size_bytes": GB}, {"path": "/w/b", "size_bytes": GB}]},
        "collected": {"node05": {"removed": ["/w/a"], "refused": {"/w/b": "refused /w/b: in use"}}},
    })
    assert tables.weights_text(answer).splitlines()[2:] == [
        "asked to remove 2 file(s) on 1 node(s): 1 removed", "  node05 refused: refused /w/b: in use"]


def test_ctl_weights_says_so_when_nothing_is_unwanted():
    assert tables.weights_text(from_wire(WeightsAnswer, {"unwanted": {}})) == (
        "no node holds weights llmgw fetched that the catalog no longer wants")


NOW = 1_800_000_000.0


DAY = 86400.0


def test_a_certificate_near_its_end_gets_a_line_saying_what_to_do_and_a_distant_one_none():
    soon = tables.nodes_table([node(certificate_not_after=NOW + 12 * DAY)], now=NOW)
    assert soon.splitlines()[-1] == (
        "  node05: its certificate expires in 12 days (2027-01-27): issue a new one with "
        "`llmgw pki issue DIR node05 --role node --force` where the CA is, and restart its agent")
    gone = tables.nodes_table([node(certificate_not_after=NOW - DAY)], now=NOW)
    assert "node05: its certificate expired on 2027-01-14" in gone
    far = tables.nodes_table([node(certificate_not_after=NOW + 300 * DAY)], now=NOW)
    unknown = tables.nodes_table([node()], now=NOW)
    assert len(far.splitlines()) == len(unknown.splitlines()) == 2


def test_what_the_hub_refused_for_a_node_is_shown_under_the_table():
    sentence = ("node05 is already connected from 10.0.0.5:53122; a second agent with its certificate "
                "from 10.0.0.9:40110 was refused: give each node its own certificate")
    table = tables.nodes_table([node(link_warnings=[sentence])], now=NOW)
    assert table.splitlines()[-1] == f"  node05: {sentence}"


def test_ctl_reload_names_each_change_or_says_there_were_none():
    assert tables.reload_text(ReloadAnswer(["models.echo.replicas: 1 -> 2", "admin.keys: 1 added"])) == (
        "reloaded: models.echo.replicas: 1 -> 2; admin.keys: 1 added")
    assert tables.reload_text(ReloadAnswer([])) == "reloaded: no changes"
