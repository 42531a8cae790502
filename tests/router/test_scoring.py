"""Scoring: which endpoint takes a request under each ``router.scoring`` policy.

Loads are set explicitly on the endpoints (``inflight``, the engine figures)
so each test states the situation it judges.
"""

from __future__ import annotations

import collections
import math

import pytest
from twisted.internet.task import Clock

from llmgw.config.routing import Admission, RouterSettings
from llmgw.router.dispatch import Dispatcher, RequestInfo
from llmgw.router.scoring import (
    AFFINITY_HIT,
    AFFINITY_SPILL,
    ENGINE_LOAD,
    LEAST_OUTSTANDING,
    Endpoint,
    EngineLoad,
    LeastOutstanding,
    PrefixAffinity,
    Ring,
    make_policy,
)
from llmgw.views import EndpointEntry

LONG = "You are a careful assistant. Answer in French. " * 10  # 470 characters


def endpoints(n, model="m", **loads):
    eps = [Endpoint(f"{model}/{i}", model, "127.0.0.1", 8000 + i) for i in range(n)]
    for name, values in loads.items():
        for e, v in zip(eps, values):
            setattr(e, name, v)
    return eps


class Recorder:
    def __init__(self):
        self.decisions = collections.Counter()

    def scored(self, model, decision):
        self.decisions[(model, decision)] += 1


def take(d, model="echo", prefix=""):
    box = []
    d.admit(model, RequestInfo(prefix=prefix)).addBoth(box.append)
    return box[0]


# -- least outstanding --------------------------------------------------------------


def test_least_outstanding_picks_the_endpoint_with_fewest_in_flight():
    eps = endpoints(3, inflight=[4, 1, 2])
    assert LeastOutstanding().pick("m", eps, eps, "")[0].id == "m/1"


def test_least_outstanding_takes_turns_among_ties_instead_of_always_the_first():
    policy = LeastOutstanding()
    eps = endpoints(3, inflight=[0, 0, 5])
    chosen = [policy.pick("m", eps, eps, "")[0].id for _ in range(4)]
    assert chosen == ["m/0", "m/1", "m/0", "m/1"]


def test_idle_endpoints_share_sequential_requests_through_the_dispatcher():
    clock = Clock()
    metrics = Recorder()
    d = Dispatcher(clock, RouterSettings(), metrics)
    d.set_endpoints([EndpointEntry(f"echo/{i}", "echo", f"http://127.0.0.1:{8001 + i}") for i in range(3)])
    used = collections.Counter()
    for _ in range(9):
        lease = take(d)
        used[lease.endpoint.id] += 1
        lease.release("ok")
    assert used == {"echo/0": 3, "echo/1": 3, "echo/2": 3}
    assert metrics.decisions == {("echo", LEAST_OUTSTANDING): 9}


# -- prefix affinity ------------------------------------------------------------------


def test_repeated_long_prefixes_land_on_one_endpoint_while_it_is_under_its_bound():
    policy = PrefixAffinity()
    eps = endpoints(4, inflight=[3, 3, 3, 3])
    first, decision = policy.pick("m", eps, eps, LONG + "question one")
    assert decision == AFFINITY_HIT
    for question in ("question two", "a third, longer question"):
        # Only the first 256 characters count, so what follows the shared prefix does not move it.
        assert policy.pick("m", eps, eps, LONG + question) == (first, AFFINITY_HIT)


def test_a_prefix_spills_to_the_next_endpoint_when_its_home_is_over_the_bound():
    policy = PrefixAffinity(load_factor=1.25)
    eps = endpoints(4, inflight=[2, 2, 2, 2])
    home, _ = policy.pick("m", eps, eps, LONG)
    # Bound with this request: ceil(1.25 × (total + 1) / 4).  Load the home
    # until one more request would pass it.
    home.inflight = 5
    total = sum(e.inflight for e in eps) + 1
    assert home.inflight + 1 > math.ceil(1.25 * total / 4)
    spilled, decision = policy.pick("m", eps, eps, LONG)
    assert decision == AFFINITY_SPILL and spilled is not home
    # The spill goes to the home's successor on the ring, the same each time,
    # so the prefix warms one more cache rather than all of them.
    assert policy.pick("m", eps, eps, LONG)[0] is spilled
    home.inflight = 3
    assert policy.pick("m", eps, eps, LONG) == (home, AFFINITY_HIT)


def test_affinity_through_the_dispatcher_hits_then_spills_under_load():
    clock = Clock()
    metrics = Recorder()
    d = Dispatcher(clock, RouterSettings(admission=Admission(16, 10, 30.0), scoring="prefix-affinity"), metrics)
    d.set_endpoints([EndpointEntry(f"echo/{i}", "echo", f"http://127.0.0.1:{8001 + i}") for i in range(3)])
    leases = [take(d, prefix=LONG) for _ in range(6)]
    homes = collections.Counter(lease.endpoint.id for lease in leases)
    # Three endpoints, six requests all sharing one prefix: the home takes as
    # many as its bound allows (ceil(1.25 × n / 3) with n counting the new one),
    # the rest spill.
    assert homes.most_common(1)[0][1] == 3
    assert metrics.decisions[("echo", AFFINITY_HIT)] == 3
    assert metrics.decisions[("echo", AFFINITY_SPILL)] == 3
    for lease in leases:
        lease.release("ok")
    again = take(d, prefix=LONG)
    assert again.endpoint.id == homes.most_common(1)[0][0]


def test_a_request_without_prefix_goes_least_outstanding():
    policy = PrefixAffinity()
    eps = endpoints(3, inflight=[2, 0, 1])
    assert policy.pick("m", eps, eps, "") == (eps[1], LEAST_OUTSTANDING)


def test_a_failing_home_sends_its_prefixes_to_the_next_on_the_ring_and_back():
    policy = PrefixAffinity()
    eps = endpoints(4)
    home, _ = policy.pick("m", eps, eps, LONG)
    others = [e for e in eps if e is not home]
    # Not a candidate (unhealthy, full or already tried): still on the ring.
    stand_in, decision = policy.pick("m", eps, others, LONG)
    assert decision == AFFINITY_SPILL
    assert policy.pick("m", eps, others, LONG)[0] is stand_in
    assert policy.pick("m", eps, eps, LONG) == (home, AFFINITY_HIT)


def test_adding_an_endpoint_moves_only_the_keys_it_takes():
    before = Ring([f"m/{i}" for i in range(4)])
    after = Ring([f"m/{i}" for i in range(5)])
    keys = [f"prompt prefix number {i}" for i in range(2000)]
    moved = 0
    for key in keys:
        old, new = next(before.walk(key)), next(after.walk(key))
        if old != new:
            moved += 1
            assert new == "m/4"  # a key only ever moves to the newcomer
    # A fair share for the fifth is 1/5 of the keys; plain modulo hashing would move 4/5.
    assert 0.1 < moved / len(keys) < 0.3


def test_the_ring_spreads_keys_over_its_endpoints():
    ring = Ring([f"m/{i}" for i in range(4)])
    homes = collections.Counter(next(ring.walk(f"k{i}")) for i in range(4000))
    assert len(homes) == 4 and min(homes.values()) > 4000 / 4 * 0.6


def test_the_ring_walk_visits_every_endpoint_once():
    ring = Ring(["a", "b", "c"])
    assert sorted(ring.walk("anything")) == ["a", "b", "c"]


def test_prefix_affinity_options_are_checked():
    with pytest.raises(ValueError, match="load_factor"):
        PrefixAffinity(load_factor=0.9)
    with pytest.raises(ValueError, match="prefix_chars"):
        PrefixAffinity(prefix_chars=0)


def test_the_dispatcher_passes_prefix_options_on():
    d = Dispatcher(Clock(), RouterSettings(scoring="prefix-affinity"), prefix_chars=8)
    d.set_endpoints([EndpointEntry(f"echo/{i}", "echo", f"http://127.0.0.1:{8001 + i}") for i in range(8)])
    homes = set()
    for tail in ("x", "yy", "a different tail"):
        lease = take(d, prefix="12345678" + tail)
        homes.add(lease.endpoint.id)
        lease.release("ok")
    assert len(homes) == 1


# -- engine load ------------------------------------------------------------------------


def test_engine_load_prefers_fewest_waiting_then_running_then_kv_usage():
    policy = EngineLoad()
    eps = endpoints(3, engine_waiting=[2, 0, 0], engine_running=[0, 5, 3], kv_usage=[0.1, 0.2, 0.9])
    assert policy.pick("m", eps, eps, "") == (eps[2], ENGINE_LOAD)
    eps[2].engine_running = 5
    assert policy.pick("m", eps, eps, "") == (eps[1], ENGINE_LOAD)


def test_engine_load_treats_an_unreported_figure_as_unknown_not_idle():
    policy = EngineLoad()
    # m/0 says nothing; read as zero it would look idlest.  With no figure
    # every candidate reports, the router's own count decides.
    eps = endpoints(2, inflight=[3, 1], engine_waiting=[None, 4], engine_running=[None, 8], kv_usage=[None, 0.7])
    assert policy.pick("m", eps, eps, "") == (eps[1], LEAST_OUTSTANDING)


def test_engine_load_compares_only_the_figures_every_candidate_reports():
    policy = EngineLoad()
    # llama.cpp without a KV gauge beside vLLM with one: kv_usage is skipped.
    eps = endpoints(2, engine_waiting=[0, 0], engine_running=[1, 2], kv_usage=[None, 0.0])
    assert policy.pick("m", eps, eps, "") == (eps[0], ENGINE_LOAD)


def test_engine_load_counts_requests_sent_since_the_last_report():
    policy = EngineLoad()
    eps = endpoints(2, engine_waiting=[0, 0], engine_running=[1, 2], kv_usage=[0.1, 0.1])
    for e in eps:
        e.engine_inflight_at_report = 0
    # Two requests went to m/0 since the poll: it now runs about 3.
    eps[0].inflight = 2
    assert policy.pick("m", eps, eps, "")[0] is eps[1]


def test_engine_load_takes_turns_when_engines_report_the_same():
    policy = EngineLoad()
    eps = endpoints(2, engine_waiting=[0, 0], engine_running=[0, 0], kv_usage=[0.0, 0.0])
    assert [policy.pick("m", eps, eps, "")[0].id for _ in range(4)] == ["m/0", "m/1", "m/0", "m/1"]


def test_make_policy_knows_the_three_names():
    assert isinstance(make_policy("least-outstanding"), LeastOutstanding)
    assert isinstance(make_policy("prefix-affinity"), PrefixAffinity)
    assert isinstance(make_policy("engine-load"), EngineLoad)
    with pytest.raises(ValueError, match="least-outstanding"):
        make_policy("random")
