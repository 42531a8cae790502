"""A slot's starts undone: counted once per start, held back from the second, let go once steady."""

from llmgw.control.slot import Slot
from llmgw.control.undone import FLAP_BACKOFF_START_S, FLAP_WINDOW_S, steady, undone
from llmgw.records import ShardSpec, ShardStatus
from llmgw.control.fleet import ReportedShard


def shard():
    spec = ShardSpec(shard_id="echo/0/0", replica_id="echo/0", model="echo", engine="sim")
    return ReportedShard("node01", ShardStatus(spec, "ready"))


def test_the_second_undone_start_holds_the_slot_back_and_a_steady_one_lets_go():
    slot = Slot(started_at=100.0)
    undone(slot, shard(), 110.0, "a copy elsewhere")
    assert slot.undone == 1 and slot.held_until is None
    slot.started_at = 120.0
    undone(slot, shard(), 125.0, "a copy elsewhere")
    assert slot.undone == 2 and slot.held_until == 125.0 + FLAP_BACKOFF_START_S
    assert "2 starts in a row" in slot.held_reason
    steady("echo/0", slot, 125.0 + FLAP_WINDOW_S)
    assert (slot.undone, slot.held_until) == (0, None)


def test_a_stop_long_after_the_start_is_not_the_reconciler_undoing_itself():
    slot = Slot(started_at=100.0)
    undone(slot, shard(), 100.0 + FLAP_WINDOW_S, "scaled down")
    assert slot.undone == 0
    undone(None, shard(), 0.0, "no slot")  # a shard of no slot: nothing to count
