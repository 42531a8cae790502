"""The reconciler's elastic part: how many slots of a model run, when a drained one stops, and making room.

``llmgw.control.scaler`` decides the count, ``llmgw.control.demand`` sums
what the routers report, ``llmgw.control.evict`` picks what to stop for
room; this module reads the reconciler's slots and the fleet for them, so
the reconciler only asks "how many", "drained yet" and "room for this one".
"""

from __future__ import annotations

from typing import Callable, Mapping

from twisted.logger import Logger

from llmgw.control import evict, placement
from llmgw.control.catalog import Entry
from llmgw.control.demand import Demand
from llmgw.control.fleet import Fleet, ReportedShard
from llmgw.control.scaler import Scaler, _no_note
from llmgw.control.slot import Slot, SlotInput, SlotState, split_slot_id
from llmgw.history import JournalKind
from llmgw.states import SHARD_ALIVE
from llmgw.views import ColdStart

log = Logger()

#: Slot states whose replica is out of the routers' table.
WITHDRAWN = frozenset({SlotState.DRAINING, SlotState.STOPPING})
#: Slot states with nothing placed for them yet.
_UNPLACED = frozenset({SlotState.EMPTY, SlotState.SLEEPING, SlotState.BACKING_OFF, SlotState.HELD})


class Elastic:
    def __init__(self, demand: Demand | None = None, note: Callable[..., object] = _no_note):
        self.demand = demand if demand is not None else Demand()
        self.note = note
        self.scaler = Scaler(self.demand, note)
        # A replica being placed → the replicas drained to make room for it.
        self.room: dict[str, tuple[str, ...]] = {}

    def set_note(self, note: Callable[..., object]) -> None:
        """Where decisions are told in words (the journal)."""
        self.note = self.scaler.note = note

    def wanted(self, name: str, entry: Entry, observed: Mapping[str, list[ReportedShard]], slots: Mapping[str, Slot],
               fleet: Fleet, settled: bool, now: float) -> int:
        """How many of the model's slots run now."""
        scale = entry.model.scale
        if not scale.elastic:
            return entry.model.replicas
        ids = [f"{name}/{index}" for index in range(entry.model.replicas)]
        running = sum(1 for i in ids if any(s.status.state in SHARD_ALIVE and fleet.usable(s.node_id)
                                             for s in observed.get(i, ())))
        ready = sum(1 for i in ids if i in slots and slots[i].state is SlotState.READY)
        return self.scaler.wanted(name, scale, running, ready, settled, now)

    def drained(self, replica_id: str, slot: Slot, entry: Entry, now: float) -> bool:
        """Whether a draining replica may be stopped: no router has a request on it, or it waited long enough."""
        since = slot.drain_at if slot.drain_at is not None else now
        return self.demand.drained(replica_id, since) or now - since >= entry.model.scale.drain_timeout_s

    def cold_starts(self, catalog: Mapping[str, Entry]) -> dict[str, ColdStart]:
        """What the routers need to hold requests for the models that may have no replica."""
        out = {}
        for name, entry in catalog.items():
            scale = entry.model.scale
            if scale.elastic and scale.min == 0:
                out[name] = ColdStart(timeout_s=scale.cold_start_timeout_s, max_held=scale.max_held)
        return out

    def room_first(self, catalog: Mapping[str, Entry], slots: Mapping[str, Slot]) -> list[tuple[str, Entry]]:
        """*catalog*'s models, those with a replica not yet placed that others were stopped to make room for first.

        The room made for a replica is then its own: a model placed before it in
        catalog order cannot take the memory freed for it, leaving it to make room
        again (and its held requests to wait for one cold start after another).
        """
        # Room made for a replica since placed is its own now: forget it.
        self.room = {r: v for r, v in self.room.items() if r not in slots or slots[r].state in _UNPLACED}
        waiting = {split_slot_id(replica)[0] for replica in self.room}
        return sorted(catalog.items(), key=lambda item: item[0] not in waiting)

    def forget(self, names: set[str]) -> None:
        self.scaler.forget(names)
        self.room = {r: v for r, v in self.room.items() if split_slot_id(r)[0] in names}

    # -- making room --

    def make_room(self, replica_id: str, entry: Entry, request: placement.PlacementRequest,
                  nodes: placement.Snapshots, holds: frozenset[str], slots: dict[str, Slot], fleet: Fleet,
                  catalog: Mapping[str, Entry], now: float) -> str | None:
        """Words for a replica placement could not fit: the replicas being stopped for it, or why none can be.

        None when its model has no request waiting: room is made for demand only.
        """
        model = entry.model.name
        if not self.demand.model(model).waiting:
            return None
        pending = [v for v in self.room.get(replica_id, ()) if v in slots and slots[v].state in WITHDRAWN]
        if pending:
            return f"making room: waiting for {', '.join(pending)} to stop"
        priority = entry.model.scale.priority
        victims, words = evict.choose(request, list(nodes), holds, self._candidates(model, slots, fleet, catalog, now),
                                      priority)
        if not victims:
            self.room.pop(replica_id, None)
            return words
        for victim in victims:
            slot = slots[victim.replica]
            if slot.fire(SlotInput.DRAIN) is None:
                continue
            slot.drain_at, slot.drain_for = now, replica_id
            why = f"stopped {victim.replica} on {', '.join(victim.nodes)} to make room for {replica_id}: " \
                  f"{victim.words(priority)}"
            slot.explain(f"draining to make room for {replica_id}: {victim.words(priority)}")
            self.scaler.evicted(victim.model, now)
            log.info("{why}", why=why)
            self.note(JournalKind.EVICTED, victim.replica, why, model=victim.model, replica=victim.replica,
                      node=victim.nodes[0] if victim.nodes else None)
        self.room[replica_id] = tuple(v.replica for v in victims)
        return "making room: stopping " + "; ".join(f"{v.replica} on {', '.join(v.nodes)} ({v.words(priority)})"
                                                  for v in victims)

    def _candidates(self, model: str, slots: dict[str, Slot], fleet: Fleet, catalog: Mapping[str, Entry],
                    now: float) -> list[evict.Candidate]:
        observed = fleet.replicas()
        alive: dict[str, int] = {}
        for slot_id, slot in slots.items():
            if slot.state in (SlotState.READY, SlotState.RUNNING, SlotState.LAUNCHING):
                name = split_slot_id(slot_id)[0]
                alive[name] = alive.get(name, 0) + 1
        # A model gives back its highest ready slot: the one its count dropping by one drains.
        top: dict[str, int] = {}
        for slot_id, slot in slots.items():
            name, index = split_slot_id(slot_id)
            if slot.state is SlotState.READY and index is not None and index > top.get(name, -1):
                top[name] = index
        out = []
        for name, index in top.items():
            slot_id = f"{name}/{index}"
            entry = catalog.get(name)
            if name == model or entry is None:
                continue
            scale = entry.model.scale
            demand = self.demand.model(name)
            last = demand.last_request_at
            nodes = tuple(s.node_id for s in sorted(observed.get(slot_id, ()), key=lambda s: s.status.spec.rank))
            out.append(evict.Candidate(
                replica=slot_id, model=name, nodes=nodes, priority=scale.priority,
                idle_s=None if last is None else max(0.0, now - last),
                inflight=self.demand.inflight(slot_id), waiting=demand.waiting,
                spare=alive.get(name, 0) - scale.min,
            ))
        return out
