"""The ranks of a multi-node replica on their nodes: rendezvous reported once open, ready only once joined.

Real processes and sockets (tests/agent/rank_standin.py); each step the
test waits on is held by a gate file until the test has looked.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest_twisted

from llmgw.agent.ports import rendezvous_port
from llmgw.engines.base import CompletionProbe, Connected, HealthProbe, LaunchPlan
from tests.support.net import free_port
from tests.support.wait import until

from .supervisorharness import harness, make_spec  # noqa: F401 - the fixture, by name

RANK = str(Path(__file__).with_name("rank_standin.py"))


def rank_planner(gates: Path, rendezvous: int):
    def plan(spec, port):
        if spec.rank == 0:
            return LaunchPlan(argv=[sys.executable, RANK, "leader", "--port", str(port), "--rendezvous",
                                    str(rendezvous), "--gates", str(gates)],
                              health=HealthProbe("/health"), rendezvous_port=rendezvous,
                              joined=CompletionProbe("tiny"))
        host, _, leader_port = spec.leader.rpartition(":")
        return LaunchPlan(argv=[sys.executable, RANK, "worker", "--join", spec.leader], health=None,
                          joined=Connected(host, int(leader_port)))

    return plan


def said(reports, shard_id, words):
    return lambda: next((s for s in reports if s.spec.shard_id == shard_id and s.reason and words in s.reason), None)


@pytest_twisted.ensureDeferred
async def test_rank_0_is_ready_only_once_its_rendezvous_opened_and_every_rank_joined(harness, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    rendezvous = free_port()
    reports = harness.reports
    sup = harness.supervisor(planner=rank_planner(gates, rendezvous))
    leader = f"127.0.0.1:{rendezvous}"

    sup.start(make_spec("tiny/0/0", ranks=2))
    sup.start(make_spec("tiny/0/1", rank=1, ranks=2, leader=leader))
    await until(said(reports, "tiny/0/0", f"waiting for its rendezvous port {rendezvous}"), "rank 0 to wait", 15)
    await until(said(reports, "tiny/0/1", f"waiting to join rank 0 at {leader}"), "rank 1 to wait", 15)
    assert all(s.rendezvous is None for s in reports)

    (gates / "rendezvous").touch()
    opened = await until(lambda: next((s for s in reports if s.rendezvous), None), "the rendezvous reported", 15)
    assert (opened.spec.shard_id, opened.state, opened.rendezvous) == ("tiny/0/0", "starting", leader)
    # Health answers, and rank 1 joined; a completion is not served yet.
    await until(said(reports, "tiny/0/0", "waiting for every rank to join"), "rank 0 to wait for the ranks", 15)
    await reports.reach("ready", "tiny/0/1")
    assert reports.states("tiny/0/0")[-1] == "starting"

    (gates / "joined").touch()
    ready = await reports.reach("ready", "tiny/0/0")
    assert ready.rendezvous == leader and ready.reason is None
    for shard in ("tiny/0/0", "tiny/0/1"):
        assert (await sup.stop(shard)).state == "stopped"
    assert harness.engines() == []


@pytest_twisted.ensureDeferred
async def test_a_worker_that_never_joins_fails_at_its_start_timeout_saying_what_it_waited_for(harness, tmp_path):
    reports = harness.reports
    nobody = free_port()
    sup = harness.supervisor(planner=rank_planner(tmp_path, nobody))
    sup.start(make_spec("tiny/0/1", rank=1, ranks=2, leader=f"127.0.0.1:{nobody}", start_timeout_s=1.0))
    failed = await reports.reach("failed", "tiny/0/1")
    assert failed.reason == ("did not become healthy within 1 s; it was waiting to join rank 0 at "
                             f"127.0.0.1:{nobody}: no connection to it yet")
    assert harness.engines() == []


def test_rank_0s_port_is_the_engines_default_while_free_even_in_time_wait():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        other = rendezvous_port("127.0.0.1", port)
        assert other != port
    finally:
        listener.close()
    # Rank 0 of the replica's last run closed first: its port sits in TIME_WAIT.
    listener = socket.create_server(("127.0.0.1", port))
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()
    listener.close()
    client.recv(1)
    client.close()
    assert rendezvous_port("127.0.0.1", port) == port
    assert rendezvous_port("127.0.0.1", None) > 0
