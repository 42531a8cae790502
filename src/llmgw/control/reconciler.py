"""The reconciler: converge what the fleet runs to what the catalog asks for.

Each model has ``replicas`` slots, ``<model>/0`` … ``<model>/N-1``; a slot
holds at most one replica, whose shards are ``<slot>/<rank>``.  Slot names
make a restarted control plane's job simple: what the agents report fills
slots, and only empty slots are placed — nothing is started twice.  Each
slot's state and its table are ``llmgw.control.slot``'s; this module reads
the fleet and the catalog, feeds each slot its inputs, and acts by state.

Each ``tick``:
- shards of a model that left the catalog, or of a slot above ``replicas``,
  are stopped;
- a replica with a failed shard is stopped whole and retried after a backoff
  (1 s, doubling to 5 min; reset once it is ready) — this is also how a
  crashed engine is restarted;
- a multi-node replica is started in order (``llmgw.control.startup``):
  every rank placed, rank 0 started, the others once rank 0 reports its
  rendezvous; one that loses a rank (failed, stopped, or on a lost node) is
  failed whole, and placed again after the backoff, on the same nodes when
  they can still take it;
- shards on a ``lost`` node count as gone and their slot is placed again
  (an ``unreachable`` node's engines are left alone: its agent may be
  restarting while they keep serving);
- an empty slot is placed once the fleet has settled (``llmgw.control.settle``);
- an elastic model (``replicas: {min, max}``) runs the count
  ``llmgw.control.elastic`` wants: the slots above it are drained (out of
  the routers' table until no request is left on them), stopped, and sleep;
- a slot whose fresh start the reconciler itself stops again is held back
  before its next start (``llmgw.control.undone``).
"""

from __future__ import annotations

from typing import Awaitable, Callable, Collection

import attrs
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.control import occupancy, placement, relay, replicaview, undone, weights
from llmgw.control.catalog import Entry
from llmgw.control.elastic import WITHDRAWN, Elastic
from llmgw.control.fleet import Fleet, ReportedShard
from llmgw.control.settle import Settle
from llmgw.control.slot import Slot, SlotDesire, SlotInput, SlotState, split_slot_id
from llmgw.control.startup import Startup, not_whole
from llmgw.control.undone import BACKOFF_MAX_S, FLAP_WINDOW_S  # noqa: F401  (tests read FLAP_WINDOW_S here)
from llmgw.history import JournalKind
from llmgw.records import ShardSpec
from llmgw.states import SHARD_ALIVE, ShardState
from llmgw.views import ModelStatus, ReplicaView

log = Logger()

BACKOFF_START_S = 1.0
RESTOP_AFTER_S = 30.0


class Reconciler:
    def __init__(
        self,
        clock,
        fleet: Fleet,
        catalog: Callable[[], dict[str, Entry]],
        start_shard: Callable[[str, ShardSpec], Awaitable],
        stop_shard: Callable[[str, str], Awaitable],
        settle_s: float = 0.0,
        settle_quiet_s: float = 0.0,
        settle_max_s: float | None = None,
        elastic: Elastic | None = None,
    ):
        self._clock = clock
        self.elastic = elastic if elastic is not None else Elastic()
        self._settle = Settle(fleet, clock.seconds(), settle_s, settle_quiet_s, settle_max_s)
        self.fleet = fleet
        self._catalog = catalog
        self._start = start_shard
        self._stop = stop_shard
        self.slots: dict[str, Slot] = {}
        self.wants: dict[str, int] = {}  # each model's count at the last pass (an elastic one's moves)
        self._stopping: dict[tuple[str, str], float] = {}  # (node, shard id) -> when stop was asked
        # Placements whose starts are in flight: not yet in the fleet, but
        # their GPUs and their spread must count for the next placement.
        self._inflight: dict[str, tuple[str, placement.Placement]] = {}
        self._snapshots: placement.Snapshots | None = None

    def restart_settle(self, now: float, expected: Collection[str] = ()) -> Settle:
        """Place nothing until the fleet is back again, from *now* (a new leader), and *expected*'s nodes with it."""
        self._settle = self._settle.again(now, expected)
        return self._settle

    # -- one pass --

    def tick(self) -> None:
        self._snapshots = None
        now = self._clock.seconds()
        self.elastic.demand.expire(now)
        # A stop asked of a shard that has since gone is done; a new shard with
        # the same id must be stoppable at once.
        present = {(s.node_id, s.id) for s in self.fleet.shards.values()}
        self._stopping = {k: t for k, t in self._stopping.items() if k in present}
        catalog = self._catalog()
        observed = self.fleet.replicas()
        for replica_id, shards in observed.items():
            model, slot = split_slot_id(replica_id)
            entry = catalog.get(model)
            if entry is None:
                self._stop_all(shards, now, "its model left the catalog", undoing=False)
            elif slot is None or slot >= entry.model.replicas:
                self._stop_all(shards, now, "the model was scaled down", undoing=False)
        settled = self._settle.waiting(now) is None
        self.wants = wants = {}
        for name, entry in self.elastic.room_first(catalog, self.slots):
            wants[name] = want = self.elastic.wanted(name, entry, observed, self.slots, self.fleet, settled, now)
            for index in range(entry.model.replicas):
                shards = self._one_per_rank(observed.get(f"{name}/{index}", []), now)
                if index < want:
                    self._converge_slot(f"{name}/{index}", entry, shards, now)
                else:
                    self._wind_down(f"{name}/{index}", entry, shards, now)
        for slot_id, slot in self.slots.items():
            model, index = split_slot_id(slot_id)
            wanted = model in catalog and index is not None and index < wants[model]
            slot.desired = SlotDesire.RUN if wanted else SlotDesire.RELEASE
            if slot.desired is SlotDesire.RELEASE and slot.state is not SlotState.LAUNCHING:
                # Scaled down or gone: the ranks it was holding room for are not started.
                self._drop_startup(slot_id, slot)
        for slot_id in [s for s in self.slots if split_slot_id(s)[0] not in catalog]:
            del self.slots[slot_id]
        self.elastic.forget(set(catalog))

    def _converge_slot(self, replica_id: str, entry: Entry, shards: list[ReportedShard], now: float) -> None:
        slot = self.slots.setdefault(replica_id, Slot())
        if slot.state is SlotState.LAUNCHING:
            return
        if slot.fire(SlotInput.WAKE) is SlotState.RUNNING:
            slot.drain_at = slot.drain_for = None  # wanted again while draining: back in the table
        live = [s for s in shards if s.status.state in SHARD_ALIVE and self.fleet.usable(s.node_id)]
        failed = [s for s in shards if s.status.state == ShardState.FAILED]
        for shard in failed:
            # Once per grant: the node's own "since" is not the control plane's to trust.
            key = (shard.node_id, shard.id, shard.order)
            if key not in slot.counted:
                slot.counted.add(key)
                self._failed(slot, replica_id, f"{shard.node_id}: {shard.status.reason or 'failed'}", now)
        if failed and live:
            # One failed rank makes the whole replica useless.
            slot.fire(SlotInput.FAILED)
        if live and slot.state is SlotState.BROKEN:
            # What is left of it is stopped (vLLM's headless ranks outlive their rank 0).  The
            # failure's own backoff holds the slot; this stop is not a start undone.
            self._drop_startup(replica_id, slot)
            why = "another rank of its replica failed" if failed else "its replica failed"
            self._stop_all(live, now, why, undoing=False)
            return
        slot.fire(SlotInput.SEEN if live else SlotInput.GONE)
        if live and max(s.status.spec.ranks for s in live) > 1:
            self._converge_ranks(replica_id, slot, shards, live, now)
            return
        if live:
            self._ready(replica_id, slot, now) if _all_ready(live) else slot.fire(SlotInput.NOT_READY)
            return
        # Nothing of the replica is left: whatever was failing it is over.
        self._drop_startup(replica_id, slot)
        if slot.state is SlotState.BACKING_OFF:
            if slot.retry_at is not None and now < slot.retry_at:
                return
            slot.fire(SlotInput.RETRY_DUE)
        if slot.held_until is not None and now < slot.held_until:
            slot.fire(SlotInput.HOLD)
            slot.explain(slot.held_reason)
            return
        slot.fire(SlotInput.HOLD_OVER)
        waiting = self._settle.waiting(now)
        if waiting is not None:
            slot.explain(waiting)
            return
        self._launch(replica_id, entry, slot, now)

    def _wind_down(self, replica_id: str, entry: Entry, shards: list[ReportedShard], now: float) -> None:
        """A slot above the elastic count: drain what runs in it, stop it once drained, then let it sleep."""
        slot = self.slots.setdefault(replica_id, Slot())
        if slot.state is SlotState.LAUNCHING:
            return  # its start answers first; the next pass drains it
        live = [s for s in shards if s.status.state in SHARD_ALIVE and self.fleet.usable(s.node_id)]
        for shard in shards:
            if shard.status.state == ShardState.FAILED:
                self.fleet.forget_shard(shard.node_id, shard.id)  # not wanted: nothing to retry
        if not live:
            self._drop_startup(replica_id, slot)
            slot.fire(SlotInput.GONE)
            slot.fire(SlotInput.SLEEP)
            if slot.state is SlotState.SLEEPING:
                slot.drain_at = slot.drain_for = None
                slot.failures, slot.retry_at = 0, None
                slot.explain(self.elastic.scaler.asleep(entry.model.name, now))
            return
        if slot.state is SlotState.BROKEN:
            self._stop_all(live, now, "its replica failed", undoing=False)
            return
        slot.fire(SlotInput.SEEN)
        self._drop_startup(replica_id, slot)
        if slot.fire(SlotInput.DRAIN) is not None:
            slot.drain_at = now
            slot.explain(f"draining: {self.elastic.scaler.asleep(entry.model.name, now)}")
            log.info("replica {id}: draining, then stopping: {why}", id=replica_id, why=slot.reason)
        if slot.state is SlotState.DRAINING and self.elastic.drained(replica_id, slot, entry, now):
            slot.fire(SlotInput.DRAINED)
        if slot.state is SlotState.STOPPING:
            self._stop_all(live, now, "scaled down: " + (slot.reason or "drained"), undoing=False)

    def withdrawn(self) -> set[str]:
        """Replicas being drained: out of the routers' table though their shards are ready."""
        return {slot_id for slot_id, slot in self.slots.items() if slot.state in WITHDRAWN}

    def _ready(self, replica_id: str, slot: Slot, now: float) -> None:
        """Every rank is ready: the failures are over, and a slot ready long enough is no longer held back."""
        slot.failures, slot.retry_at = 0, None
        slot.explain(None)
        slot.startup = None
        if slot.fire(SlotInput.ALL_READY) is not None and slot.started_at is not None:
            self._note(JournalKind.READY, replica_id, f"ready {now - slot.started_at:.0f} s after it was placed")
        undone.steady(replica_id, slot, now)

    def _converge_ranks(self, replica_id: str, slot: Slot, shards: list[ReportedShard],
                        live: list[ReportedShard], now: float) -> None:
        """A multi-node replica: start its other ranks once rank 0 is ready for them, or fail it whole.

        Whole is rank 0 alone while the others wait for its rendezvous, and
        every rank after that.  A replica that is not whole — a rank failed
        (above), stopped, on a lost node, or reported before it was started —
        is failed: every rank it has left is stopped (vLLM's headless ranks
        outlive their rank 0), and the slot is placed again after the backoff.
        """
        ranks = max(s.status.spec.ranks for s in live)
        by_rank = {s.status.spec.rank: s for s in live}
        startup = slot.startup
        expected = {0} if startup is not None and not startup.workers_started else set(range(ranks))
        early = [s for rank, s in by_rank.items() if rank not in expected]
        if early:
            # A copy from before (its node was lost, and is back): this start
            # has not started that rank, and will start it once, itself.
            ranks_words = ", ".join(str(s.status.spec.rank) for s in early)
            self._stop_all(early, now, f"its replica is starting again, and rank {ranks_words} is not started yet",
                           undoing=False)
            live = [s for s in live if s not in early]
            by_rank = {rank: s for rank, s in by_rank.items() if rank in expected}
        if set(by_rank) != expected:
            if startup is None and self._settle.waiting(now) is not None:
                # A restarted control plane: the other ranks' nodes may not have registered yet.
                slot.explain(f"waiting {max(0.0, self._settle.settled_at - now):.0f} s for the fleet to report its other "
                             "ranks (fleet.settle_s)")
                return
            why = not_whole(shards, by_rank, expected, self.fleet.usable)
            # The ranks on lost nodes go with it: should such a node come back
            # with its rank still running, that copy is a new claim, refused
            # while the replica's new start holds the rank, stopped before it.
            for shard in shards:
                if not self.fleet.usable(shard.node_id):
                    self.fleet.forget_shard(shard.node_id, shard.id)
            self._break(replica_id, slot, live, why, now)
            return
        overdue = startup.overdue(by_rank, now) if startup is not None else None
        if overdue is not None:
            self._break(replica_id, slot, live, overdue, now)
            return
        if startup is not None and not startup.workers_started:
            rendezvous = by_rank[0].status.rendezvous
            if rendezvous is not None:
                self._start_workers(replica_id, slot, startup, rendezvous, now)
            return
        self._ready(replica_id, slot, now) if _all_ready(live) else slot.fire(SlotInput.NOT_READY)

    def _break(self, replica_id: str, slot: Slot, live: list[ReportedShard], why: str, now: float) -> None:
        self._failed(slot, replica_id, why, now)
        self._drop_startup(replica_id, slot)
        self._stop_all(live, now, f"its replica failed: {why}", undoing=False)

    def _drop_startup(self, replica_id: str, slot: Slot) -> None:
        """The slot starts nothing more: the ranks it held room for are let go."""
        if slot.startup is not None:
            slot.startup = None
            self._inflight.pop(replica_id, None)

    def _one_per_rank(self, shards: list[ReportedShard], now: float) -> list[ReportedShard]:
        """Keep one live shard per rank; stop the rest.

        Two can exist when a lost node comes back after its slot was placed
        elsewhere.  The ready one wins, then the one the control plane placed
        or accepted first (its grant's order): never the node's own "since".
        """
        by_rank: dict[int, list[ReportedShard]] = {}
        for shard in shards:
            if shard.status.state in SHARD_ALIVE and self.fleet.usable(shard.node_id):
                by_rank.setdefault(shard.status.spec.rank, []).append(shard)
        extra = []
        for same in by_rank.values():
            same.sort(key=lambda s: (s.status.state != ShardState.READY, s.order, s.node_id))
            extra.extend(same[1:])
        if extra:
            self._stop_all(extra, now, "its slot is already served by another copy")
        return [s for s in shards if s not in extra]

    def _failed(self, slot: Slot, replica_id: str, why: str, now: float,
                event: SlotInput = SlotInput.FAILED) -> None:
        slot.fire(event)
        slot.failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (slot.failures - 1))
        slot.retry_at = now + delay
        slot.explain(f"failed: {why} (attempt {slot.failures})", failed=True)
        log.warn("replica {id} {reason}; next try in {delay:.0f} s", id=replica_id, reason=slot.reason, delay=delay)
        self._note(JournalKind.FAILED, replica_id, f"{slot.reason}; next try in {delay:.0f} s")

    def _note(self, kind: JournalKind, replica_id: str, words: str, node: str | None = None) -> None:
        """Tell the journal (``Elastic.note``) of a decision, in words."""
        self.elastic.note(kind, replica_id, words, model=split_slot_id(replica_id)[0], replica=replica_id, node=node)

    def _stop_all(self, shards: list[ReportedShard], now: float, why: str, *, undoing: bool = True) -> None:
        for shard in shards:
            if shard.status.state == ShardState.FAILED:
                self.fleet.forget_shard(shard.node_id, shard.id)
                continue
            asked = self._stopping.get((shard.node_id, shard.id))
            if asked is not None and now - asked < RESTOP_AFTER_S:
                continue
            self._stopping[(shard.node_id, shard.id)] = now
            if undoing:
                undone.undone(self.slots.get(shard.status.spec.replica_id), shard, now, why)
            log.info("stopping {id} on {node}: {why}", id=shard.id, node=shard.node_id, why=why)
            self._note(JournalKind.STOPPED, shard.status.spec.replica_id, f"{shard.id} on {shard.node_id}: {why}",
                       shard.node_id)
            d = defer.ensureDeferred(self._stop(shard.node_id, shard.id))
            d.addErrback(lambda f, s=shard: log.warn("stopping {id} on {node} failed: {e}",
                                                     id=s.id, node=s.node_id, e=f.getErrorMessage()))

    # -- placing and starting --

    def snapshots(self) -> placement.Snapshots:
        """The fleet as placement sees it, with in-flight starts counted once.

        A node may report a shard before its start is answered; that rank is
        then counted from the fleet, and not again as in flight.
        """
        nodes = placement.Snapshots(occupancy.fleet_snapshots(self.fleet, self._catalog()))
        reported = {(node.id, r.replica) for node in nodes for r in node.reserved}
        for replica_id, (model, chosen) in self._inflight.items():
            unreported = [r for r in chosen.ranks if (r.node_id, replica_id) not in reported]
            nodes = attrs.evolve(chosen, ranks=unreported).apply_to(nodes, model, replica_id)
        return nodes

    def _launch(self, replica_id: str, entry: Entry, slot: Slot, now: float) -> None:
        request = attrs.evolve(
            placement.PlacementRequest.from_profile(entry.model.name, entry.profile, entry.engine_version),
            disk_gb=entry.model.disk_gb,
        )
        if self._snapshots is None:
            self._snapshots = self.snapshots()
        # Holding the weights is a preference and lifts the disk check; it is never a filter.
        # The flags are this model's until the next launch sets them for its own.
        holds = weights.holders(self.fleet, entry.model.source, entry.model.files)
        self._snapshots = nodes = self._snapshots.holding_weights(holds)
        chosen = self._place(request, nodes, holds, slot)
        if isinstance(chosen, placement.Unplaceable):
            room = self.elastic.make_room(replica_id, entry, request, nodes, holds, self.slots, self.fleet,
                                          self._catalog(), now)
            reason = chosen.summary() if room is None else f"{room} ({chosen.summary()})"
            if slot.reason != reason and not slot.failed:
                log.info("replica {id} cannot be placed: {reason}", id=replica_id, reason=reason)
                self._note(JournalKind.UNPLACEABLE, replica_id, reason)
            slot.explain(reason)
            return
        ranks = len(chosen.ranks)
        # A failed attempt's shards are done with: their grants end, and a copy
        # on another node can no longer count as a failed rank of this one.
        # (A single rank started again on its node stays shown as failed, its
        # last lines with it, until the node answers the new start.)  So are
        # a multi-node replica's ranks on lost nodes: should one come back,
        # its copy is a new claim on a slot this start holds.
        again = chosen.ranks[0].node_id if ranks == 1 else None
        for shard in self.fleet.replicas().get(replica_id, []):
            failed = shard.status.state == ShardState.FAILED and shard.node_id != again
            if failed or (ranks > 1 and not self.fleet.usable(shard.node_id)):
                self.fleet.forget_shard(shard.node_id, shard.id)
        placed = [
            (
                rank.node_id,
                ShardSpec(
                    shard_id=f"{replica_id}/{index}",
                    replica_id=replica_id,
                    model=entry.model.name,
                    engine=entry.profile.engine,
                    fingerprint=entry.fingerprint,
                    source=entry.model.source,
                    sha256=entry.model.sha256,
                    files=list(entry.model.files),
                    args=list(entry.profile.args),
                    gpus=list(rank.gpus),
                    rank=index,
                    ranks=ranks,
                    # Ranks > 0 are given rank 0's rendezvous when they start.
                    leader=None,
                    launcher=entry.profile.launcher if ranks > 1 else None,
                    engine_version=entry.engine_version,
                ),
            )
            for index, rank in enumerate(chosen.ranks)
        ]
        specs = placed
        if ranks > 1:
            # Every rank is placed and held for; rank 0 alone starts now.
            specs = placed[:1]
            slot.nodes = tuple(node_id for node_id, _ in placed)
            slot.startup = Startup(leader_node=placed[0][0], workers=placed[1:],
                                   held=(entry.model.name, attrs.evolve(chosen, ranks=chosen.ranks[1:])),
                                   timeout_s=placed[0][1].start_timeout_s, placed_at=now)
            log.info("replica {id}: {rest} start once rank 0 reports its rendezvous", id=replica_id,
                     rest=", ".join(f"rank {spec.rank} on {node_id}" for node_id, spec in placed[1:]))
        for node_id, spec in specs:
            self.fleet.place(node_id, spec)
        slot.fire(SlotInput.PLACED)
        slot.explain(None)
        slot.started_at = now
        self._inflight[replica_id] = (entry.model.name, chosen)
        self._snapshots = chosen.apply_to(nodes, entry.model.name, replica_id)
        log.info("starting replica {id} on {nodes}", id=replica_id, nodes=", ".join(n for n, _ in specs))
        self._note(JournalKind.PLACED, replica_id, occupancy.placed_words(chosen), node=specs[0][0])
        d = defer.ensureDeferred(self._launch_all(replica_id, slot, specs))
        d.addErrback(lambda f: log.failure("launching {id}", f, id=replica_id))

    def _place(self, request: placement.PlacementRequest, nodes: placement.Snapshots,
               holds: frozenset[str], slot: Slot) -> placement.Placement | placement.Unplaceable:
        """Where the replica goes: a multi-node one back on its last nodes when they can all still take it."""
        if request.ranks > 1 and slot.nodes:
            again = placement.place(request, [n for n in nodes if n.id in slot.nodes], holds)
            if isinstance(again, placement.Placement):
                order = {node_id: index for index, node_id in enumerate(slot.nodes)}
                return attrs.evolve(again, ranks=sorted(again.ranks, key=lambda r: order[r.node_id]))
        return placement.place(request, nodes, holds)

    def _start_workers(self, replica_id: str, slot: Slot, startup: Startup, rendezvous: str, now: float) -> None:
        """Rank 0 reported where the others meet it: start them, once, with it as their leader."""
        specs = [(node_id, attrs.evolve(spec, leader=rendezvous)) for node_id, spec in startup.workers]
        startup.workers_starting(now)
        for node_id, spec in specs:
            self.fleet.place(node_id, spec)
        slot.fire(SlotInput.PLACED)
        log.info("replica {id}: rank 0 on {leader} reports its rendezvous {at}; starting {rest}", id=replica_id,
                 leader=startup.leader_node, at=rendezvous,
                 rest=", ".join(f"rank {spec.rank} on {node_id}" for node_id, spec in specs))
        d = defer.ensureDeferred(self._launch_all(replica_id, slot, specs))
        d.addErrback(lambda f: log.failure("launching {id}", f, id=replica_id))

    async def _launch_all(self, replica_id: str, slot: Slot, specs: list[tuple[str, ShardSpec]]) -> None:
        started = False
        try:
            results = await defer.DeferredList(
                [defer.ensureDeferred(self._start(node_id, spec)) for node_id, spec in specs],
                consumeErrors=True,
            )
            refusals = [f"{node_id}: {relay.failure_words(result)}"
                        for (ok, result), (node_id, _) in zip(results, specs) if not ok]
            started = not refusals
            if refusals:
                # The ranks already running go too: the next tick stops them.
                self._failed(slot, replica_id, "; ".join(refusals), self._clock.seconds(), SlotInput.REFUSED)
                slot.startup = None
                for (ok, _), (node_id, spec) in zip(results, specs):
                    if not ok:
                        self.fleet.unplace(node_id, spec.shard_id)
                    else:
                        defer.ensureDeferred(self._stop(node_id, spec.shard_id)).addErrback(lambda f: None)
        finally:
            slot.fire(SlotInput.STARTED)  # the attempt is over, whatever it raised
            startup = slot.startup
            if started and startup is not None and not startup.workers_started and self.slots.get(replica_id) is slot:
                self._inflight[replica_id] = startup.held  # rank 0 runs; the others stay held for
            else:
                self._inflight.pop(replica_id, None)

    # -- what ctl shows --

    def views(self, models: Collection[str] | None = None) -> list[ReplicaView]:
        """Every replica's view, as ``ctl replicas`` lists them; with *models*, only those models' replicas."""
        return replicaview.views(self.slots, self.fleet, self._catalog(), self._clock.seconds(), models,
                                 self.elastic.scaler)

    def status(self) -> list[ModelStatus]:
        """Per model: desired against ready."""
        return replicaview.status(self.views(), self.fleet, self._catalog(), self.wants)


def _all_ready(live: list[ReportedShard]) -> bool:
    return all(s.status.state == ShardState.READY for s in live)
