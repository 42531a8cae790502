"""A reconciler that keeps undoing its own start holds the slot back, growing, and says so once per step.

The world is test_reconciler's: a real Fleet, a test clock, fake commands.
What it adds is the failure this guards against: a second agent given
node01's state_dir (as node02) adopts node01's engine and reports it as its
own, a ready copy (under a grant of its own: see ``react``); the reconciler stops node01's fresh start as the
extra copy, which kills the one process both reported, and the empty slot
is started again the next tick.
"""

from __future__ import annotations

import attrs
import pytest
from twisted.logger import LogLevel, capturedLogs, formatEvent

from llmgw.control.reconciler import FLAP_WINDOW_S
from llmgw.records import IBAdapter, IBPort
from tests.control.test_reconciler import World, entry, inventory

SHARD = "echo/0/0"


class SharedStateDir:
    """node02 reports node01's engine whenever node01 runs one, and loses it when node01's is stopped."""

    def __init__(self, world: World):
        self.world = world
        self.adopting = True
        world.stop_reports_stopped = True
        self.start_times: list[float] = []

    def react(self) -> None:
        shards = self.world.fleet.shards
        mine, copy = ("node01", SHARD) in shards, ("node02", SHARD) in shards
        if mine and not copy and self.adopting:
            status = shards[("node01", SHARD)].status
            # The copy has a grant of its own, as a lost node's copy does: a
            # node may not report a shard it was never given.
            self.world.fleet.place("node02", status.spec)
            self.world.fleet.shard_status("node02", attrs.evolve(status, state="ready", since=status.since - 5))
        elif copy and not mine:
            status = shards[("node02", SHARD)].status
            self.world.fleet.shard_status("node02", attrs.evolve(status, state="stopped"))

    def run(self, seconds: int) -> None:
        """Tick once a second for *seconds*, the nodes answering after each tick."""
        for _ in range(seconds):
            before = len(self.world.starts)
            self.world.reconciler.tick()
            if len(self.world.starts) > before:
                self.start_times.append(self.world.clock.seconds())
            self.react()
            self.world.clock.advance(1)


@pytest.fixture
def shared():
    world = World()
    world.serve(entry())
    world.node("node01")
    world.node("node02", engines=())  # nothing is placed there; it only reports what it adopted
    return SharedStateDir(world)


def holding_lines(events) -> list[str]:
    return [formatEvent(e) for e in events if e["log_level"] == LogLevel.warn and "holding it back" in formatEvent(e)]


def held_for(lines: list[str]) -> list[str]:
    """The seconds each line says the slot is held back."""
    return [line.split("holding it back ")[1].split(" s ")[0] for line in lines]


def test_a_slot_whose_starts_keep_being_undone_is_held_back_longer_each_time_with_one_line_per_step(shared):
    with capturedLogs() as events:
        shared.run(80)
    # Once is let go (a lost node coming back looks the same); then 10, 20, 40 s between starts, each step
    # said once in the ticks that pass between.
    assert shared.start_times == [0, 2, 13, 34, 75]
    lines = holding_lines(events)
    assert len(lines) == 4, lines
    assert lines[0] == (
        "replica echo/0: stopping echo/0/0 on node01 1 s after starting the slot (its slot is already served by "
        "another copy), 2 starts in a row undone; holding it back 10 s before the next start (two agents on one "
        "state_dir do this: see docs/operations.rst 'Several agents on one host')"
    )
    assert held_for(lines) == ["10", "20", "40", "80"]


def test_a_held_back_slot_says_why_and_when_it_starts_again(shared):
    shared.run(5)
    view = shared.world.view("echo/0")
    assert (view["state"], view["reason"]) == (
        "pending",
        f"held back: 2 starts in a row stopped again within {FLAP_WINDOW_S:.0f} s (its slot is already served by "
        "another copy) (next start in 8 s)",
    )


def test_a_slot_ready_for_the_window_starts_again_without_holding_back(shared):
    shared.run(14)  # undone twice, held 10 s, started again at 13 and undone a third time
    assert shared.start_times == [0, 2, 13]
    shared.adopting = False  # the second agent is given its own state_dir
    shared.run(21)
    assert shared.start_times[-1] == 34
    shared.world.report(SHARD, "ready", node_id="node01")
    with capturedLogs() as events:
        shared.run(int(FLAP_WINDOW_S) + 1)
    assert any("its starts are no longer held back" in formatEvent(e) for e in events)
    # Undone again: counted from one, so let go once and then held 10 s, not 80.
    shared.adopting = True
    shared.world.fleet.shard_status("node01", attrs.evolve(shared.world.shard(SHARD, "node01").status,
                                                           state="stopped"))
    with capturedLogs() as events:
        shared.run(4)
    first, second = shared.start_times[-2:]
    assert second - first == 2, shared.start_times
    assert held_for(holding_lines(events)) == ["10"]


def test_a_replica_whose_rank_keeps_failing_keeps_the_failure_backoff_and_is_never_held_back():
    world = World()
    world.stop_reports_stopped = True
    two = entry()
    two = attrs.evolve(two, profile=attrs.evolve(two.profile, ranks=2))
    world.serve(two)
    for node in ("node01", "node02"):
        fabric = [IBAdapter("mlx5_0", ports=[IBPort(port=1, state="ACTIVE", rate_gbps=200.0)], fabric="ib0")]
        world.fleet.register(node, 1, attrs.evolve(inventory(node), infiniband=fabric))
    starts = []
    with capturedLogs() as events:
        for _ in range(24):
            before = len(world.starts)
            world.reconciler.tick()
            for _, spec in world.starts[before:]:
                if spec.rank == 0:
                    # Rank 0's rendezvous opens at once: rank 1 is started the next tick.
                    starts.append(world.clock.seconds())
                    world.report("echo/0/0", "starting", rendezvous="10.0.0.1:29500")
                else:
                    # Rank 1 fails as soon as it starts; rank 0 is stopped with it, a moment after its start.
                    world.report("echo/0/1", "failed", reason="exited with code 1")
            world.clock.advance(0.5)
    assert len(world.starts) // 2 == len(starts)
    # 1, 2, 4 s, each counted from the tick that saw the failure, a tick after rank 1 started, a tick after rank 0.
    assert [b - a for a, b in zip(starts, starts[1:])] == [2.0, 3.0, 5.0]
    assert holding_lines(events) == []
