"""Weights from a mirror that trickles are given up, and so is a fetch nothing wants any more; the next fetch resumes.

The hub mirror on 127.0.0.1 holds a file at a stop and lets it through a few
bytes at a time (``HubMirror.let``); time follows a ``Clock`` the test
advances, a step only once the node has seen the bytes of the step before
(``trickle``, as the engine installs' tests step).  A byte every 20 s never
trips the 60 s stall timeout: only agent.yaml's ``weights:`` limits end it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.task import Clock

from llmgw.agent.weights import Fetcher, FetchError, cache_name, partial_name
from llmgw.agent.weights.pace import Pace
from llmgw.agent.weights.partial import lock_partial
from llmgw.config.agent import InstallLimits, WeightsLimits, load_agent_config
from tests.agent.engines.test_install_pace import trickle
from tests.support.hfmirror import HubMirror
from tests.support.wait import until

from .modelserver import model_bytes
from .test_fetch import failure_of
from .test_repository import SOURCE, WEIGHTS, hub  # noqa: F401 - the fixture, by name

FILE = "hf://acme/tiny-llama/model.safetensors"
HELD = "acme/tiny-llama/model.safetensors"
STOP = 100_000
TRICKLE = WeightsLimits(min_rate_bytes_per_s=100, rate_window_s=60, download_deadline_s=None)


def paced(hub, weights_dir, clock, limits: WeightsLimits = WeightsLimits()):
    """A fetcher held to *limits*, and the node's view of it: what the trickle steps look at."""
    reports = []
    fetcher = Fetcher(reactor, weights_dir, clock=clock, progress=reports.append,
                      environ={"HF_ENDPOINT": hub.url}, pace=limits)
    return fetcher, SimpleNamespace(reports=reports, entries=lambda: reports[-2:])


def gate(hub, path: str = HELD):
    return SimpleNamespace(let=lambda n: hub.let(path, n))


@pytest_twisted.ensureDeferred
async def test_a_file_trickling_under_the_minimum_rate_is_given_up_and_the_next_fetch_resumes(hub, weights_dir):
    hub.hold(HELD, STOP)
    clock = Clock()
    fetcher, node = paced(hub, weights_dir, clock, TRICKLE)
    fetching = fetcher.fetch(FILE)
    await until(lambda: hub.reached(HELD), "the download to reach the stop")
    await trickle(node, gate(hub), clock, fetching, size=1, every_s=20, steps=30)
    assert fetching.called, f"a byte every 20 s is still being fetched: {node.entries()}"
    error = await failure_of(fetching)
    url = f"{hub.url}/{HELD.replace('tiny-llama/', 'tiny-llama/resolve/main/')}"
    assert isinstance(error, FetchError) and str(error).startswith(f"{url}: "), error
    assert " bytes/s over the last 6" in str(error)
    assert ("under the minimum of 100.0 bytes/s (min_rate_bytes_per_s of agent.yaml's weights); "
            "the next attempt resumes from byte 1000") in str(error)
    assert fetcher.in_flight() == frozenset()
    # The progress stream ends saying why, in the same words, not as a cancelled Python call.
    assert [r.error for r in node.reports if r.final] == [str(error)]
    kept = (weights_dir / partial_name(FILE)).stat().st_size
    assert kept > STOP
    # The mirror mended: the next fetch asks for the rest only.
    hub.release(HELD)
    path = await fetcher.fetch(FILE)
    assert path.read_bytes() == WEIGHTS
    last = hub.seen(HELD)[-1]
    assert (last["range"], last["status"], last["sent"]) == (f"bytes={kept}-", 206, len(WEIGHTS) - kept)


@pytest_twisted.ensureDeferred
async def test_a_fetch_past_its_deadline_is_given_up_however_fast_it_trickles(hub, weights_dir):
    hub.hold(HELD, STOP)
    clock = Clock()
    fetcher, node = paced(hub, weights_dir, clock, WeightsLimits(min_rate_bytes_per_s=None, download_deadline_s=100))
    fetching = fetcher.fetch(FILE)
    await until(lambda: hub.reached(HELD), "the download to reach the stop")
    await trickle(node, gate(hub), clock, fetching, size=1000, every_s=20, steps=30)
    assert fetching.called, f"still being fetched past its deadline: {node.entries()}"
    error = await failure_of(fetching)
    assert "/resolve/main/model.safetensors: not all of it came within 100 s (" in str(error)
    assert "the download_deadline_s of agent.yaml's weights gives it that long" in str(error)
    assert (weights_dir / partial_name(FILE)).stat().st_size > STOP


@pytest_twisted.ensureDeferred
async def test_every_shard_waiting_on_a_trickling_repository_is_told_and_its_files_are_kept(hub, weights_dir):
    hub.hold(HELD, STOP)
    clock = Clock()
    fetcher, node = paced(hub, weights_dir, clock, TRICKLE)
    first, second = fetcher.fetch(SOURCE), fetcher.fetch(SOURCE)
    await until(lambda: hub.reached(HELD), "the repository's weights to reach the stop")
    await trickle(node, gate(hub), clock, first, size=1, every_s=20, steps=30)
    assert first.called and second.called, f"a byte every 20 s is still being fetched: {node.entries()}"
    for waiting in (first, second):
        error = await failure_of(waiting)
        assert [r.error for r in node.reports if r.final] == [str(error)]
        assert "/resolve/" in str(error) and "of agent.yaml's weights" in str(error)
        assert "the next attempt resumes from byte 1000" in str(error) and "of model.safetensors" in str(error)
    staging = weights_dir / partial_name(SOURCE)
    kept = (staging / "model.safetensors.partial").stat().st_size
    assert kept > STOP
    hub.release(HELD)
    path = await fetcher.fetch(SOURCE)
    assert path == weights_dir / cache_name(SOURCE) and (path / "model.safetensors").read_bytes() == WEIGHTS
    last = hub.seen(HELD)[-1]
    assert (last["range"], last["status"]) == (f"bytes={kept}-", 206)


@pytest_twisted.ensureDeferred
async def test_a_slow_but_honest_link_passes_the_default_limits(tmp_path, weights_dir):
    big = model_bytes(36_000_000, seed=3)
    repo = tmp_path / "hub" / "acme" / "big"
    repo.mkdir(parents=True)
    (repo / "model.gguf").write_bytes(big)
    with HubMirror(tmp_path / "hub") as mirror:
        mirror.hold("acme/big/model.gguf", 1_000_000)
        clock = Clock()
        fetcher, node = paced(mirror, weights_dir, clock)  # agent.yaml's defaults: 64 kB/s over 300 s, 24 h
        fetching = fetcher.fetch("hf://acme/big/model.gguf")
        await until(lambda: mirror.reached("acme/big/model.gguf"), "the download to reach the stop")
        # 100 kB/s, for longer than the window.
        await trickle(node, gate(mirror, "acme/big/model.gguf"), clock, fetching, size=1_000_000, every_s=10,
                      steps=33)
        assert not fetching.called, node.entries()
        mirror.release("acme/big/model.gguf")
        path = await fetching
        assert path.stat().st_size == len(big)


@pytest_twisted.ensureDeferred
async def test_a_fetch_nothing_waits_for_any_more_is_given_up_and_resumed_by_the_next(hub, weights_dir):
    hub.hold(HELD, STOP)
    clock = Clock()
    fetcher, node = paced(hub, weights_dir, clock)
    one, other = fetcher.fetch(FILE), fetcher.fetch(FILE)
    await until(lambda: clock.advance(0.25) or (node.reports and node.reports[-1].bytes_done >= STOP),
                "the node to write what came before the stop")
    one.cancel()
    assert fetcher.in_flight() == {FILE}  # another still waits for it
    other.cancel()
    assert fetcher.in_flight() == frozenset()
    for gone in (one, other):
        assert isinstance(await failure_of(gone), defer.CancelledError)
    assert [r.error for r in node.reports if r.final] == [f"{FILE}: nothing on this node wants it any more"]
    kept = (weights_dir / partial_name(FILE)).stat().st_size
    assert kept >= STOP
    hub.release(HELD)
    assert (await fetcher.fetch(FILE)).read_bytes() == WEIGHTS
    assert hub.seen(HELD)[-1]["range"] == f"bytes={kept}-"



def test_agent_yaml_weights_section_sets_the_limits_and_null_switches_one_off(tmp_path):
    for name in ("ca.crt", "node.crt", "node.key"):
        (tmp_path / name).write_text("")
    (tmp_path / "agent.yaml").write_text(
        'hub: "wss://cp.example.org:7443/"\ntls: {ca: ca.crt, cert: node.crt, key: node.key}\n'
        "weights:\n  min_rate_bytes_per_s: null\n  download_deadline_s: 172800\n")
    config = load_agent_config(tmp_path / "agent.yaml")
    assert config.weights == WeightsLimits(min_rate_bytes_per_s=None, rate_window_s=300, download_deadline_s=172800)
    assert config.installs == InstallLimits()  # one section does not change the other
    # Absent: the defaults, which suit weights (a 140 GB model at 100 Mbit/s takes about 3 h).
    assert WeightsLimits() == WeightsLimits(min_rate_bytes_per_s=65536, rate_window_s=300, download_deadline_s=86400)
    assert 140e9 / (100e6 / 8) < WeightsLimits().download_deadline_s / 5


@pytest_twisted.ensureDeferred
async def test_a_fetch_waiting_on_another_agents_lock_is_held_to_the_deadline_too(hub, weights_dir):
    # Another agent on the same filer writes this file, and never finishes.
    other = lock_partial(weights_dir / partial_name(FILE))
    try:
        clock = Clock()
        fetcher, _ = paced(hub, weights_dir, clock, WeightsLimits(download_deadline_s=100))
        fetching = fetcher.fetch(FILE)
        clock.advance(99)
        assert not fetching.called
        clock.advance(1)
        assert fetching.called, "still waiting on the other agent's lock past the deadline"
        error = await failure_of(fetching)
        assert "model.safetensors: not all of it came within 100 s (0 bytes came in this attempt)" in str(error)
        assert fetcher.in_flight() == frozenset() and hub.seen(HELD) == []
    finally:
        other.close()


def test_only_time_spent_reading_a_body_counts_toward_the_rate():
    # A repository's next file: asked for, its resumed prefix hashed — longer than the window, nothing read.
    clock, given_up = Clock(), []
    pace = Pace(clock, SOURCE, TRICKLE, "agent.yaml's weights", given_up.append)
    for _ in range(2):
        with pace.reading():
            for _ in range(61):
                clock.advance(1)
                pace.moved += 1000
                assert pace.look("file", "byte 0")
        clock.advance(600)
    assert given_up == []
    # While a body is read, the same 600 s without a byte is a trickle.
    with pace.reading():
        pace.look("file", "byte 0")
        clock.advance(600)
        assert not pace.look("file", "byte 122000")
    (reason,) = given_up
    assert reason.startswith("file: ") and "over the last 6" in reason and reason.endswith("resumes from byte 122000")
