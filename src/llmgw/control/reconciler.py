"""The reconciler: converge what the fleet runs to what the catalog asks for.

Each model has ``replicas`` slots, ``<model>/0`` … ``<model>/N-1``; a slot
holds at most one replica, whose shards are ``<slot>/<rank>``.  Slot names
make a restarted control plane's job simple: what the agents report fills
slots, and only empty slots are placed — nothing is started twice.

Each ``tick``:
- shards of a model that left the catalog, or of a slot above ``replicas``,
  are stopped;
- a replica with a failed shard is stopped whole and retried after a backoff
  (1 s, doubling to 5 min; reset once it is ready) — this is also how a
  crashed engine is restarted;
- a multi-node replica is started in order (``llmgw.control.startup``):
  every rank placed, rank 0 started, the others once rank 0 reports its
  rendezvous; one that loses a rank (failed, stopped, or on a lost node)
  is failed whole, every other rank stopped, and placed again after the
  backoff, on the same nodes when they can still take it;
- shards on a ``lost`` node count as gone and their slot is placed again
  (an ``unreachable`` node's engines are left alone: its agent may be
  restarting while they keep serving);
- an empty slot is placed, and its shards started on their nodes;
- a slot whose fresh start the reconciler itself stops again (within
  ``FLAP_WINDOW_S`` of starting it, a second time and more) is held back
  before its next start (10 s, doubling to 5 min; reset once it has been
  ready ``FLAP_WINDOW_S``), with one line in the log per step: two agents
  on one state_dir, or a node that keeps reporting a second copy, otherwise
  make it start and stop every tick.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Collection

import attrs
from twisted.internet import defer
from twisted.logger import Logger

from llmgw.control import placement, weights
from llmgw.control.catalog import Entry
from llmgw.control.fleet import Fleet, ReportedShard
from llmgw.control.startup import Startup, not_started_words, waiting_for
from llmgw.records import ShardSpec
from llmgw.states import SHARD_ALIVE, ReplicaState, ShardState
from llmgw.views import ModelStatus, ReplicaView, ShardView

log = Logger()

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 300.0
RESTOP_AFTER_S = 30.0
FLAP_WINDOW_S = 60.0
FLAP_BACKOFF_START_S = 10.0


@attrs.define
class Slot:
    failures: int = 0
    retry_at: float | None = None
    # Why the slot holds no ready replica, in words for ctl.  ``failed`` says
    # whether they are a failure's; the reconciler decides from it, never from
    # the words.  Both are set together, by ``explain``.
    reason: str | None = None
    failed: bool = False
    launching: bool = False
    counted: set = attrs.Factory(set)  # (node, shard id, grant order) of failures already counted
    # When the slot was last started, until a stop in it is counted: a stop
    # soon after a start is the reconciler undoing its own work.
    started_at: float | None = None
    undone: int = 0  # starts undone in a row
    undone_at: float | None = None
    held_until: float | None = None  # no start before this, while it keeps being undone
    held_reason: str | None = None
    # A multi-node replica: its ordered start while one is under way, the
    # nodes of its last placement (rank order), and whether it is failing
    # whole (its other ranks being stopped; cleared once none is left).
    startup: Startup | None = None
    nodes: tuple[str, ...] = ()
    broken: bool = False

    def explain(self, reason: str | None, *, failed: bool = False) -> None:
        self.reason, self.failed = reason, failed


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
    ):
        self._clock = clock
        started = clock.seconds()
        self._settled_at = started + settle_s
        # After settle_s, placing waits while nodes still arrive (one connected or registered within
        # settle_quiet_s), but not past settle_max_s from the start.
        self._settle_quiet_s = settle_quiet_s
        self._settle_deadline = started + max(settle_s, settle_max_s if settle_max_s is not None else settle_s)
        self._settled = settle_s <= 0  # settle_s 0: place at once, whatever is arriving
        self._settle_seen: tuple[float, str | None] | None = None
        self.fleet = fleet
        self._catalog = catalog
        self._start = start_shard
        self._stop = stop_shard
        self.slots: dict[str, Slot] = {}
        self._stopping: dict[tuple[str, str], float] = {}  # (node, shard id) -> when stop was asked
        # Placements whose starts are in flight: not yet in the fleet, but
        # their GPUs and their spread must count for the next placement.
        self._inflight: dict[str, tuple[str, placement.Placement]] = {}
        self._snapshots: placement.Snapshots | None = None

    # -- one pass --

    def tick(self) -> None:
        self._snapshots = None
        now = self._clock.seconds()
        # A stop asked of a shard that has since gone is done; a new shard with
        # the same id must be stoppable at once.
        present = {(s.node_id, s.id) for s in self.fleet.shards.values()}
        self._stopping = {k: t for k, t in self._stopping.items() if k in present}
        catalog = self._catalog()
        observed = self.fleet.replicas()
        for replica_id, shards in observed.items():
            model, slot = _split(replica_id)
            entry = catalog.get(model)
            if entry is None:
                self._stop_all(shards, now, "its model left the catalog", undoing=False)
            elif slot is None or slot >= entry.model.replicas:
                self._stop_all(shards, now, "the model was scaled down", undoing=False)
        for name, entry in catalog.items():
            for index in range(entry.model.replicas):
                shards = self._one_per_rank(observed.get(f"{name}/{index}", []), now)
                self._converge_slot(f"{name}/{index}", entry, shards, now)
        for slot_id, slot in self.slots.items():
            model, index = _split(slot_id)
            wanted = model in catalog and index is not None and index < catalog[model].model.replicas
            if not wanted and not slot.launching:
                # Scaled down or gone: the ranks it was holding room for are not started.
                self._drop_startup(slot_id, slot)
        for slot_id in [s for s in self.slots if _split(s)[0] not in catalog]:
            del self.slots[slot_id]

    def _converge_slot(self, replica_id: str, entry: Entry, shards: list[ReportedShard], now: float) -> None:
        slot = self.slots.setdefault(replica_id, Slot())
        if slot.launching:
            return
        live = [s for s in shards if s.status.state in SHARD_ALIVE and self.fleet.usable(s.node_id)]
        failed = [s for s in shards if s.status.state == ShardState.FAILED]
        for shard in failed:
            # Once per grant: the node's own "since" is not the control plane's to trust.
            key = (shard.node_id, shard.id, shard.order)
            if key not in slot.counted:
                slot.counted.add(key)
                self._failed(slot, replica_id, f"{shard.node_id}: {shard.status.reason or 'failed'}", now)
        if failed and live:
            # One failed rank makes the whole replica useless: stop the rest.
            # The failure's own backoff holds the slot; this stop is not a start undone.
            slot.broken = True
            self._drop_startup(replica_id, slot)
            self._stop_all(live, now, "another rank of its replica failed", undoing=False)
            return
        if live and max(s.status.spec.ranks for s in live) > 1:
            self._converge_ranks(replica_id, slot, shards, live, now)
            return
        if live:
            if all(s.status.state == ShardState.READY for s in live):
                slot.failures, slot.retry_at = 0, None
                slot.explain(None)
                self._steady(replica_id, slot, now)
            return
        # Nothing of the replica is left: whatever was failing it is over.
        slot.broken = False
        self._drop_startup(replica_id, slot)
        if slot.retry_at is not None and now < slot.retry_at:
            return
        if slot.held_until is not None and now < slot.held_until:
            slot.explain(slot.held_reason)
            return
        waiting = self._settling(now)
        if waiting is not None:
            slot.explain(waiting)
            return
        self._launch(replica_id, entry, slot, now)

    def _settling(self, now: float) -> str | None:
        """Why nothing is placed yet after a start, in words; None once the fleet has settled (for good)."""
        if self._settled:
            return None
        if now < self._settled_at:
            return f"waiting {self._settled_at - now:.0f} s for the fleet to report before placing (fleet.settle_s)"
        if self._settle_seen is not None and self._settle_seen[0] == now:
            return self._settle_seen[1]  # once per pass, not once per slot
        why = None
        if now < self._settle_deadline and self._settle_quiet_s > 0:
            last = self.fleet.last_arrival
            # Connections mid-handshake are arrivals not yet heard: a hub too busy to finish any
            # handshake for settle_quiet_s (a whole fleet reconnecting) is not a quiet one.
            handshaking = self.fleet.handshaking()
            if handshaking > 0:
                why = (f"waiting for the fleet to finish coming back before placing: the hub has {handshaking} "
                       f"connection{'s' if handshaking != 1 else ''} still in handshakes (fleet.settle_quiet_s)")
            elif last is None:
                why = "waiting for the fleet to come back before placing: no node has registered yet"
            elif now - last < self._settle_quiet_s:
                why = (f"waiting for the fleet to finish coming back before placing: a node connected or "
                       f"registered {now - last:.0f} s ago (fleet.settle_quiet_s)")
        if why is None:
            self._settled = True
        self._settle_seen = (now, why)
        return why

    def _converge_ranks(self, replica_id: str, slot: Slot, shards: list[ReportedShard],
                        live: list[ReportedShard], now: float) -> None:
        """A multi-node replica: start its other ranks once rank 0 is ready for them, or fail it whole.

        Whole is rank 0 alone while the others wait for its rendezvous, and
        every rank after that.  A replica that is not whole — a rank failed
        (above), stopped, on a lost node, or reported before it was started —
        is failed: every rank it has left is stopped (vLLM's headless ranks
        outlive their rank 0), and the slot is placed again after the backoff.
        """
        if slot.broken:
            self._stop_all(live, now, "its replica failed", undoing=False)
            return
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
            if startup is None and self._settling(now) is not None:
                # A restarted control plane: the other ranks' nodes may not have registered yet.
                slot.explain(f"waiting {max(0.0, self._settled_at - now):.0f} s for the fleet to report its other "
                             "ranks (fleet.settle_s)")
                return
            why = _not_whole(shards, by_rank, expected, self.fleet.usable)
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
        if all(s.status.state == ShardState.READY for s in live):
            slot.failures, slot.retry_at = 0, None
            slot.explain(None)
            slot.startup = None
            self._steady(replica_id, slot, now)

    def _break(self, replica_id: str, slot: Slot, live: list[ReportedShard], why: str, now: float) -> None:
        slot.broken = True
        self._drop_startup(replica_id, slot)
        self._failed(slot, replica_id, why, now)
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

    def _failed(self, slot: Slot, replica_id: str, why: str, now: float) -> None:
        slot.failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (slot.failures - 1))
        slot.retry_at = now + delay
        slot.explain(f"failed: {why} (attempt {slot.failures})", failed=True)
        log.warn("replica {id} {reason}; next try in {delay:.0f} s", id=replica_id, reason=slot.reason, delay=delay)

    def _steady(self, replica_id: str, slot: Slot, now: float) -> None:
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

    def _undone(self, shard: ReportedShard, now: float, why: str) -> None:
        """A stop in a slot this reconciler started moments ago: count it, and hold the slot back when it repeats."""
        replica_id = shard.status.spec.replica_id
        slot = self.slots.get(replica_id)
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
                self._undone(shard, now, why)
            log.info("stopping {id} on {node}: {why}", id=shard.id, node=shard.node_id, why=why)
            d = defer.ensureDeferred(self._stop(shard.node_id, shard.id))
            d.addErrback(lambda f, s=shard: log.warn("stopping {id} on {node} failed: {e}",
                                                     id=s.id, node=s.node_id, e=f.getErrorMessage()))

    # -- placing and starting --

    def snapshots(self) -> placement.Snapshots:
        """The fleet as placement sees it, with in-flight starts counted once.

        A node may report a shard before its start is answered; that rank is
        then counted from the fleet, and not again as in flight.
        """
        nodes = placement.Snapshots(self._fleet_snapshots())
        reported = {(node.id, r.replica) for node in nodes for r in node.reserved}
        for replica_id, (model, chosen) in self._inflight.items():
            unreported = [r for r in chosen.ranks if (r.node_id, replica_id) not in reported]
            nodes = attrs.evolve(chosen, ranks=unreported).apply_to(nodes, model, replica_id)
        return nodes

    def _fleet_snapshots(self, source: str | None = None) -> list[placement.NodeSnapshot]:
        catalog = self._catalog()
        reserved: dict[str, list[placement.Reservation]] = {}
        replicas: dict[str, dict[str, int]] = {}
        for shard in self.fleet.shards.values():
            if shard.status.state in SHARD_ALIVE:
                spec = shard.status.spec
                reserved.setdefault(shard.node_id, []).append(_reservation(spec, catalog.get(spec.model)))
                per_node = replicas.setdefault(shard.node_id, {})
                per_node[spec.model] = per_node.get(spec.model, 0) + 1
        return [
            placement.NodeSnapshot.from_inventory(
                node.id, node.state, node.cordoned, node.inventory,
                reserved=reserved.get(node.id, ()), replicas=replicas.get(node.id, {}),
                weights_free_bytes=weights.free_for_weights(node.inventory),
            )
            for node in self.fleet.nodes.values()
        ]

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
            reason = chosen.summary()
            if slot.reason != reason and not slot.failed:
                log.info("replica {id} cannot be placed: {reason}", id=replica_id, reason=reason)
            if not slot.failed or slot.retry_at is None or now >= slot.retry_at:
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
        slot.launching = True
        slot.explain(None)
        slot.started_at = now
        self._inflight[replica_id] = (entry.model.name, chosen)
        self._snapshots = chosen.apply_to(nodes, entry.model.name, replica_id)
        log.info("starting replica {id} on {nodes}", id=replica_id, nodes=", ".join(n for n, _ in specs))
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
        slot.launching = True
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
            refusals = [
                f"{node_id}: {_words(result)}" for (ok, result), (node_id, _) in zip(results, specs) if not ok
            ]
            started = not refusals
            if refusals:
                self._failed(slot, replica_id, "; ".join(refusals), self._clock.seconds())
                # The ranks already running go too: the next tick stops them.
                slot.broken = True
                slot.startup = None
                for (ok, _), (node_id, spec) in zip(results, specs):
                    if not ok:
                        self.fleet.unplace(node_id, spec.shard_id)
                    else:
                        defer.ensureDeferred(self._stop(node_id, spec.shard_id)).addErrback(lambda f: None)
        finally:
            slot.launching = False
            startup = slot.startup
            if started and startup is not None and not startup.workers_started and self.slots.get(replica_id) is slot:
                self._inflight[replica_id] = startup.held  # rank 0 runs; the others stay held for
            else:
                self._inflight.pop(replica_id, None)

    # -- what ctl shows --

    def views(self, models: Collection[str] | None = None) -> list[ReplicaView]:
        """Every replica's view, as ``ctl replicas`` lists them; with *models*, only those models' replicas."""
        now = self._clock.seconds()
        catalog = self._catalog()
        observed = self.fleet.replicas()
        out = []
        for name, entry in sorted(catalog.items()):
            if models is not None and name not in models:
                continue
            for index in range(entry.model.replicas):
                replica_id = f"{name}/{index}"
                out.append(self._view(replica_id, name, entry, observed.pop(replica_id, []), now))
        for replica_id, shards in sorted(observed.items()):
            model, _ = _split(replica_id)
            if models is not None and model not in models:
                continue
            view = self._view(replica_id, model, catalog.get(model), shards, now)
            out.append(attrs.evolve(view, reason=view.reason or (
                "its model left the catalog" if model not in catalog else "the model was scaled down"
            )))
        return out

    def _view(self, replica_id: str, model: str, entry: Entry | None, shards: list[ReportedShard],
              now: float) -> ReplicaView:
        slot = self.slots.get(replica_id, Slot())
        shards = sorted(shards, key=lambda s: s.status.spec.rank)
        usable = [s for s in shards if self.fleet.usable(s.node_id)]
        waiting = slot.retry_at is not None and slot.retry_at > now
        if usable and slot.broken:
            state = ReplicaState.FAILED  # its other ranks are being stopped
        elif usable:
            state = _replica_state([s.status.state for s in usable])
            if state == ReplicaState.READY and len({s.status.spec.rank for s in usable}) < max(
                    s.status.spec.ranks for s in usable):
                state = ReplicaState.STARTING  # ready only once every rank is
        elif slot.launching:
            state = ReplicaState.STARTING
        else:
            # A start a node refused is a failure too, not a replica nobody tried.
            state = ReplicaState.FAILED if waiting and slot.failed else ReplicaState.PENDING
        reason = None
        if state == ReplicaState.FAILED:
            reason = next((f"{s.node_id}: {s.status.reason}" for s in usable if s.status.state == ShardState.FAILED),
                          slot.reason)
            if waiting:
                reason = f"{reason} (next try in {slot.retry_at - now:.0f} s)"
        elif state == ReplicaState.PENDING:
            reason = slot.reason or "waiting for the reconciler"
            if slot.held_until is not None and slot.held_until > now:
                reason = f"{reason} (next start in {slot.held_until - now:.0f} s)"
        progress = None
        if state == ReplicaState.FETCHING:
            fetching = next((s for s in usable if s.status.state == ShardState.FETCHING), None)
            if fetching is not None:
                progress = self.fleet.progress.get((fetching.node_id, fetching.status.spec.source))
                reason = f"{fetching.node_id}: " + (downloading(progress) if progress is not None
                                                    else f"fetching {fetching.status.spec.source}")
        leader = usable[0].status if usable and usable[0].status.spec.rank == 0 else None
        fingerprints = {s.status.spec.fingerprint for s in usable}
        if entry is None or not usable:
            stale = None
        elif None in fingerprints:
            stale = None  # an agent too old to report it: unknown, not matching
        else:
            stale = fingerprints != {entry.fingerprint}
        since = [s.status.since for s in usable if s.status.since is not None]
        serving = leader is not None and state in (ReplicaState.READY, ReplicaState.DRAINING)
        return ReplicaView(
            model=model,
            replica=replica_id,
            state=state,
            nodes=[s.node_id for s in usable],
            endpoint=leader.endpoint if serving else None,
            age_s=round(now - min(since), 1) if since else None,
            stale=stale,
            fingerprint=entry.fingerprint if entry is not None else None,
            reason=reason,
            progress=progress,
            shards=self._shard_views(slot, shards, usable, now),
        )

    def _shard_views(self, slot: Slot, shards: list[ReportedShard], usable: list[ReportedShard],
                     now: float) -> list[ShardView]:
        """Each rank: where it runs, how long it has been in its state, what it waits for; then those not started."""
        by_rank = {s.status.spec.rank: s for s in usable if s.status.state in SHARD_ALIVE}
        views = [
            ShardView(shard=s.id, node=s.node_id, state=s.status.state, pid=s.status.pid,
                      endpoint=s.status.endpoint, reason=s.status.reason, output_tail=s.status.output_tail,
                      rank=s.status.spec.rank,
                      age_s=None if s.status.since is None else round(max(0.0, now - s.status.since), 1),
                      waiting=waiting_for(s, by_rank, s.status.spec.ranks) if by_rank.get(s.status.spec.rank) is s
                      else None,
                      started=True)
            for s in shards
        ]
        startup = slot.startup
        if startup is not None and not startup.workers_started:
            views += [ShardView(shard=spec.shard_id, node=node_id, rank=spec.rank,
                                age_s=round(now - startup.placed_at, 1), waiting=not_started_words(startup.leader_node),
                                started=False)
                      for node_id, spec in startup.workers]
        return views

    def status(self) -> list[ModelStatus]:
        """Per model: desired against ready."""
        views = self.views()
        out = []
        for name, entry in sorted(self._catalog().items()):
            mine = [v for v in views if v.model == name]
            states = sorted({v.state for v in mine})
            out.append(ModelStatus(
                model=name,
                profile=entry.profile.name,
                engine=entry.profile.engine,
                desired=entry.model.replicas,
                ready=sum(1 for v in mine if v.state == ReplicaState.READY),
                states={state: sum(1 for v in mine if v.state == state) for state in states},
                stale=sum(1 for v in mine if v.stale),
                # Nodes holding the weights, per fabric ("-": on none); a shared filer
                # counts on every node mounting it.
                weights_by_fabric=weights.held_by_fabric(self.fleet, entry.model.source, entry.model.files),
            ))
        return out


#: A replica is in the first of these states any of its shards is in.
_SUMMED = ((ShardState.FAILED, ReplicaState.FAILED), (ShardState.DRAINING, ReplicaState.DRAINING),
           (ShardState.FETCHING, ReplicaState.FETCHING), (ShardState.STARTING, ReplicaState.STARTING))


def _replica_state(states: list[str]) -> ReplicaState:
    for shard_state, replica_state in _SUMMED:
        if shard_state in states:
            return replica_state
    ready = states and all(s == ShardState.READY for s in states)
    return ReplicaState.READY if ready else ReplicaState.STARTING


def _reservation(spec: ShardSpec, entry: Entry | None) -> placement.Reservation:
    """What a running shard holds on its node: its GPUs, or, holding none, the memory its model's profile reserves.

    The need is read from the catalog as it is now; a shard whose model left
    it is being stopped, and reserves no memory while that happens.
    """
    memory = None if entry is None else placement.memory_reservation(len(spec.gpus), entry.profile.min_memory_gb)
    return placement.Reservation(spec.replica_id, memory, spec.gpus)


def downloading(progress) -> str:
    """"downloading gemma.gguf 120/253 MB, 31 MB/s"; "… 120 MB so far" with no length: no invented percentage."""
    done = progress.bytes_done / 1e6
    size = f"{done:.0f}/{progress.bytes_total / 1e6:.0f} MB" if progress.bytes_total else f"{done:.0f} MB so far"
    rate = f", {progress.rate_bps / 1e6:.0f} MB/s" if progress.rate_bps else ""
    return f"downloading {progress.file_name} {size}{rate}"


def _not_whole(shards: list[ReportedShard], by_rank: dict[int, ReportedShard], expected: set[int],
               usable: Callable[[str], bool]) -> str:
    """Which ranks a multi-node replica lacks, and where they were: "rank 1 on node02: node02 is lost"."""
    words = []
    for rank in sorted(expected - set(by_rank)):
        gone = [s for s in shards if s.status.spec.rank == rank and not usable(s.node_id)]
        words.append(f"rank {rank} on {gone[0].node_id}: {gone[0].node_id} is lost" if gone
                     else f"rank {rank} is no longer reported by any node")
    return "; ".join(words)


def _split(replica_id: str) -> tuple[str, int | None]:
    model, _, index = replica_id.rpartition("/")
    try:
        return model, int(index)
    except ValueError:
        return replica_id, None


def _words(failure) -> str:
    value = getattr(failure, "value", failure)
    args = getattr(value, "args", ())
    if getattr(value, "error", None) and args:
        return str(args[0])
    return str(value) or type(value).__name__
