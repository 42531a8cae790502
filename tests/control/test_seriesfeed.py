"""Routers' cumulative counters become rates, whatever routers do; nodes' claims are checked before they are figures."""

from __future__ import annotations

import pytest
from autobahn.wamp.exception import ApplicationError
from twisted.internet.task import Clock

from llmgw.control.series import Rolling
from llmgw.control.seriesfeed import SeriesFeed, node_figures
from llmgw.history import Figures, Scope
from llmgw.link import uris
from llmgw.records import GPU
from llmgw.states import NodeState
from llmgw.traffic import REPORT_LIFETIME_S, TTFT_BUCKETS_MS, KeyCounts, ModelCounts, ModelLoad, RouterLoad
from llmgw.views import EventKind, NodeChange, NodeEvent, NodeView, ProgressEvent
from llmgw.wire import from_wire

START = 1_000_000.0
GIB = 2**30


class Router:
    """A router's counters since it started, reported once a second as a real one does."""

    def __init__(self, name: str):
        self.name = name
        self.requests = self.tokens_in = self.tokens_out = self.errors = self.key_requests = 0
        self.ttft = [0] * (len(TTFT_BUCKETS_MS) + 1)
        self.queued = 0

    def serve(self, n: int, ttft_bucket: int = 1, errors: int = 0) -> None:
        self.requests += n
        self.tokens_in += 10 * n
        self.tokens_out += 3 * n
        self.errors += errors
        self.ttft[ttft_bucket] += n
        self.key_requests += n

    def report(self) -> RouterLoad:
        counts = ModelCounts("qwen", self.requests, self.tokens_in, self.tokens_out,
                             {"5xx": self.errors} if self.errors else {}, list(self.ttft))
        return RouterLoad(self.name, models=[ModelLoad("qwen", queued=self.queued, held=1)], counts=[counts],
                          keys=[KeyCounts("alice", self.key_requests, 13 * self.key_requests)])


@pytest.fixture
def fed():
    clock = Clock()
    clock.advance(START)
    rolling = Rolling(clock, bucket_s=10, buckets=30)
    return clock, rolling, SeriesFeed(rolling)


def run(clock, feed, routers: dict[str, Router], seconds: int, per_s: int = 0) -> None:
    """*seconds* seconds of traffic, *per_s* requests a second on each router, each reporting every second."""
    for _ in range(seconds):
        for key, router in routers.items():
            router.serve(per_s)
            feed.load(router.report(), key, clock.seconds())
        clock.advance(1)


def latest(feed, scope=Scope.MODEL, subject="qwen", name="requests_per_s"):
    figures = from_wire(Figures, feed.figures(scope.value, subject, buckets=1))
    found = [s.points[0] for s in figures.series if s.name == name]
    assert found, f"no {name} in {figures}"
    return found[0]


def test_two_routers_differences_are_summed_into_rates(fed):
    clock, rolling, feed = fed
    routers = {"server": Router("server"), "host:7": Router("host:7")}
    run(clock, feed, routers, 10, per_s=3)  # the first bucket: each router's first report is its baseline
    run(clock, feed, routers, 10, per_s=3)
    assert latest(feed) == pytest.approx(6.0)
    assert latest(feed, name="tokens_in_per_s") == pytest.approx(60.0)
    assert latest(feed, name="tokens_out_per_s") == pytest.approx(18.0)
    assert latest(feed, name="ttft_p50_ms") == pytest.approx(37.5)
    assert latest(feed, name="queue") == 2.0  # both routers' held
    assert latest(feed, Scope.KEY, "alice") == pytest.approx(6.0)
    assert latest(feed, Scope.KEY, "alice", "tokens_per_s") == pytest.approx(78.0)


def test_a_first_report_is_a_baseline_not_hours_of_traffic_in_one_bucket(fed):
    clock, rolling, feed = fed
    old = Router("host:7")
    old.serve(1_000_000)  # a router running for hours before this server started
    run(clock, feed, {"host:7": old}, 10, per_s=2)
    assert latest(feed) == pytest.approx(1.8)  # nine seconds' differences: the first report added nothing


def test_a_router_whose_counters_go_down_within_its_session_is_not_believed_again(fed):
    clock, rolling, feed = fed
    router = Router("server")
    run(clock, feed, {"server": router}, 10, per_s=5)
    run(clock, feed, {"server": router}, 5, per_s=5)
    fresh = Router("server")  # same key, counters back at 0: not believed again within this session
    run(clock, feed, {"server": fresh}, 5, per_s=5)
    liar = Router("server")
    liar.serve(2**52)
    run(clock, feed, {"server": liar}, 1, per_s=0)
    run(clock, feed, {"server": Router("server")}, 1, per_s=0)
    run(clock, feed, {"server": liar}, 10, per_s=0)
    assert not latest(feed)  # 0 and 2**52 in turn add nothing (nothing counted: unknown)


def test_a_silent_router_is_forgotten_and_heard_again_as_new(fed):
    clock, rolling, feed = fed
    a, b = Router("a"), Router("b")
    run(clock, feed, {"a": a, "b": b}, 10, per_s=1)
    run(clock, feed, {"a": a}, 10, per_s=1)  # b says nothing
    assert latest(feed, name="queue") == 1.0  # b's held request no longer counts
    b.serve(500)  # what b counted while it was silent is not one second's traffic
    run(clock, feed, {"a": a, "b": b}, 10, per_s=1)
    assert latest(feed) == pytest.approx(1.9)
    assert REPORT_LIFETIME_S < 10


def test_no_router_at_all_is_unknown_not_zero(fed):
    clock, rolling, feed = fed
    router = Router("server")
    run(clock, feed, {"server": router}, 20, per_s=1)
    rolling.advance(clock.seconds())  # the server's timer, as the bucket ends
    clock.advance(10)
    figures = from_wire(Figures, feed.figures("model", "qwen"))
    for name in ("requests_per_s", "queue"):
        expected = [1.0 if name == "queue" else pytest.approx(0.9), 1.0, None]
        assert [s.points[-3:] for s in figures.series if s.name == name] == [expected]
    # ctl top, which reads the latest bucket, leaves the model out.
    assert from_wire(Figures, feed.figures(buckets=1)).series == []


def test_an_unknown_error_class_counts_in_the_total_only(fed):
    clock, rolling, feed = fed
    run(clock, feed, {"r": Router("r")}, 10)
    counts = ModelCounts("qwen", 10, errors={"teapot": 10, "429": 10})
    feed.load(RouterLoad("r", counts=[counts]), "r", clock.seconds())
    clock.advance(10)
    assert latest(feed, name="errors_per_s") == 2.0
    assert latest(feed, name="errors_429_per_s") == 1.0
    names = {s.name for s in from_wire(Figures, feed.figures()).series}
    assert not [n for n in names if "teapot" in n]


def test_ttft_counts_of_another_length_leave_the_percentiles_unknown(fed):
    clock, rolling, feed = fed
    feed.load(RouterLoad("r", counts=[ModelCounts("qwen", 0, ttft_ms=[0, 0, 0])]), "r", clock.seconds())
    feed.load(RouterLoad("r", counts=[ModelCounts("qwen", 9, ttft_ms=[1, 2, 3])]), "r", clock.seconds())
    clock.advance(10)
    assert latest(feed) == pytest.approx(0.9)
    assert latest(feed, name="ttft_p50_ms") is None


def node(**facts) -> NodeView:
    base = dict(id="node01", state=NodeState.READY, memory_total_bytes=64 * GIB, memory_available_bytes=16 * GIB,
                gpus=[GPU(0, memory_total_bytes=80 * GIB, memory_used_bytes=20 * GIB, utilization_pct=30),
                      GPU(1, memory_total_bytes=80 * GIB, memory_used_bytes=60 * GIB, utilization_pct=90)])
    base.update(facts)
    return NodeView(**base)


def test_a_nodes_figures_from_its_news():
    assert node_figures(node()) == (75.0, 60.0, 50.0)


@pytest.mark.parametrize(("facts", "expected"), [
    (dict(memory_available_bytes=65 * GIB), (None, 60.0, 50.0)),  # more available than it has
    (dict(memory_total_bytes=0), (None, 60.0, 50.0)),
    (dict(memory_available_bytes=None), (None, 60.0, 50.0)),
    (dict(gpus=[GPU(0, memory_total_bytes=10, memory_used_bytes=11, utilization_pct=101)]), (75.0, None, None)),
    (dict(gpus=[GPU(0, memory_total_bytes=10, memory_used_bytes=5, utilization_pct=-1)]), (75.0, None, 50.0)),
    (dict(gpus=[GPU(0, memory_total_bytes=10, memory_used_bytes=5), GPU(1, utilization_pct=5)]), (75.0, None, None)),
    (dict(gpus=[]), (75.0, None, None)),  # no GPUs: no GPU figures, not 0 %
    (dict(gpus=None), (75.0, None, None)),
    (dict(state=NodeState.UNREACHABLE), (None, None, None)),  # its last figures are stale
    (dict(state="rebooting"), (None, None, None)),  # a newer server's state
])
def test_a_nodes_claims_that_cannot_hold_are_unknown(facts, expected):
    assert node_figures(node(**facts)) == expected


def test_node_events_feed_the_node_series_and_forgotten_nodes_stop(fed):
    clock, rolling, feed = fed
    feed.event(EventKind.NODE, "node01", NodeEvent(NodeChange.REGISTERED, node()))
    feed.event(EventKind.NODE, "node02", NodeEvent(NodeChange.HEARTBEAT, node(id="node02", gpus=[])))
    feed.event(EventKind.PROGRESS, "node01", ProgressEvent.__new__(ProgressEvent))  # not a node's figures
    rolling.advance(clock.seconds())
    clock.advance(10)
    assert latest(feed, Scope.NODE, "node01", "gpu_util_pct") == 60.0
    assert latest(feed, Scope.NODE, "node02", "memory_used_pct") == 75.0
    assert latest(feed, Scope.NODE, "node02", "gpu_util_pct") is None
    feed.event(EventKind.NODE, "node02", NodeEvent(NodeChange.FORGOTTEN, node(id="node02")))
    clock.advance(10)
    subjects = {s.subject for s in from_wire(Figures, feed.figures(buckets=1)).series}
    assert subjects == {"node01"}


@pytest.mark.parametrize(("args", "words"), [
    (dict(scope="router"), "scope must be one of model, key, node"),
    (dict(subject="x" * 1025), "subject must be a name of at most 1024"),
    (dict(subject=7), "subject must be a name"),
    (dict(buckets=0), "buckets must be a whole number from 1 to 30 (history.series_buckets)"),
    (dict(buckets=31), "from 1 to 30"),
    (dict(buckets=True), "buckets must be"),
    (dict(limit=10_001), "limit must be a whole number from 1 to 10000"),
    (dict(limit="5"), "limit must be"),
])
def test_a_question_out_of_bounds_is_refused_naming_the_argument(fed, args, words):
    clock, rolling, feed = fed
    with pytest.raises(ApplicationError) as refused:
        feed.figures(**args)
    assert refused.value.error == uris.ERROR_INVALID_ARGUMENT
    assert words in refused.value.args[0]


def test_a_flood_of_news_and_reports_holds_the_memory_bound():
    """A node changing its figures 200 times a second and a router naming 50 new models each second:
    what the figures hold stops growing once the subjects' bound is reached."""
    import random
    import tracemalloc

    clock = Clock()
    clock.advance(START)
    rolling = Rolling(clock, bucket_s=10, buckets=360, subjects=100)
    feed = SeriesFeed(rolling)
    draw = random.Random(7)

    def flood(seconds: int, first: int) -> None:
        for second in range(first, first + seconds):
            for _ in range(200):
                card = GPU(0, memory_total_bytes=draw.choice([0, 10, 2**60]), memory_used_bytes=draw.randrange(0, 2**61),
                           utilization_pct=draw.choice([None, -5, 50, 100, 1000]))
                view = node(memory_available_bytes=draw.randrange(0, 2**61), gpus=[card])
                feed.event(EventKind.NODE, "node01", NodeEvent(NodeChange.HEARTBEAT, view))
            names = [f"m{second}-{i}" for i in range(50)]
            report = RouterLoad("r", models=[ModelLoad(n, queued=5) for n in names],
                                counts=[ModelCounts(n, 10, errors={"5xx": 1, "weird": 3}) for n in names])
            feed.load(report, "r", clock.seconds())
            clock.advance(1)

    tracemalloc.start()
    try:
        flood(60, 0)  # past the bound: every subject it will hold is allocated, and the first let go
        held = tracemalloc.get_traced_memory()[0]
        flood(120, 60)
        grown = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert len(rolling._subjects) == 100
    assert rolling.let_go > 0 and rolling.not_kept > 0
    # 100 subjects' rings are about a megabyte; twice the flood again adds less than 2 % of it.
    assert held > 500_000
    assert grown < 20_000, grown
