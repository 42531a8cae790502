"""The rolling figures: a bucket's rates, its percentiles, unknown kept apart from zero, and the memory bound."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent

from llmgw.control.series import Rolling, percentile
from llmgw.history import Figures, Scope
from llmgw.traffic import TTFT_BUCKETS_MS
from llmgw.wire import from_wire, to_wire

START = 1_000_000.0  # a bucket edge at 10 s


def clock_at(t: float = START) -> Clock:
    clock = Clock()
    clock.advance(t)
    return clock


def points(figures: Figures, scope: Scope, subject: str, name: str) -> list:
    found = [s.points for s in figures.series if s.scope is scope and s.subject == subject and s.name == name]
    assert len(found) == 1, f"{scope} {subject} {name}: {[(s.scope, s.subject, s.name) for s in figures.series]}"
    return found[0]


def test_a_bucket_rate_is_its_count_over_its_seconds():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=6)
    rolling.advance(clock.seconds())
    for _ in range(10):
        clock.advance(1)
        m = rolling.model(clock.seconds() - 0.5, "qwen")
        m.requests += 5
        m.tokens_in += 100
        m.tokens_out += 30
    clock.advance(0.5)
    figures = rolling.now_figures()
    assert figures.end == START + 10
    assert points(figures, Scope.MODEL, "qwen", "requests_per_s") == [5.0]
    assert points(figures, Scope.MODEL, "qwen", "tokens_in_per_s") == [100.0]
    assert points(figures, Scope.MODEL, "qwen", "tokens_out_per_s") == [30.0]
    # No router said anything of its queue: unknown, not 0.
    assert points(figures, Scope.MODEL, "qwen", "queue") == [None]


def test_the_first_bucket_counts_only_the_seconds_it_was_filled():
    clock = clock_at(START + 6)  # the server started 6 s into a bucket
    rolling = Rolling(clock, bucket_s=10, buckets=6)
    rolling.model(clock.seconds(), "qwen").requests += 8
    clock.advance(4)
    assert points(rolling.now_figures(), Scope.MODEL, "qwen", "requests_per_s") == [2.0]


def test_a_bucket_nobody_reported_is_unknown_and_the_hour_is_oldest_first():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=4)
    rolling.model(clock.seconds(), "qwen").requests += 10
    clock.advance(10)
    rolling.model(clock.seconds(), "qwen")  # reported, nothing counted: a known 0
    clock.advance(20)  # a bucket with no report at all
    rolling.model(clock.seconds(), "qwen").requests += 30
    clock.advance(10)
    figures = rolling.figures()
    assert len(figures.series[0].points) == 4
    assert points(figures, Scope.MODEL, "qwen", "requests_per_s") == [1.0, 0.0, None, 3.0]


def test_the_ring_forgets_what_is_older_than_its_buckets():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=3)
    for n in range(1, 6):
        rolling.model(clock.seconds(), "qwen").requests += 10 * n
        clock.advance(10)
    assert points(rolling.figures(), Scope.MODEL, "qwen", "requests_per_s") == [3.0, 4.0, 5.0]
    clock.advance(20)  # two buckets with nothing: the last figure is still in the window
    assert points(rolling.figures(), Scope.MODEL, "qwen", "requests_per_s") == [5.0, None, None]
    clock.advance(10)  # the hour has nothing of it: the subject is left out
    assert rolling.figures().series == []


def test_a_long_silence_is_skipped_not_walked_bucket_by_bucket():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=3)
    rolling.model(clock.seconds(), "qwen").requests += 10
    clock.advance(10 * 10**6)
    rolling.model(clock.seconds(), "qwen").requests += 20
    clock.advance(10)
    assert points(rolling.figures(), Scope.MODEL, "qwen", "requests_per_s") == [None, None, 2.0]


@pytest.mark.parametrize(("counts", "q", "expected"), [
    ({0: 10}, 0.5, 12.5),  # half of the first bucket, 0-25 ms
    ({2: 4}, 0.5, 75.0),  # 50-100 ms, half way
    ({0: 50, 3: 50}, 0.5, 25.0),  # the rank ends at the first bucket's edge
    ({0: 98, 5: 2}, 0.99, 750.0),  # the 99th of 100 is half way into 500-1000 ms
    ({11: 3}, 0.5, 60000.0),  # past the last edge: the last edge, "at least"
    ({}, 0.5, None),  # nothing counted
])
def test_percentiles_are_interpolated_inside_their_bucket(counts, q, expected):
    hist = [0] * (len(TTFT_BUCKETS_MS) + 1)
    for i, n in counts.items():
        hist[i] = n
    assert percentile(hist, q) == expected


def test_percentile_of_counts_of_another_length_is_unknown():
    assert percentile([1, 2, 3], 0.5) is None


def test_ttft_and_errors_by_class_in_a_bucket():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=6)
    m = rolling.model(clock.seconds(), "qwen")
    m.requests, m.errors, m.by_class = 20, 10, {"5xx": 10}
    m.ttft[1] = 20  # 25-50 ms
    clock.advance(10)
    figures = rolling.now_figures()
    assert points(figures, Scope.MODEL, "qwen", "ttft_p50_ms") == [37.5]
    assert points(figures, Scope.MODEL, "qwen", "ttft_p99_ms") == [pytest.approx(49.75)]
    assert points(figures, Scope.MODEL, "qwen", "errors_per_s") == [1.0]
    assert points(figures, Scope.MODEL, "qwen", "errors_5xx_per_s") == [1.0]
    # A class never seen has no series: an answer names only what was counted.
    assert not [s for s in figures.series if s.name == "errors_4xx_per_s"]


def test_gauges_are_sampled_as_the_bucket_closes():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=6)
    queue = {"qwen": 3}
    nodes = {"node01": (40.0, None, 12.5)}
    rolling.queue_sampler = lambda: dict(queue)
    rolling.node_sampler = lambda: dict(nodes)
    rolling.advance(clock.seconds())
    clock.advance(9)
    queue["qwen"] = 7
    clock.advance(1)
    figures = rolling.now_figures()
    assert points(figures, Scope.MODEL, "qwen", "queue") == [7.0]
    # Only the queue is known of a model nobody counted: its rates stay unknown.
    assert points(figures, Scope.MODEL, "qwen", "requests_per_s") == [None]
    assert points(figures, Scope.NODE, "node01", "memory_used_pct") == [40.0]
    assert points(figures, Scope.NODE, "node01", "gpu_util_pct") == [None]
    assert points(figures, Scope.NODE, "node01", "gpu_memory_used_pct") == [12.5]


def test_keys_and_the_filters():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=6)
    rolling.add_key(clock.seconds(), "alice", 10, 500)
    rolling.add_key(clock.seconds(), "alice", 10, 500)
    rolling.model(clock.seconds(), "qwen").requests += 20
    clock.advance(10)
    assert points(rolling.now_figures(), Scope.KEY, "alice", "requests_per_s") == [2.0]
    assert points(rolling.now_figures(), Scope.KEY, "alice", "tokens_per_s") == [100.0]
    assert {s.scope for s in rolling.figures(Scope.KEY).series} == {Scope.KEY}
    assert {s.subject for s in rolling.figures(subject="qwen").series} == {"qwen"}
    assert len(rolling.figures(limit=3).series) == 3
    # What crosses the link reads back as it was.
    assert from_wire(Figures, to_wire(rolling.figures())) == rolling.figures()


def test_at_most_subjects_the_least_recently_updated_let_go_and_said_once():
    with capturedLogs() as events:
        rolling = subjects_churned()
    said = [formatEvent(e) for e in events if e["log_level"] == LogLevel.warn]
    assert len(said) == 1 and "'a'" in said[0] and "history.series_subjects" in said[0]
    assert (rolling.let_go, rolling.not_kept) == (1, 2)


def subjects_churned() -> Rolling:
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=6, subjects=3)
    for name in ("a", "b", "c"):
        rolling.model(clock.seconds(), name).requests += 10
    clock.advance(10)
    rolling.model(clock.seconds(), "b").requests += 10
    rolling.model(clock.seconds(), "c").requests += 10
    rolling.model(clock.seconds(), "d").requests += 10
    clock.advance(10)
    assert sorted({s.subject for s in rolling.figures().series}) == ["b", "c", "d"]
    assert rolling.let_go == 1
    # A newcomer in a bucket that wrote every kept subject is the one not kept: no churn.
    for name in ("b", "c", "d", "e", "f"):
        rolling.model(clock.seconds(), name).requests += 10
    clock.advance(10)
    assert sorted({s.subject for s in rolling.figures().series}) == ["b", "c", "d"]
    return rolling


def test_memory_is_buckets_floats_per_series_whatever_the_traffic():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=360, subjects=50)
    for bucket in range(1000):
        for n in range(200):  # four times as many subjects as it keeps
            m = rolling.model(clock.seconds(), f"model{n}")
            m.requests += 1
            m.by_class["5xx"] = 1
            m.errors += 1
        clock.advance(10)
    assert len(rolling._subjects) == 50
    assert rolling.held() <= 50 * 12
    ring = next(iter(rolling._subjects.values())).rings["requests_per_s"]
    assert ring.itemsize * len(ring) == 360 * 4


def test_the_open_bucket_holds_at_most_subjects_names_however_many_a_router_invents():
    clock = clock_at()
    rolling = Rolling(clock, bucket_s=10, buckets=6, subjects=5)
    for n in range(10_000):
        rolling.add_key(clock.seconds(), f"key{n}", 1, 1)
        rolling.model(clock.seconds(), f"model{n}").requests += 1
    assert len(rolling._keys) + len(rolling._models) <= 5
    assert rolling.not_kept == 20_000 - 5
    clock.advance(10)
    assert len({s.subject for s in rolling.figures().series}) == 5
