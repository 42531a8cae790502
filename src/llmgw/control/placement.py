"""Where one replica of a model goes: pure functions over a snapshot of the fleet.

``place(request, nodes)`` runs the filters (placement_filters), scores the nodes
that are left (placement_scorers), and returns a ``Placement`` naming a node and
concrete GPU indices for every rank, or an ``Unplaceable`` saying, node by node
and in the node's own terms, why none would do ("node05: has 8 GB of memory,
needs 24").  Nothing here does I/O, reads a clock or touches the reactor: the
reconciler builds the snapshot, calls this, and acts on the answer.  It
passes ``Snapshots`` (placement_index), which ``apply_to`` gives back and
which remember what the filters kept, so that a decision over ten thousand
nodes reads a few of them; ``place_plainly`` is the same answer the long way.

What is already on a node is a list of ``Reservation`` records, one per
replica: the GPUs it holds and, for a CPU profile, the host memory its
profile needs.  A node is refused memory that would leave it over-committed,
and the refusal names who holds the rest ("node05: 8 GB of 32 left after
echo/0 and qwen/1, needs 24").

Absent is not zero here either.  A node that did not report its memory or its
engines is still a candidate, because an agent older than the field says
nothing and a control plane upgrade must not quietly empty half a fleet.  GPUs
are the exception, and docs/placement.rst says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from llmgw.control import placement_filters as filters
from llmgw.control import placement_index as index
from llmgw.control import placement_scorers as scorers
from llmgw.control.placement_index import Snapshots
from llmgw.records import GPU, EngineInfo, Inventory
from llmgw.states import NodeState

if TYPE_CHECKING:
    from llmgw.config.catalog import Profile


def _frozenset(value: Iterable) -> frozenset:
    return frozenset(value)


def _engine_entries(value: Iterable[EngineInfo | str] | None) -> list[EngineInfo] | None:
    # A bare name is an engine seen to run, as agents older than install states said it.
    if value is None:
        return None
    return [EngineInfo(name=e) if isinstance(e, str) else e for e in value]


def _non_negative(instance, attribute, value) -> None:
    if value is not None and not value >= 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _at_least_one(instance, attribute, value) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value!r}")


@attrs.frozen
class Reservation:
    """What one replica already placed on a node holds there.

    ``replica`` is its slot ("echo/0"), or the model's name where whoever
    placed it did not say which slot.  ``memory_bytes`` is the host memory its
    profile reserves; None: none stated, or a GPU profile, whose weights live
    in the memory of the GPUs it holds whole.
    """

    replica: str
    memory_bytes: int | None = attrs.field(default=None, validator=_non_negative)
    gpus: frozenset[int] = attrs.field(default=frozenset(), converter=_frozenset)


@attrs.frozen
class NodeSnapshot:
    """One node as placement sees it: what it reported, and what is already on it.

    ``None`` is "not reported", never "none": ``engines=None`` is an agent too
    old to say, ``engines=[]`` one that looked and has none; ``engines`` holds
    the node's ``EngineInfo`` entries, each with its state and reason (a bare
    name is read as an entry seen to run); ``gpus=None`` a
    driver that could not count its cards, ``gpus=[]`` a node without any.
    """

    id: str
    state: NodeState = NodeState.READY
    cordoned: bool = False
    labels: dict[str, str] = attrs.Factory(dict)
    memory_total_bytes: int | None = None
    engines: list[EngineInfo] | None = attrs.field(default=None, converter=_engine_entries)
    gpus: list[GPU] | None = None
    # NVML indices held by shards already placed here.
    gpus_in_use: frozenset[int] = attrs.field(default=frozenset(), converter=_frozenset)
    # Fabrics of its InfiniBand adapters that have one (from agent.yaml).
    fabrics: frozenset[str] = attrs.field(default=frozenset(), converter=_frozenset)
    # model name -> replicas of it already on this node
    replicas: dict[str, int] = attrs.Factory(dict)
    # Words for an engine the node has no entry for at all; an entry's own
    # reason comes first.
    engines_reason: str | None = None
    # Free bytes where the node fetches weights; None: not reported.
    weights_free_bytes: int | None = None
    # Whether it already holds this request's weights (the disk check skips it).
    holds_weights: bool = False
    # The replicas already placed here and what each holds; gpus_in_use includes their GPUs.
    reserved: tuple[Reservation, ...] = attrs.field(default=(), converter=tuple)

    @classmethod
    def from_inventory(
        cls,
        node_id: str,
        state: NodeState,
        cordoned: bool,
        inventory: Inventory,
        gpus_in_use: Iterable[int] = frozenset(),
        replicas: Mapping[str, int] | None = None,
        engines_reason: str | None = None,
        weights_free_bytes: int | None = None,
        reserved: Iterable[Reservation] = (),
    ) -> NodeSnapshot:
        """*reserved* is what the replicas already on the node hold; their GPUs count as in use."""
        reserved = tuple(reserved)
        engines = None if inventory.engines is None else list(inventory.engines)
        fabrics = frozenset(a.fabric for a in inventory.infiniband or () if a.fabric)
        return cls(
            id=node_id,
            state=state,
            cordoned=cordoned,
            labels=dict(inventory.labels),
            memory_total_bytes=inventory.memory_total_bytes,
            engines=engines,
            gpus=None if inventory.gpus is None else list(inventory.gpus),
            gpus_in_use=frozenset(gpus_in_use).union(*(r.gpus for r in reserved)),
            fabrics=fabrics,
            replicas=dict(replicas or {}),
            engines_reason=engines_reason,
            weights_free_bytes=weights_free_bytes,
            reserved=reserved,
        )

    def free_gpus(self) -> list[int]:
        """Indices of the reported GPUs no placed shard holds, lowest first; [] if unreported."""
        return sorted({g.index for g in self.gpus or ()} - self.gpus_in_use)

    def memory_reserved_bytes(self) -> int:
        """Host memory the replicas placed here reserve between them (those stating none add nothing)."""
        return sum(r.memory_bytes for r in self.reserved if r.memory_bytes is not None)


@attrs.frozen
class PlacementRequest:
    """What one replica needs: per rank, ``gpus`` GPUs on each of ``ranks`` nodes."""

    model: str
    engine: str
    gpus: int = attrs.field(default=0, validator=_non_negative)
    # None: no memory requirement stated (not "needs zero").
    min_memory_gb: float | None = attrs.field(default=None, validator=_non_negative)
    node_selector: dict[str, str] = attrs.Factory(dict)
    ranks: int = attrs.field(default=1, validator=_at_least_one)
    # Free memory each handed-out GPU must have; None: no requirement.
    min_gpu_free_bytes: int | None = attrs.field(default=None, validator=_non_negative)
    # Room the weights need where a node fetches them; None: not stated.
    disk_gb: float | None = attrs.field(default=None, validator=_non_negative)
    # The build the catalog runs the engine at (server.yaml engines.NAME.version);
    # None: any build will do.
    engine_version: str | None = None

    @classmethod
    def from_profile(cls, model_name: str, profile: Profile, engine_version: str | None = None) -> PlacementRequest:
        """The request for one replica of *model_name* run with *profile*, on *engine_version* when given."""
        per_gpu = profile.min_gpu_free_gb
        return cls(
            model=model_name,
            engine=profile.engine,
            engine_version=engine_version,
            gpus=profile.gpus,
            min_memory_gb=profile.min_memory_gb,
            node_selector=dict(profile.node_selector),
            ranks=profile.ranks,
            min_gpu_free_bytes=None if per_gpu is None else round(per_gpu * filters.GB),
        )

    def memory_bytes(self) -> int | None:
        """Host memory each rank reserves on its node: a CPU profile's min_memory_gb; None: nothing reserved."""
        return memory_reservation(self.gpus, self.min_memory_gb)


def memory_reservation(gpus: int, min_memory_gb: float | None) -> int | None:
    """The host memory one rank of a profile asking for *gpus* and *min_memory_gb* reserves.

    A GPU profile reserves its GPUs whole instead; its min_memory_gb stays a
    check of the machine's total.  None is "states no need", never zero.
    """
    if gpus or min_memory_gb is None:
        return None
    return round(min_memory_gb * filters.GB)


@attrs.frozen
class RankPlacement:
    node_id: str
    gpus: list[int]  # NVML indices, for the shard's CUDA_VISIBLE_DEVICES


@attrs.frozen
class Placement:
    """Where every rank of one replica goes; ``ranks[0]`` is the leader."""

    ranks: list[RankPlacement]
    # The fabric all ranks share; None for a single-rank replica.
    fabric: str | None = None
    # Host memory each rank reserves on its node; None: nothing (see PlacementRequest.memory_bytes).
    memory_bytes: int | None = None

    def apply_to(self, nodes: Iterable[NodeSnapshot], model: str, replica: str | None = None) -> Snapshots:
        """*nodes* as they will be once this replica runs: its GPUs and memory held, one more replica of *model*.

        *replica* names it in later refusals ("after echo/0"); without it, the model's name does.
        Placing several replicas in one pass is ``place`` then ``apply_to``, again and again.
        Only the nodes given a rank are re-made; the others are the very snapshots given.
        """
        fleet = Snapshots.of(nodes)
        given = {r.node_id: r.gpus for r in self.ranks}
        changes = {}
        for node_id, gpus in given.items():
            held = Reservation(replica or model, self.memory_bytes, gpus)
            for at in fleet.positions(node_id):
                node = fleet[at]
                replicas = dict(node.replicas)
                replicas[model] = replicas.get(model, 0) + 1
                changes[at] = attrs.evolve(
                    node, gpus_in_use=node.gpus_in_use | held.gpus, replicas=replicas,
                    reserved=(*node.reserved, held),
                )
        return fleet.replacing(changes)


@attrs.frozen
class Unplaceable:
    """No node can take the replica; ``reasons`` maps every node id to why not."""

    reasons: dict[str, str]

    def lines(self) -> list[str]:
        """One line per node, by node id: "node05: has 8 GB of memory, needs 24"."""
        return [f"{node_id}: {self.reasons[node_id]}" for node_id in sorted(self.reasons)]

    def summary(self) -> str:
        if not self.reasons:
            return "no node can hold it: there are no nodes"
        return "no node can hold it: " + "; ".join(self.lines())


def place(
    request: PlacementRequest, nodes: Iterable[NodeSnapshot], holds: frozenset[str] = frozenset()
) -> Placement | Unplaceable:
    """One replica of *request* on *nodes*; *holds* is the ids of nodes that already hold its weights.

    Node ids are unique in a fleet; should *nodes* repeat one, the last snapshot wins.
    """
    fleet = Snapshots.of(nodes)
    if index.applies(request):
        best = fleet.best(request, holds)
        if best is None:
            return Unplaceable(filters.run(request, fleet.unique())[1])
        return Placement([RankPlacement(best.id, _gpus_for(request, best))], memory_bytes=request.memory_bytes())
    return place_plainly(request, fleet.unique(), holds)


def place_plainly(
    request: PlacementRequest, nodes: Iterable[NodeSnapshot], holds: frozenset[str] = frozenset()
) -> Placement | Unplaceable:
    """``place`` the straightforward way: every filter over every node, every node kept scored and sorted.

    What ``place`` does for a replica of several ranks, and the reference its index is tested against.
    """
    fleet = list({node.id: node for node in nodes}.values())
    kept, reasons = filters.run(request, fleet)
    if not kept:
        return Unplaceable(reasons)
    if request.ranks == 1:
        best = scorers.ranked(request, kept, holds)[0]
        return Placement([RankPlacement(best.id, _gpus_for(request, best))], memory_bytes=request.memory_bytes())
    return _place_ranks(request, kept, holds, reasons)


def _place_ranks(
    request: PlacementRequest,
    kept: Sequence[NodeSnapshot],
    holds: frozenset[str],
    reasons: dict[str, str],
) -> Placement | Unplaceable:
    """Every rank on its own node, all in the one fabric whose best nodes score highest."""
    best: tuple[float, str, list[NodeSnapshot]] | None = None
    for fabric in sorted({f for node in kept for f in node.fabrics}):
        members = [node for node in kept if fabric in node.fabrics]
        if len(members) < request.ranks:
            continue
        chosen = scorers.ranked(request, members, holds)[: request.ranks]
        total = sum(scorers.total(request, node, holds) for node in chosen)
        # Highest total wins; on a tie the fabric first by name, as it came first.
        if best is None or total > best[0]:
            best = (total, fabric, chosen)
    if best is None:
        # The fabric filter keeps only nodes of a fabric with room for every
        # rank, so this is unreachable; refuse rather than place half a replica.
        why = f"no fabric has {request.ranks} nodes that can each take a rank"
        return Unplaceable({**reasons, **{node.id: why for node in kept}})
    _, fabric, chosen = best
    return Placement(
        [RankPlacement(n.id, _gpus_for(request, n)) for n in chosen], fabric=fabric,
        memory_bytes=request.memory_bytes(),
    )


def _gpus_for(request: PlacementRequest, node: NodeSnapshot) -> list[int]:
    """The lowest free indices that qualify: simple, and the same answer every time."""
    if request.gpus == 0:
        return []
    return filters.usable_gpus(request, node)[: request.gpus]
