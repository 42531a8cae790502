"""What the fleet publishes about a node: its heartbeats only when they are news; a bounded count of downloads."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent

from llmgw.control.fleet import Fleet, TooManyDownloads
from llmgw.control.news import NewsSettings
from llmgw.records import GPU, EngineInfo, Filesystem, Heartbeat, Inventory, Progress

GB = 1_000_000_000


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def events():
    return []


@pytest.fixture
def fleet(clock, events):
    fleet = Fleet(clock, lambda kind, ident, event: events.append((kind, ident, event)),
                  unreachable_after=15, lost_after=60)
    fleet.register("node01", 7, Inventory(
        node_id="node01", address="10.0.0.5", memory_total_bytes=64 * GB, memory_available_bytes=40 * GB,
        gpus=[GPU(index=0, uuid="GPU-0", memory_total_bytes=80 * GB, memory_used_bytes=10 * GB, utilization_pct=30)],
        filesystems=[Filesystem(mountpoint="/data", total_bytes=1000 * GB, free_bytes=500 * GB)]))
    return fleet


def beat(**kw):
    figures = dict(memory_total_bytes=64 * GB, memory_available_bytes=40 * GB,
                   gpus=[GPU(index=0, uuid="GPU-0", memory_total_bytes=80 * GB, memory_used_bytes=10 * GB,
                             utilization_pct=30)],
                   filesystems=[Filesystem(mountpoint="/data", total_bytes=1000 * GB, free_bytes=500 * GB)])
    figures.update(kw)
    return Heartbeat(**figures)


def node_events(events):
    return [e for kind, _, e in events if kind == "node"]


def test_twenty_heartbeats_with_unchanged_figures_publish_once_every_interval(fleet, clock, events):
    del events[:]
    for _ in range(20):
        clock.advance(5)
        fleet.heartbeat("node01", 7, beat())
    # 100 s of heartbeats every 5 s: one event each 30 s (node_event_interval_s), not 20.
    assert [e.node.last_seen for e in node_events(events)] == [30.0, 60.0, 90.0]
    # The fleet itself is current whatever was published: ctl nodes answers from it.
    assert fleet.nodes["node01"].last_seen == 100.0


@pytest.mark.parametrize("small, large", [
    (dict(memory_available_bytes=41 * GB), dict(memory_available_bytes=30 * GB)),
    (dict(gpus=[GPU(index=0, uuid="GPU-0", memory_total_bytes=80 * GB, memory_used_bytes=11 * GB, utilization_pct=32)]),
     dict(gpus=[GPU(index=0, uuid="GPU-0", memory_total_bytes=80 * GB, memory_used_bytes=10 * GB, utilization_pct=90)])),
    (dict(filesystems=[Filesystem(mountpoint="/data", total_bytes=1000 * GB, free_bytes=490 * GB)]),
     dict(filesystems=[Filesystem(mountpoint="/data", total_bytes=1000 * GB, free_bytes=100 * GB)])),
])
def test_a_figure_is_news_once_it_moves_by_more_than_the_threshold(fleet, clock, events, small, large):
    del events[:]
    clock.advance(5)
    fleet.heartbeat("node01", 7, beat(**small))
    assert node_events(events) == []
    clock.advance(5)
    fleet.heartbeat("node01", 7, beat(**large))
    assert [e.change for e in node_events(events)] == ["heartbeat"]


@pytest.mark.parametrize("change", [
    dict(engines=[EngineInfo("sim", "0.1", "/usr/bin/llmgw-sim", state="installed")]),
    dict(gpus=[]),  # a GPU gone is not a figure
    dict(memory_total_bytes=128 * GB),
])
def test_what_a_node_is_is_news_at_once(fleet, clock, events, change):
    del events[:]
    clock.advance(1)
    fleet.heartbeat("node01", 7, beat(**change))
    assert len(node_events(events)) == 1


def test_a_node_back_from_unreachable_is_published_at_once(fleet, clock, events):
    clock.advance(20)
    fleet.check()
    del events[:]
    fleet.heartbeat("node01", 7, beat())
    assert [(e.change, e.node.state) for e in node_events(events)] == [("state", "ready")]


def test_the_interval_and_threshold_come_from_configure(fleet, clock, events):
    fleet.configure(NewsSettings(interval_s=0.0, change=0.05), 64)
    del events[:]
    for _ in range(3):
        clock.advance(5)
        fleet.heartbeat("node01", 7, beat())
    assert len(node_events(events)) == 3


# -- downloads in progress --

def progress(i, final=False):
    return Progress(source=f"https://models.example/m{i}.gguf", file_name=f"m{i}.gguf", bytes_done=i, final=final)


def test_a_node_sending_a_thousand_downloads_keeps_at_most_the_cap_and_says_so_once(fleet, events):
    refused = 0
    with capturedLogs() as logged:
        for i in range(1000):
            try:
                fleet.download("node01", progress(i))
            except TooManyDownloads as e:
                refused += 1
                words = str(e)
    assert len(fleet.progress) == 64 and refused == 936
    assert words == ("node01 already shows 64 downloads in progress, the most fleet.downloads_per_node allows; "
                     "https://models.example/m999.gguf is not shown until one of them ends")
    lines = [formatEvent(e) for e in logged if e["log_level"] == LogLevel.warn]
    assert len(lines) == 1 and "node01 already shows 64 downloads" in lines[0]
    assert fleet.progress_refused == {"node01": 936}
    assert sum(1 for kind, _, _ in events if kind == "progress") == 64
    # A download in progress moves on; one that ends makes room, and a later refusal is said again.
    fleet.download("node01", progress(3))
    fleet.download("node01", progress(3, final=True))
    fleet.download("node01", progress(2000))
    with capturedLogs() as logged:
        with pytest.raises(TooManyDownloads):
            fleet.download("node01", progress(2001))
    assert len([e for e in logged if e["log_level"] == LogLevel.warn]) == 1


def test_a_node_that_registers_again_starts_with_no_downloads_shown(fleet):
    fleet.download("node01", progress(1))
    fleet.register("node01", 8, Inventory(node_id="node01", address="10.0.0.5"))
    assert fleet.progress == {}


def test_a_heartbeat_is_judged_news_exactly_as_the_whole_view_would_be():
    """``is_heartbeat_news`` (no view made) against ``is_news`` of the two views, over a thousand random heartbeats."""
    import random

    from llmgw.control.news import is_heartbeat_news, is_news

    rng = random.Random(14)
    clock = Clock()
    fleet = Fleet(clock, lambda *a: None, unreachable_after=15, lost_after=60)
    gpus = [GPU(index=i, uuid=f"GPU-{i}", name="NVIDIA H100", memory_total_bytes=80 * GB,
                memory_used_bytes=10 * GB, utilization_pct=30) for i in range(4)]
    fleet.register("node01", 7, Inventory(node_id="node01", memory_total_bytes=64 * GB,
                                          memory_available_bytes=40 * GB, gpus=gpus,
                                          engines=[EngineInfo("llama.cpp", "b1")]))
    published = fleet.nodes["node01"].view(clock.seconds())
    agreed = {True: 0, False: 0}
    for _ in range(1000):
        clock.advance(rng.choice((1, 5)))
        moved = [GPU(index=g.index, uuid=g.uuid if rng.random() > 0.01 else "GPU-new", name=g.name,
                     memory_total_bytes=g.memory_total_bytes,
                     memory_used_bytes=rng.choice((None, 10 * GB + rng.randint(0, 6 * GB))),
                     utilization_pct=rng.choice((None, rng.randint(0, 100), 30))) for g in gpus]
        heartbeat = Heartbeat(
            memory_total_bytes=rng.choice((64 * GB, 64 * GB, 64 * GB, None, 32 * GB)),
            memory_available_bytes=rng.choice((None, 40 * GB, 40 * GB + rng.randint(-8 * GB, 8 * GB))),
            gpus=rng.choice((moved, moved, None, moved[:2])),
            engines=rng.choice((None, None, [EngineInfo("llama.cpp", "b1")], [EngineInfo("llama.cpp", "b2")])),
        )
        fleet.heartbeat("node01", 7, heartbeat)
        node = fleet.nodes["node01"]
        whole = is_news(published, node.view(clock.seconds()), 0.05)
        assert is_heartbeat_news(published, node.state, node.reason, node.inventory, 0.05) == whole
        agreed[whole] += 1
        if whole or rng.random() < 0.1:
            published = node.view(clock.seconds())
    assert agreed[True] > 50 and agreed[False] > 50  # both answers were exercised
