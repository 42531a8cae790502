"""What ``ctl replicas`` and ``ctl status`` show: each slot's replica as a view record, and each model's sums.

The reconciler's slots and the fleet's reports are read, never changed:
the state is ``llmgw.control.slot.replica_state``'s, the words are the
slot's reason, the shards' own, or a download's progress.
"""

from __future__ import annotations

from typing import Collection

import attrs

from llmgw.control import weights
from llmgw.control.catalog import Entry
from llmgw.control.fleet import Fleet, ReportedShard
from llmgw.control.scaler import Scaler
from llmgw.control.slot import Slot, replica_state, split_slot_id
from llmgw.control.startup import not_started_words, waiting_for
from llmgw.sizes import MB, downloaded, figure
from llmgw.states import SHARD_ALIVE, ReplicaState, ShardState
from llmgw.views import ModelStatus, ReplicaView, ShardView


def views(slots: dict[str, Slot], fleet: Fleet, catalog: dict[str, Entry], now: float,
          models: Collection[str] | None = None, scaler: Scaler | None = None) -> list[ReplicaView]:
    """Every replica's view, the catalog's slots first, then copies nobody wants; with *models*, only theirs.

    An elastic model's sleeping slots are not listed one by one: only its
    first, when all of it sleeps (a model scaled to zero is one line).
    """
    observed = fleet.replicas()
    out = []
    for name, entry in sorted(catalog.items()):
        if models is not None and name not in models:
            continue
        mine = []
        for index in range(entry.model.replicas):
            replica_id = f"{name}/{index}"
            view = _view(slots, fleet, replica_id, name, entry, observed.pop(replica_id, []), now)
            if view.state == ReplicaState.SLEEPING and scaler is not None:
                view = attrs.evolve(view, reason=scaler.asleep(name, now))
            elif scaler is not None and view.state in _WAKING and (words := scaler.waking(name, now)):
                view = attrs.evolve(view, reason=f"{words}; {view.reason}" if view.reason else words)
            mine.append(view)
        awake = [v for v in mine if v.state != ReplicaState.SLEEPING]
        out.extend(awake if awake else mine[:1])
    for replica_id, shards in sorted(observed.items()):
        model, _ = split_slot_id(replica_id)
        if models is not None and model not in models:
            continue
        view = _view(slots, fleet, replica_id, model, catalog.get(model), shards, now)
        out.append(attrs.evolve(view, reason=view.reason or (
            "its model left the catalog" if model not in catalog else "the model was scaled down"
        )))
    return out


#: States a replica woken on demand is shown in with how long it has been waking and who waits.
_WAKING = frozenset({ReplicaState.PENDING, ReplicaState.FETCHING, ReplicaState.STARTING})


def _view(slots: dict[str, Slot], fleet: Fleet, replica_id: str, model: str, entry: Entry | None,
          shards: list[ReportedShard], now: float) -> ReplicaView:
    slot = slots.get(replica_id, Slot())
    shards = sorted(shards, key=lambda s: s.status.spec.rank)
    usable = [s for s in shards if fleet.usable(s.node_id)]
    waiting = slot.retry_at is not None and slot.retry_at > now
    whole = bool(usable) and len({s.status.spec.rank for s in usable}) >= max(s.status.spec.ranks for s in usable)
    state = replica_state(slot, [s.status.state for s in usable], whole, now)
    reason = None
    if state == ReplicaState.FAILED:
        reason = next((f"{s.node_id}: {s.status.reason}" for s in usable if s.status.state == ShardState.FAILED),
                      slot.reason)
        if waiting:
            reason = f"{reason} (next try in {slot.retry_at - now:.0f} s)"
    elif state in (ReplicaState.PENDING, ReplicaState.SLEEPING, ReplicaState.DRAINING):
        reason = slot.reason or ("waiting for the reconciler" if state == ReplicaState.PENDING else None)
        if slot.held_until is not None and slot.held_until > now:
            reason = f"{reason} (next start in {slot.held_until - now:.0f} s)"
    progress = None
    if state == ReplicaState.FETCHING:
        fetching = next((s for s in usable if s.status.state == ShardState.FETCHING), None)
        if fetching is not None:
            progress = fleet.progress.get((fetching.node_id, fetching.status.spec.source))
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
        shards=_shard_views(slot, shards, usable, now),
    )


def _shard_views(slot: Slot, shards: list[ReportedShard], usable: list[ReportedShard], now: float) -> list[ShardView]:
    """Each rank: where it runs, how long it has been in its state, what it waits for; then those not started."""
    by_rank = {s.status.spec.rank: s for s in usable if s.status.state in SHARD_ALIVE}
    out = [
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
        out += [ShardView(shard=spec.shard_id, node=node_id, rank=spec.rank,
                          age_s=round(now - startup.placed_at, 1), waiting=not_started_words(startup.leader_node),
                          started=False)
                for node_id, spec in startup.workers]
    return out


def status(replicas: list[ReplicaView], fleet: Fleet, catalog: dict[str, Entry],
           wanted: dict[str, int] | None = None) -> list[ModelStatus]:
    """Per model: desired (*wanted*: an elastic model's count now) against ready, its replicas' states, its weights."""
    out = []
    for name, entry in sorted(catalog.items()):
        mine = [v for v in replicas if v.model == name]
        states = sorted({v.state for v in mine})
        out.append(ModelStatus(
            model=name,
            profile=entry.profile.name,
            engine=entry.profile.engine,
            desired=(wanted or {}).get(name, entry.model.replicas),
            ready=sum(1 for v in mine if v.state == ReplicaState.READY),
            states={state: sum(1 for v in mine if v.state == state) for state in states},
            stale=sum(1 for v in mine if v.stale),
            # Nodes holding the weights, per fabric ("-": on none); a shared filer
            # counts on every node mounting it.
            weights_by_fabric=weights.held_by_fabric(fleet, entry.model.source, entry.model.files),
        ))
    return out


def downloading(progress) -> str:
    """"downloading gemma.gguf 120/253 MB, 31 MB/s"; "… 120 MB so far" with no length: no invented percentage."""
    rate = f", {figure(progress.rate_bps / MB)} MB/s" if progress.rate_bps else ""
    return f"downloading {progress.file_name} {downloaded(progress.bytes_done, progress.bytes_total)}{rate}"
