"""An engine's download is given up when the mirror trickles, runs past its deadline, or the plan moves on.

And the other ways a mirror can misbehave on the way: a body that never
ends, a redirect loop (a redirect elsewhere is followed, the sha256 still
checked).

A mirror on 127.0.0.1 lets an archive through a few bytes at a time
(``Gate.let``); time follows a ``Clock`` the test advances, a step only once
the node has seen the bytes of the step before.  The stall timeout alone
never ends a trickle: a byte every 20 s is never 60 s of silence.
"""

from __future__ import annotations

import pytest_twisted
from twisted.internet.task import Clock

from llmgw.agent.engines.pip import venv_key
from llmgw.agent.weights import partial_name
from llmgw.config.agent import InstallLimits
from llmgw.records import EngineBuild, EngineInfo, EnginePlan
from llmgw.states import EngineState
from tests.agent.engines.test_install import (  # noqa: F401 - the fixtures, by name
    ASSET, TAG, assert_refused, installers, left_in, make, markers, mirror, only, plan, publish, root)
from tests.support.engine_archives import simple_index, stand_in_wheel
from tests.support.wait import until

NEXT = "b6001"


def done_so_far(installer) -> int:
    interim = [r.bytes_done for r in installer.reports if not r.final]
    return interim[-1] if interim else 0


async def trickle(installer, gate, clock: Clock, converged, *, size: int, every_s: int, steps: int) -> None:
    """*size* bytes through *gate* every *every_s* s of *clock*, *steps* times or until the install settles."""
    for _ in range(steps):
        if converged.called:
            return
        want = done_so_far(installer) + size
        gate.let(size)
        waited = 0.0

        def seen():
            # A quarter second at a time: the step stays every_s long however slowly the bytes arrive here.
            nonlocal waited
            clock.advance(0.25)
            waited += 0.25
            return converged.called or done_so_far(installer) >= want

        await until(seen, f"the node to see {want} bytes", detail=lambda: repr(installer.entries()))
        clock.advance(max(0.0, every_s - waited))


@pytest_twisted.ensureDeferred
async def test_a_mirror_that_trickles_under_the_minimum_rate_is_given_up_and_resumed_later(tmp_path, mirror, make,
                                                                                            root):
    url, sha = publish(tmp_path, mirror, filler=300_000)
    gate = mirror.hold(f"{TAG}/{ASSET}", at=100_000)
    clock = Clock()
    installer = make(clock, recheck_s=3600, limits=InstallLimits(min_rate_bytes_per_s=100, rate_window_s=60,
                                                            download_deadline_s=None))
    converged = installer.converge(plan(mirror, sha), set)
    await until(lambda: gate.reached, "the download to reach the gate")
    await trickle(installer, gate, clock, converged, size=1, every_s=20, steps=30)
    assert converged.called, f"a byte every 20 s still downloading: {installer.entries()}"
    entry = assert_refused(installer, root, f"{url}: ")
    assert "bytes/s over the last" in entry.reason
    assert "under the minimum of 100.0 bytes/s (min_rate_bytes_per_s of agent.yaml's installs); " \
           "the next attempt resumes from byte" in entry.reason
    assert (root / ".downloads" / partial_name(url)).exists()
    # The mirror mended: the recheck's attempt resumes and installs.
    gate.release()
    clock.advance(3600)
    await until(lambda: only(installer).state is EngineState.INSTALLED, "the next attempt to install it",
                detail=lambda: repr(installer.entries()))


@pytest_twisted.ensureDeferred
async def test_a_download_past_its_deadline_is_given_up_however_fast_it_trickles(tmp_path, mirror, make, root):
    url, sha = publish(tmp_path, mirror, filler=300_000)
    gate = mirror.hold(f"{TAG}/{ASSET}", at=100_000)
    clock = Clock()
    installer = make(clock, limits=InstallLimits(min_rate_bytes_per_s=None, download_deadline_s=100))
    converged = installer.converge(plan(mirror, sha), set)
    await until(lambda: gate.reached, "the download to reach the gate")
    await trickle(installer, gate, clock, converged, size=1000, every_s=20, steps=30)
    assert converged.called, f"still downloading past its deadline: {installer.entries()}"
    entry = assert_refused(installer, root, f"{url}: not all of it came within 100 s")
    assert "download_deadline_s of agent.yaml's installs" in entry.reason


@pytest_twisted.ensureDeferred
async def test_a_slow_but_honest_link_passes_the_default_limits(tmp_path, mirror, make):
    _, sha = publish(tmp_path, mirror, filler=4_000_000)
    gate = mirror.hold(f"{TAG}/{ASSET}", at=10_000)
    clock = Clock()
    installer = make(clock)  # agent.yaml's defaults: 4096 bytes/s over 300 s, 6 h in all
    converged = installer.converge(plan(mirror, sha), set)
    await until(lambda: gate.reached, "the download to reach the gate")
    # 10 kB/s for longer than the window.
    await trickle(installer, gate, clock, converged, size=100_000, every_s=10, steps=35)
    assert not converged.called and only(installer).state is EngineState.INSTALLING, installer.entries()
    gate.release()
    await until(lambda: clock.advance(1) or converged.called, "the rest of the download")
    assert only(installer).state is EngineState.INSTALLED


@pytest_twisted.ensureDeferred
async def test_a_newer_plan_gives_up_the_download_it_supersedes_and_installs_at_once(tmp_path, mirror, make, root):
    _, old_sha = publish(tmp_path, mirror, filler=500_000)
    _, new_sha = publish(tmp_path, mirror, tag=NEXT, version="version: 6001 (def5678)\n")
    gate = mirror.hold(f"{TAG}/{ASSET}", at=100_000)
    installer = make(Clock(), stall_timeout_s=1e9)  # a mirror that holds the old build for ever
    first = installer.converge(plan(mirror, old_sha), set)
    await until(lambda: gate.reached, "the old build's download to reach the gate")
    second = installer.converge(plan(mirror, new_sha, tag=NEXT), set)
    await until(lambda: second.called and first.called, "the newer plan to be installed without waiting",
                detail=lambda: repr(installer.entries()))
    assert [(e.version, e.state) for e in installer.entries()] == [(NEXT, EngineState.INSTALLED)]
    # Nothing of the old build under a final name, marked or not.
    assert left_in(root) == [NEXT] and markers(root) == [f"llama.cpp/{NEXT}/.llmgw-installed"]


@pytest_twisted.ensureDeferred
async def test_plans_racing_back_and_forth_end_on_the_last_one(tmp_path, mirror, make, root):
    url, old_sha = publish(tmp_path, mirror, filler=500_000)
    _, new_sha = publish(tmp_path, mirror, tag=NEXT, version="version: 6001 (def5678)\n", filler=500_000)
    old_gate = mirror.hold(f"{TAG}/{ASSET}", at=100_000)
    new_gate = mirror.hold(f"{NEXT}/{ASSET.replace(TAG, NEXT)}", at=100_000)
    installer = make(Clock(), stall_timeout_s=1e9)
    installer.converge(plan(mirror, old_sha), set)
    await until(lambda: old_gate.reached, "the first plan's download to reach its gate")
    installer.converge(plan(mirror, new_sha, tag=NEXT), set)
    await until(lambda: new_gate.reached, "the second plan's download to reach its gate")
    # The plan dropped it: its partial file goes with it, and the third plan starts it again.
    await until(lambda: not (root / ".downloads" / partial_name(url)).exists(), "the dropped download's file to go")
    old_gate.release()
    last = installer.converge(plan(mirror, old_sha), set)
    await until(lambda: last.called, "the last plan to be installed", detail=lambda: repr(installer.entries()))
    entry = only(installer)
    assert (entry.version, entry.state) == (TAG, EngineState.INSTALLED) and isinstance(entry, EngineInfo)
    assert left_in(root) == [TAG] and mirror.count(f"{TAG}/{ASSET}") == 2


@pytest_twisted.ensureDeferred
async def test_a_newer_plan_stops_the_pip_install_it_supersedes(tmp_path, mirror, make, root):
    # The package index answers the old spec's page a few bytes at a time, for ever: pip waits on it.
    wheels = [stand_in_wheel(tmp_path / "wheels", "vllm", v) for v in ("0.10.0", "0.11.0")]
    simple_index(mirror.directory, wheels)
    gate = mirror.hold("simple/vllm/", at=10)
    old = EngineBuild("vllm", "0.11.0", pip="vllm==0.11.0", index_url=mirror.url("simple/"))
    new = EngineBuild("vllm", "0.10.0", pip="vllm==0.10.0", index_url=simple_index(tmp_path / "local", wheels))
    installer = make()
    first = installer.converge(EnginePlan([old]), set)
    await until(lambda: gate.reached, "pip to ask the index for vllm", timeout=120)
    second = installer.converge(EnginePlan([new]), set)
    await until(lambda: first.called and second.called, "the newer plan to be installed without waiting on pip",
                timeout=60, detail=lambda: repr(installer.entries()))
    assert [(e.version, e.state) for e in installer.entries()] == [("0.10.0", EngineState.INSTALLED)]
    assert left_in(root, "vllm") == [venv_key(new)]


@pytest_twisted.ensureDeferred
async def test_a_body_that_never_ends_is_stopped_at_the_size_limit(mirror, make, root):
    mirror.endless(f"{TAG}/{ASSET}")
    installer = make(max_download_bytes=1_000_000)
    await installer.converge(plan(mirror, "1" * 64), set)
    assert_refused(installer, root, "over the limit of 1000000")
    assert list((root / ".downloads").iterdir()) == []


@pytest_twisted.ensureDeferred
async def test_a_redirect_is_followed_to_the_archive_and_a_loop_is_refused(tmp_path, mirror, make, root):
    _, sha = publish(tmp_path, mirror)
    mirror.redirect(f"{NEXT}/{ASSET.replace(TAG, NEXT)}", f"{NEXT}/again")
    mirror.redirect(f"{NEXT}/again", f"{NEXT}/{ASSET.replace(TAG, NEXT)}")
    looping = make()
    await looping.converge(plan(mirror, sha, tag=NEXT), set)
    entry = only(looping)
    assert entry.state is EngineState.BROKEN and mirror.url(f"{NEXT}/") in entry.reason, entry
    assert "redirection" in entry.reason
    assert left_in(root) == []
    looping.stop()
    # A mirror that moved the asset elsewhere: followed, and held to the same sha256.
    mirror.redirect(f"{TAG}/{ASSET}", f"moved/{ASSET}")
    (mirror.directory / "moved").mkdir()
    (mirror.directory / TAG / ASSET).rename(mirror.directory / "moved" / ASSET)
    moved = make()
    await moved.converge(plan(mirror, sha), set)
    assert only(moved).state is EngineState.INSTALLED
