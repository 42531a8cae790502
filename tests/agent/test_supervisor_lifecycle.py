"""Engines this supervisor starts: ready, failed, stopped, as a user of the fleet would see them."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import psutil
import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from llmgw.agent.lifecycle import ShardInput, ShardLifecycle
from llmgw.agent.statefiles import safe_name
from llmgw.engines.base import LaunchPlan
from llmgw.states import ShardState
from tests.support.net import free_port
from tests.support.procs import alive
from tests.support.wait import sleep, until

from .supervisorharness import WORKER, harness, make_spec, plan_standin  # noqa: F401 - the fixture, by name


def record_of(harness, shard_id):
    path = harness.state_dir / "shards" / (safe_name(shard_id) + ".json")
    return json.loads(path.read_text()) if path.exists() else None


async def get(url: str) -> int:
    def fetch():
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status

    return await threads.deferToThread(fetch)


@pytest_twisted.ensureDeferred
async def test_an_engine_becomes_ready_in_a_process_group_of_its_own(harness):
    sup = harness.supervisor()
    spec = make_spec("tiny/0/0", "--healthy-after", "0.3")

    first = sup.start(spec)
    assert first.state == "starting"
    ready = await harness.reports.reach("ready")

    assert harness.reports.states() == ["starting", "ready"]
    assert ready.pid == first.pid and ready.adopted is False
    assert ready.endpoint.startswith("http://127.0.0.1:")
    assert await get(ready.endpoint + "/health") == 200
    assert os.getpgid(ready.pid) == ready.pid != os.getpgrp()
    assert os.getsid(ready.pid) == ready.pid
    assert sup.statuses() == [sup.statuses()[0]] and sup.statuses()[0].state == "ready"

    record = record_of(harness, "tiny/0/0")
    assert record["pid"] == record["pgid"] == ready.pid
    assert record["spec"]["shard_id"] == "tiny/0/0" and record["spec"]["args"] == ["--healthy-after", "0.3"]
    assert record["endpoint"] == ready.endpoint
    assert abs(record["create_time"] - psutil.Process(ready.pid).create_time()) < 0.05
    assert record["started_at"] > 0


@pytest_twisted.ensureDeferred
async def test_a_fixed_port_in_the_spec_is_the_port_it_serves_on(harness):
    port = free_port()
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0", port=port))
    ready = await harness.reports.reach("ready")
    assert ready.endpoint == f"http://127.0.0.1:{port}"


@pytest_twisted.ensureDeferred
async def test_the_engines_output_is_in_its_tail_and_its_log_file(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0", "--lines", "5"))
    await until(lambda: "standin line 4" in sup.tail("tiny/0/0"), "the fifth line in the tail")

    tail = sup.tail("tiny/0/0")
    assert "standin says this on stderr" in tail
    assert tail.index("standin line 0") < tail.index("standin line 4")
    assert sup.tail("tiny/0/0", 1) == tail[-1:]
    assert sup.sources() == ["tiny/0/0"]
    log_text = (harness.state_dir / "shards" / (safe_name("tiny/0/0") + ".log")).read_text()
    assert "standin line 4" in log_text and "llmgw:" in log_text.splitlines()[0]


@pytest_twisted.ensureDeferred
async def test_the_tail_keeps_only_the_last_lines(harness):
    sup = harness.supervisor(tail_lines=10)
    sup.start(make_spec("tiny/0/0", "--lines", "40"))
    await until(lambda: "standin says this on stderr" in sup.tail("tiny/0/0"), "the last line in the tail")
    tail = sup.tail("tiny/0/0")
    assert len(tail) == 10 and "standin line 0" not in tail and "standin line 39" in tail


@pytest_twisted.ensureDeferred
async def test_an_engine_killed_by_a_signal_fails_with_the_signal_and_its_last_words(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0", "--lines", "3"))
    ready = await harness.reports.reach("ready")
    await until(lambda: "standin line 2" in sup.tail("tiny/0/0"), "its output in the tail")

    os.kill(ready.pid, signal.SIGKILL)
    failed = await harness.reports.reach("failed")

    assert failed.reason == "killed by signal 9 (SIGKILL)"
    assert "standin line 2" in failed.output_tail and len(failed.output_tail) <= 50
    assert harness.reports.states() == ["starting", "ready", "failed"]
    assert sup.statuses() == []
    assert record_of(harness, "tiny/0/0") is None
    assert any("failed: killed by signal 9" in line for line in sup.tail("tiny/0/0"))


@pytest_twisted.ensureDeferred
async def test_an_engine_that_exits_fails_with_its_exit_code(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0", "--healthy-after", "60", "--exit-after", "0.3", "--exit-code", "3"))
    failed = await harness.reports.reach("failed")
    assert failed.reason == "exited with code 3"
    assert "standin exiting with code 3" in failed.output_tail
    assert harness.reports.states() == ["starting", "failed"]


@pytest_twisted.ensureDeferred
async def test_an_engine_that_never_answers_fails_after_its_start_timeout_and_is_killed(harness):
    sup = harness.supervisor()
    started = reactor.seconds()
    status = sup.start(make_spec("tiny/0/0", "--never-healthy", start_timeout_s=1.5))
    failed = await harness.reports.reach("failed")

    assert failed.reason == "did not become healthy within 1.5 s"
    assert reactor.seconds() - started >= 1.5
    assert any(line.startswith("standin pid") for line in failed.output_tail)
    await until(lambda: not alive(status.pid), "the unhealthy engine is killed", timeout=5)
    assert harness.reports.states() == ["starting", "failed"]


@pytest_twisted.ensureDeferred
async def test_an_engine_that_cannot_be_run_fails_and_says_why(harness):
    sup = harness.supervisor(planner=lambda spec, port: LaunchPlan(argv=["/nonexistent/llama-server"]))
    sup.start(make_spec("tiny/0/0"))
    failed = await harness.reports.reach("failed")
    assert failed.reason == "exited with code 127"
    assert any("cannot run /nonexistent/llama-server" in line for line in failed.output_tail)


@pytest_twisted.ensureDeferred
async def test_a_plan_that_cannot_be_made_fails_without_starting_anything(harness):
    def refuse(spec, port):
        raise ValueError("tiny needs a GGUF file, and /srv/models/tiny.gguf does not exist")

    sup = harness.supervisor(planner=refuse)
    status = sup.start(make_spec("tiny/0/0"))
    assert status.state == "failed" and "/srv/models/tiny.gguf does not exist" in status.reason
    assert harness.reports.states() == ["failed"]
    assert harness.engines() == [] and sup.statuses() == []


@pytest_twisted.ensureDeferred
async def test_a_shard_whose_weights_were_fetched_runs_on_to_the_end_on_the_same_lifecycle(harness):
    life = ShardLifecycle(ShardState.FETCHING)
    life.fire(ShardInput.FETCHED)
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0"), life)
    await harness.reports.reach("ready")
    assert life.state == ShardState.READY
    await sup.stop("tiny/0/0")
    assert life.state == ShardState.STOPPED
    assert harness.reports.states() == ["starting", "ready", "draining", "stopped"]


def test_a_shard_still_fetching_is_not_launched(harness):
    sup = harness.supervisor()
    with pytest.raises(ValueError, match="shard tiny/0/0 is fetching: only a starting shard is launched"):
        sup.start(make_spec("tiny/0/0"), ShardLifecycle(ShardState.FETCHING))
    assert harness.reports == [] and harness.engines() == []


@pytest_twisted.ensureDeferred
async def test_a_worker_rank_without_health_probe_is_ready_once_it_runs(harness):
    sup = harness.supervisor(poll_interval=0.2)
    status = sup.start(make_spec("tiny/0/1", WORKER, "--never-healthy"))
    ready = await harness.reports.reach("ready")
    assert ready.pid == status.pid and ready.since - status.since >= 0.2


@pytest_twisted.ensureDeferred
async def test_starting_a_shard_twice_starts_one_engine(harness):
    sup = harness.supervisor()
    spec = make_spec("tiny/0/0", "--healthy-after", "0.5")
    first = sup.start(spec)
    second = sup.start(spec)
    assert second.pid == first.pid and second.state == "starting"
    await harness.reports.reach("ready")
    third = sup.start(spec)
    assert third.pid == first.pid and third.state == "ready"
    assert [p.pid for p in harness.engines()] == [first.pid]
    assert harness.reports.states() == ["starting", "ready"]


@pytest_twisted.ensureDeferred
async def test_stop_sends_sigterm_to_the_group_and_waits_until_it_is_gone(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0", "--fork-child"))
    ready = await harness.reports.reach("ready")
    child_line = await until(lambda: [l for l in sup.tail("tiny/0/0") if l.startswith("standin child pid")],
                             "the engine's own child started")
    grandchild = int(child_line[0].split()[-1])
    assert os.getpgid(grandchild) == ready.pid

    final = await sup.stop("tiny/0/0")

    assert final.state == "stopped" and final.reason == "stopped"
    assert not alive(ready.pid) and not alive(grandchild)
    assert "standin: got SIGTERM, exiting" in sup.tail("tiny/0/0")
    assert harness.reports.states() == ["starting", "ready", "draining", "stopped"]
    assert record_of(harness, "tiny/0/0") is None
    assert sup.statuses() == []
    assert await sup.stop("tiny/0/0") == final


@pytest_twisted.ensureDeferred
async def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace_period(harness):
    sup = harness.supervisor(stop_grace_s=1)
    sup.start(make_spec("tiny/0/0", "--ignore-term"))
    ready = await harness.reports.reach("ready")
    began = reactor.seconds()
    final = await sup.stop("tiny/0/0")

    assert reactor.seconds() - began >= 1
    assert final.state == "stopped" and final.reason == "stopped; SIGKILL after 1 s"
    assert not alive(ready.pid)
    assert "standin: ignoring SIGTERM" in sup.tail("tiny/0/0")


@pytest_twisted.ensureDeferred
async def test_stopping_an_engine_that_is_still_starting_stops_it(harness):
    sup = harness.supervisor()
    status = sup.start(make_spec("tiny/0/0", "--never-healthy"))
    final = await sup.stop("tiny/0/0")
    assert final.state == "stopped" and not alive(status.pid)
    assert harness.reports.states() == ["starting", "draining", "stopped"]


@pytest_twisted.ensureDeferred
async def test_two_stops_at_once_share_one_outcome(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0"))
    await harness.reports.reach("ready")
    a, b = sup.stop("tiny/0/0"), sup.stop("tiny/0/0")
    assert (await a).state == (await b).state == "stopped"
    assert harness.reports.states().count("stopped") == 1


@pytest_twisted.ensureDeferred
async def test_stopping_a_shard_this_node_does_not_run_is_nothing_to_do(harness):
    sup = harness.supervisor()
    assert await sup.stop("nothing/0/0") is None


@pytest_twisted.ensureDeferred
async def test_drain_is_reported_and_survives_in_the_record(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0"))
    await harness.reports.reach("ready")
    assert sup.drain("tiny/0/0").state == "draining"
    assert harness.reports.states() == ["starting", "ready", "draining"]
    assert record_of(harness, "tiny/0/0")["draining"] is True
    final = await sup.stop("tiny/0/0")
    assert final.state == "stopped"
    assert harness.reports.states() == ["starting", "ready", "draining", "stopped"]


@pytest_twisted.ensureDeferred
async def test_a_failed_shard_can_be_started_again(harness):
    sup = harness.supervisor()
    sup.start(make_spec("tiny/0/0", "--never-healthy", "--exit-after", "0.2", "--exit-code", "1"))
    await harness.reports.reach("failed")
    again = sup.start(make_spec("tiny/0/0"))
    assert again.state == "starting"
    ready = await harness.reports.reach("ready")
    assert ready.pid == again.pid
    # The new run's tail is the new run's output only.
    assert not any("standin exiting" in line for line in sup.tail("tiny/0/0"))


@pytest_twisted.ensureDeferred
async def test_a_report_callback_that_raises_does_not_stop_supervision(harness):
    seen = []

    def flaky(status):
        seen.append(status.state)
        raise RuntimeError("link down")

    from llmgw.agent.supervisor import Supervisor

    sup = Supervisor(reactor, harness.state_dir, plan_standin, flaky, poll_interval=0.05, health_interval=0.05)
    harness.supervisors.append(sup)
    sup.start(make_spec("tiny/0/0"))
    await until(lambda: "ready" in seen, "ready reported despite the callback raising")
    assert (await sup.stop("tiny/0/0")).state == "stopped"
    assert seen == ["starting", "ready", "draining", "stopped"]
    await sleep(0)


@pytest_twisted.ensureDeferred
async def test_a_stopped_shard_leaves_the_log_sources_and_a_failed_one_stays_for_a_while(harness):
    from llmgw.agent.supervisor import FAILED_SOURCE_S

    sup = harness.supervisor()
    sup.start(make_spec("gone/0/0"))
    sup.start(make_spec("broken/0/0", "--healthy-after", "60", "--exit-after", "0.3", "--exit-code", "3"))
    await harness.reports.reach("ready", "gone/0/0")
    assert sorted(sup.sources()) == ["broken/0/0", "gone/0/0"]
    await sup.stop("gone/0/0")
    await harness.reports.reach("failed", "broken/0/0")

    assert sup.sources() == ["broken/0/0"]  # why it failed is in its log
    assert "standin: got SIGTERM, exiting" in sup.tail("gone/0/0")  # still readable by name
    later = sup._clock.seconds() + FAILED_SOURCE_S + 1
    assert sup.sources(now=later) == []
