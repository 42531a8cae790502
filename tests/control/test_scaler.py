"""The scaler's count, second by second on a test clock: cold start, idleness, load with hysteresis, pins."""

import pytest

from llmgw.config.scale import Scale
from llmgw.control.demand import Demand
from llmgw.control.scaler import Scaler
from llmgw.history import JournalKind
from llmgw.traffic import ModelLoad, RouterLoad

POLICY = Scale(min=0, max=3, idle_s=60, target_inflight=4, up_after_s=10, down_after_s=30)


class Run:
    def __init__(self, policy=POLICY):
        self.policy = policy
        self.demand = Demand()
        self.notes = []
        self.scaler = Scaler(self.demand, lambda kind, subject, reason="", **where: self.notes.append((kind, reason)))
        self.now = 0.0
        self.running = self.ready = 0

    def traffic(self, inflight=0, queued=0, held=0, idle_s=0.0):
        self.demand.report(RouterLoad("r", [ModelLoad("qwen", inflight, queued, held, idle_s)]), "r", self.now)

    def step(self, seconds=1, settled=True):
        target = None
        for _ in range(seconds):
            self.now += 1
            target = self.scaler.wanted("qwen", self.policy, self.running, self.ready, settled, self.now)
        return target


def test_a_fixed_model_is_its_count_whatever_happens():
    run = Run(Scale(min=2, max=2))
    run.traffic(inflight=100)
    assert run.step(100) == 2 and run.notes == []


def test_before_the_fleet_settles_what_runs_is_kept_and_not_remembered():
    run = Run()
    run.running = 2
    assert run.step(settled=False) == 2
    run.running = 0
    assert run.step(settled=False) == 0
    assert run.scaler.target("qwen") is None


def test_a_request_held_for_a_sleeping_model_wakes_it_at_once():
    run = Run()
    assert run.step() == 0
    run.traffic(held=2)
    assert run.step() == 1
    assert run.notes == [(JournalKind.COLD_START, "0 → 1 replica(s): 2 request(s) waiting and no replica")]
    assert run.scaler.waking("qwen", run.now + 12) == "starting on demand: 2 request(s) waiting, 12 s"
    run.ready = 1
    run.step()
    assert run.scaler.waking("qwen", run.now) is None
    assert run.scaler.counts[("qwen", "cold start")] == 1


def test_an_idle_model_sleeps_after_idle_s_and_not_a_second_before():
    run = Run()
    run.traffic(held=1)
    run.step()
    run.traffic(idle_s=0.0)  # answered; nothing in flight
    assert run.step(59) == 1
    assert run.step() == 0
    kind, words = run.notes[-1]
    assert kind is JournalKind.SLEPT and "idle: no request for 60s" in words
    assert run.scaler.asleep("qwen", run.now + 840).startswith("idle: scaled to zero, last request 15m ago")


def test_a_request_in_flight_keeps_an_idle_timer_from_firing():
    run = Run()
    run.traffic(held=1)
    run.step()
    run.traffic(inflight=1, idle_s=100.0)  # one long stream, the last request long ago
    assert run.step(100) == 1


def test_load_above_the_target_for_up_after_s_adds_one_at_a_time_up_to_max():
    run = Run()
    run.traffic(held=1)
    run.step()
    run.traffic(inflight=20)
    # Seen above on the next pass, and above for up_after_s from then.
    assert run.step(10) == 1
    assert run.step() == 2
    assert run.step(9) == 2
    assert run.step() == 3
    assert run.step(60) == 3  # max
    assert [k for k, _ in run.notes].count(JournalKind.SCALED_UP) == 2


def test_a_dip_shorter_than_up_after_s_starts_the_wait_again():
    run = Run()
    run.traffic(held=1)
    run.step()
    run.traffic(inflight=20)
    run.step(9)
    run.traffic(inflight=1)
    run.step()
    run.traffic(inflight=20)
    assert run.step(10) == 1 and run.step() == 2


def test_load_below_the_target_with_one_fewer_removes_one_after_down_after_s_never_below_one():
    run = Run(Scale(min=0, max=3, idle_s=10_000, target_inflight=4, up_after_s=0, down_after_s=30))
    run.traffic(held=1)
    run.step()
    run.traffic(inflight=100)
    run.step(3)
    assert run.scaler.target("qwen") == 3
    run.traffic(inflight=8)  # 8 is not under 4 × 2: three stay
    assert run.step(100) == 3
    run.traffic(inflight=7)
    assert run.step(30) == 3 and run.step() == 2
    run.traffic(inflight=0)
    assert run.step(31) == 1
    assert run.step(300) == 1  # load alone never puts it to sleep: idleness does


def test_an_operator_pin_holds_within_bounds_until_unpinned():
    run = Run()
    assert run.scaler.pin("qwen", 2, POLICY, run.now) == 2
    run.traffic(idle_s=10_000)
    assert run.step(100) == 2
    assert run.scaler.asleep("qwen", run.now).startswith("pinned at 2 replica(s)")
    with pytest.raises(ValueError, match="between 0 and 3"):
        run.scaler.pin("qwen", 4, POLICY, run.now)
    run.scaler.unpin_all()
    assert run.step() == 0  # idle long since: back to its policy at once


def test_an_eviction_takes_one_off_the_count():
    run = Run()
    run.traffic(held=1)
    run.step()
    run.scaler.evicted("qwen", run.now)
    run.traffic(idle_s=0.0)
    assert run.step() == 0
    assert run.scaler.counts[("qwen", "evicted")] == 1
    assert "evicted to make room" in run.scaler.asleep("qwen", run.now)


def test_a_request_waiting_before_the_fleet_settles_is_told_why_it_waits():
    run = Run()
    run.traffic(held=2)
    assert run.step(settled=False) == 0
    assert run.scaler.asleep("qwen", run.now) == ("2 request(s) waiting: it starts once the fleet has settled after "
                                                  "the server's start (fleet.settle_s)")
    assert run.step() == 1


def test_a_cold_start_longer_than_idle_s_is_not_idle_time():
    run = Run()
    run.traffic(held=1, idle_s=0.0)
    run.step()  # woken
    run.traffic(idle_s=70.0)  # its request, answered at last, arrived 70 s ago: it waited for the start
    assert run.step(30) == 1  # not ready yet: waking
    run.ready = 1
    assert run.step(59) == 1  # ready: idle_s (60) counts from here
    assert run.step(2) == 0
