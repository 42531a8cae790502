"""A slot whose fresh starts the reconciler keeps stopping again: counted, and held back when it repeats.

A stop within ``FLAP_WINDOW_S`` of the slot's start, a second time and
more, holds the slot back before its next start (10 s, doubling to 5 min;
reset once it has been ready ``FLAP_WINDOW_S``): two agents on one
state_dir, or a node that keeps reporting a second copy, otherwise make it
start and stop every tick.
"""

from __future__ import annotations

from twisted.logger import Logger

from llmgw.control.fleet import ReportedShard
from llmgw.control.slot import Slot

log = Logger()

BACKOFF_MAX_S = 300.0
FLAP_WINDOW_S = 60.0
FLAP_BACKOFF_START_S = 10.0


def steady(replica_id: str, slot: Slot, now: float) -> None:
    """A ready slot whose last start outlived FLAP_WINDOW_S is no longer being undone."""
    if slot.undone_at is None:
        return
    last = max(slot.undone_at, slot.started_at or slot.undone_at)
    if now - last < FLAP_WINDOW_S:
        return
    if slot.held_until is not None:
        log.info("replica {id} is ready and was left alone {s:.0f} s: its starts are no longer held back",
                 id=replica_id, s=now - last)
    slot.undone, slot.undone_at, slot.held_until, slot.held_reason = 0, None, None, None

def undone(slot: Slot | None, shard: ReportedShard, now: float, why: str) -> None:
    """A stop in a slot this reconciler started moments ago: count it, and hold the slot back when it repeats."""
    replica_id = shard.status.spec.replica_id
    if slot is None or slot.started_at is None or now - slot.started_at >= FLAP_WINDOW_S:
        return
    age = now - slot.started_at
    # One count per start, however many of its shards (or copies) are stopped.
    slot.started_at, slot.undone, slot.undone_at = None, slot.undone + 1, now
    if slot.undone < 2:
        return  # once is what a lost node coming back with its copy looks like: nothing to hold back
    delay = min(BACKOFF_MAX_S, FLAP_BACKOFF_START_S * 2 ** (slot.undone - 2))
    slot.held_until = now + delay
    slot.held_reason = f"held back: {slot.undone} starts in a row stopped again within {FLAP_WINDOW_S:.0f} s ({why})"
    log.warn("replica {id}: stopping {shard} on {node} {age:.0f} s after starting the slot ({why}), "
             "{n} starts in a row undone; holding it back {delay:.0f} s before the next start "
             "(two agents on one state_dir do this: see docs/operations.rst 'Several agents on one host')",
             id=replica_id, shard=shard.id, node=shard.node_id, age=age, why=why, n=slot.undone, delay=delay)
