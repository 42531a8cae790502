"""Whether placement could have put a shard that a node offers for adoption where it runs.

A node that registers with a shard the control plane did not place offers it
for adoption (``claims``).  The slot being free is not enough: the shard must
also be one placement could have given that node.  So the offer is held to
the very filters placement runs (``placement_filters``), over the node as it
was before the shard started:

* labels, engine, the machine's memory and its GPUs' kind and count are
  hard requirements, checked as placement checks them — the engine at any
  build: a shard on a build the catalog has since moved on from is the
  reconciler's to replace, as it replaces any stale shard, not one to stop
  outright after a control plane restart;
* what the shard itself uses is its own: its GPUs are not counted as held,
  their used memory is its memory, and a CPU profile's reservation is set
  against what the *other* shards the node runs reserve;
* only the cards the shard holds are offered to the GPU filter, since
  placement would have had to hand it exactly those.

Not checked: the node being cordoned (a cordon stops new placements, not
what runs), room for the weights (it holds them), and a multi-node replica's
fabric (one node cannot show it).  docs/placement.rst says this too.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from llmgw.control import placement_filters as filters
from llmgw.control.placement import NodeSnapshot, PlacementRequest, Reservation, memory_reservation
from llmgw.records import Inventory, ShardSpec
from llmgw.states import NodeState

#: The placement filters an adopted shard is held to, in placement's order.
HARD = (filters.labels, filters.engine, filters.memory, filters.gpus)


def misfit(node_id: str, inventory: Inventory, spec: ShardSpec, request: PlacementRequest,
           others: Iterable[Reservation] = ()) -> str | None:
    """Why placement would not have put *spec* on *node_id*; None when it could have.

    *others* is what the node's other shards hold (not this one).  The
    sentence follows the node's id, as a placement refusal does.
    """
    if spec.engine != request.engine:
        return f"runs it on {spec.engine}, and its profile's engine is {request.engine}"
    held = sorted(set(spec.gpus))
    if len(held) != request.gpus:
        return (f"runs it on {filters.count(len(held), 'GPU')}, and its profile asks for "
                f"{filters.count(request.gpus, 'GPU')}")
    cards = None if inventory.gpus is None else {g.index for g in inventory.gpus}
    unknown = [i for i in held if cards is not None and i not in cards]
    if unknown:
        return f"runs it on GPU {unknown[0]}, which it does not report having"
    gpus = None
    if inventory.gpus is not None:
        # Its own cards as placement saw them before it started: their used memory is the shard's.
        gpus = [attrs.evolve(g, memory_used_bytes=0) for g in inventory.gpus if g.index in held]
    request = attrs.evolve(request, engine_version=None)
    node = NodeSnapshot.from_inventory(
        node_id, NodeState.READY, False, attrs.evolve(inventory, gpus=gpus), reserved=others,
    )
    for step in HARD:
        why = step.check(request, node)
        if why is not None:
            return why
    return None


def reservation(spec: ShardSpec, request: PlacementRequest | None) -> Reservation:
    """What a shard of *spec* run with *request*'s profile holds on its node, as the reconciler counts it."""
    memory = None if request is None else memory_reservation(len(spec.gpus), request.min_memory_gb)
    return Reservation(spec.replica_id, memory, spec.gpus)
