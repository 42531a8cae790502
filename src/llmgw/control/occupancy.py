"""What the fleet's running shards hold, as placement sees the nodes: their GPUs, memory and replicas."""

from __future__ import annotations

from typing import Mapping

from llmgw.control import placement, weights
from llmgw.control.catalog import Entry
from llmgw.control.fleet import Fleet
from llmgw.records import ShardSpec
from llmgw.states import SHARD_ALIVE


def fleet_snapshots(fleet: Fleet, catalog: Mapping[str, Entry]) -> list[placement.NodeSnapshot]:
    """Every node with what its live shards reserve; in-flight starts are the reconciler's to add."""
    reserved: dict[str, list[placement.Reservation]] = {}
    replicas: dict[str, dict[str, int]] = {}
    for shard in fleet.shards.values():
        if shard.status.state in SHARD_ALIVE:
            spec = shard.status.spec
            reserved.setdefault(shard.node_id, []).append(reservation(spec, catalog.get(spec.model)))
            per_node = replicas.setdefault(shard.node_id, {})
            per_node[spec.model] = per_node.get(spec.model, 0) + 1
    return [
        placement.NodeSnapshot.from_inventory(
            node.id, node.state, node.cordoned, node.inventory,
            reserved=reserved.get(node.id, ()), replicas=replicas.get(node.id, {}),
            weights_free_bytes=weights.free_for_weights(node.inventory),
        )
        for node in fleet.nodes.values()
    ]


def reservation(spec: ShardSpec, entry: Entry | None) -> placement.Reservation:
    """What a running shard holds on its node: its GPUs, or, holding none, the memory its model's profile reserves.

    The need is read from the catalog as it is now; a shard whose model left
    it is being stopped, and reserves no memory while that happens.
    """
    memory = None if entry is None else placement.memory_reservation(len(spec.gpus), entry.profile.min_memory_gb)
    return placement.Reservation(spec.replica_id, memory, spec.gpus)


def placed_words(chosen: placement.Placement) -> str:
    """What a placement holds, for the journal: "GPU 0, 1; 8.0 GB reserved", or each rank's on several nodes."""
    def held(rank: placement.RankPlacement) -> str:
        return "GPU " + ", ".join(str(g) for g in rank.gpus) if rank.gpus else "no GPU"

    memory = f"; {chosen.memory_bytes / 1e9:.1f} GB reserved" if chosen.memory_bytes else ""
    if len(chosen.ranks) == 1:
        return held(chosen.ranks[0]) + memory
    return "; ".join(f"rank {i} on {r.node_id} ({held(r)})" for i, r in enumerate(chosen.ranks)) + memory
