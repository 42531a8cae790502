"""The fleet as placement sees it, indexed so that one decision does not read every node.

``Snapshots`` is a sequence of ``NodeSnapshot`` that ``place`` and
``Placement.apply_to`` take and give back.  Placing a replica changes one
node (a few, for several ranks), so ``apply_to`` copies the list and replaces
those, rather than re-making every snapshot; and the snapshots carry an index
that remembers, for each kind of request, which nodes the filters keep,
ordered as the scorers would choose among them.  A decision then reads the
few nodes the index names instead of filtering and scoring the whole fleet.

The answers are the plain ones, by construction: the index runs the same
filter checks on the same nodes, the final choice is the scorers' own order
over its candidates, and where a refusal is due the reasons are what
``filters.run`` says over the whole fleet.  tests/control/test_placement_index.py
holds it to a straightforward reference over a varied fleet.

What the index relies on, and checks before it is used (``applies``): every
filter but ``fabric`` judges one node alone, and ``fabric`` keeps every node
for a single-rank replica; every scorer reads nothing of a node but the
replicas of the model on it, whether it holds the weights (*holds*), and how
many GPUs it has free.  A replica of several ranks, or a filter or scorer
beyond those, is placed the plain way.

The index is not shared: the snapshots ``apply_to`` or ``holding_weights``
derives take it over from the ones they came from, which build a new one
should they be asked to place again.  Snapshots are never changed in place.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, overload

import attrs

from llmgw.control import placement_filters as filters
from llmgw.control import placement_scorers as scorers

if TYPE_CHECKING:
    from llmgw.control.placement import NodeSnapshot, PlacementRequest

# The scorers the index knows how to narrow the choice for; see the module's docstring.
_KNOWN_SCORERS = (scorers.spread, scorers.holds_weights, scorers.pack_gpus)
# The filter that reads a request's own weights' size: a catalog has as many
# of those as models, so it is checked per candidate instead of in the index.
_PER_CANDIDATE = (filters.disk,)


def applies(request: PlacementRequest) -> bool:
    """Whether the index gives the plain answer for *request*: a single rank, and the filters and scorers it knows."""
    if request.ranks != 1:
        return False
    if tuple(s.score for s in scorers.SCORERS) != _KNOWN_SCORERS:
        return False
    return all(hasattr(step, "check") or step is filters.fabric for step in filters.FILTERS)


class Snapshots(Sequence["NodeSnapshot"]):
    """The nodes, in the order given, repeats and all; ``unique()`` is what placement reads (the last of an id wins)."""

    __slots__ = ("_nodes", "_positions", "_holding", "_index")

    def __init__(self, nodes: Iterable[NodeSnapshot] = ()):
        self._nodes: list[NodeSnapshot] = list(nodes)
        # id -> where it stands: the last place, and every place of an id given more than once
        last = {node.id: at for at, node in enumerate(self._nodes)}
        positions: dict[str, list[int]] = {}
        if len(last) < len(self._nodes):
            for at, node in enumerate(self._nodes):
                positions.setdefault(node.id, []).append(at)
        self._positions: tuple[Mapping[str, int], Mapping[str, list[int]]] = (last, positions)
        self._holding = frozenset(at for at, node in enumerate(self._nodes) if node.holds_weights)
        self._index: _Index | None = None

    @classmethod
    def of(cls, nodes: Iterable[NodeSnapshot]) -> Snapshots:
        """*nodes* as Snapshots: themselves if they already are."""
        return nodes if isinstance(nodes, Snapshots) else cls(nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, at: int) -> NodeSnapshot: ...

    @overload
    def __getitem__(self, at: slice) -> list[NodeSnapshot]: ...

    def __getitem__(self, at):
        return self._nodes[at]

    def __iter__(self) -> Iterator[NodeSnapshot]:
        return iter(self._nodes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Snapshots):
            return self._nodes == other._nodes
        if isinstance(other, list):
            return self._nodes == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Snapshots({self._nodes!r})"

    def unique(self) -> list[NodeSnapshot]:
        """One snapshot per id, the last given, at the place its id first came."""
        return list(self.index().nodes.values())

    def holding_weights(self, holds: Iterable[str]) -> Snapshots:
        """These nodes with ``holds_weights`` true exactly for the ids in *holds*; only those that change are re-made."""
        holds = frozenset(holds)
        wanted = {at for node_id in holds for at in self.positions(node_id)}
        changes = {at: attrs.evolve(self._nodes[at], holds_weights=at in wanted) for at in wanted ^ self._holding}
        return self.replacing(changes)

    def replacing(self, changes: Mapping[int, NodeSnapshot]) -> Snapshots:
        """These nodes with the one at each position of *changes* replaced; each must keep its id."""
        if not changes:
            return self
        derived = Snapshots.__new__(Snapshots)
        derived._nodes = nodes = list(self._nodes)
        derived._positions = self._positions
        holding = set(self._holding)
        for at, node in changes.items():
            if node.id != nodes[at].id:
                raise ValueError(f"position {at} holds {nodes[at].id}, not {node.id}")
            nodes[at] = node
            (holding.add if node.holds_weights else holding.discard)(at)
        derived._holding = frozenset(holding)
        derived._index, self._index = self._index, None
        if derived._index is not None:
            for node_id in {nodes[at].id for at in changes}:
                derived._index.replace(nodes[self._positions[0][node_id]])
        return derived

    def positions(self, node_id: str) -> list[int]:
        """Where *node_id* stands in the sequence; [] where it is not in it."""
        last, repeated = self._positions
        if node_id in repeated:
            return list(repeated[node_id])
        return [last[node_id]] if node_id in last else []

    def index(self) -> _Index:
        if self._index is None:
            self._index = _Index(self._nodes)
        return self._index

    def best(self, request: PlacementRequest, holds: frozenset[str]) -> NodeSnapshot | None:
        """The node the scorers rank first among those the filters keep for *request*; None: none is kept.

        Only for a request the index ``applies`` to.
        """
        return self.index().best(request, holds)


class _Shape:
    """The nodes the filters keep for one kind of request, in the order the scorers prefer them all else equal."""

    __slots__ = ("request", "checks", "keys", "order")

    def __init__(self, request: PlacementRequest, nodes: Iterable[NodeSnapshot]):
        self.request = request
        self.checks = tuple(step.check for step in filters.FILTERS if hasattr(step, "check")
                            and step not in _PER_CANDIDATE)
        # node id -> its place in order, for every node kept
        self.keys: dict[str, tuple[int, str]] = {}
        self.order: list[tuple[int, str]] = []
        for node in nodes:
            key = self._key(node)
            if key is not None:
                self.keys[node.id] = key
                self.order.append(key)
        self.order.sort()

    def _key(self, node: NodeSnapshot) -> tuple[int, str] | None:
        """Where the node sorts, or None where a filter refuses it.

        Fewest GPUs free first, as pack_gpus prefers, then by id; by id alone
        for a request of no GPUs, which every node packs alike.
        """
        request = self.request
        for check in self.checks:
            if check(request, node) is not None:
                return None
        return (len(node.free_gpus()) if request.gpus else 0, node.id)

    def replace(self, node: NodeSnapshot) -> None:
        old = self.keys.pop(node.id, None)
        if old is not None:
            del self.order[bisect.bisect_left(self.order, old)]
        key = self._key(node)
        if key is not None:
            self.keys[node.id] = key
            bisect.insort(self.order, key)


def _shape_of(request: PlacementRequest) -> tuple:
    """What the kept nodes depend on: every field of the request but the model and the per-candidate ones."""
    return tuple(
        (field.name, _hashable(getattr(request, field.name)))
        for field in attrs.fields(type(request))
        if field.name not in ("model", "disk_gb")
    )


def _hashable(value):
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    return (type(value), value)


class _Index:
    __slots__ = ("nodes", "holders", "shapes")

    def __init__(self, nodes: Iterable[NodeSnapshot]):
        self.nodes: dict[str, NodeSnapshot] = {node.id: node for node in nodes}
        # model -> ids of the nodes already running some of it, whose spread differs
        self.holders: dict[str, set[str]] = {}
        for node in self.nodes.values():
            self._hold(node, True)
        self.shapes: dict[tuple, _Shape] = {}

    def _hold(self, node: NodeSnapshot, on: bool) -> None:
        for model, count in node.replicas.items():
            if count != 0:
                ids = self.holders.setdefault(model, set())
                (ids.add if on else ids.discard)(node.id)

    def replace(self, node: NodeSnapshot) -> None:
        old = self.nodes.get(node.id)
        if old is node:
            return
        if old is not None:
            self._hold(old, False)
        self.nodes[node.id] = node
        self._hold(node, True)
        for shape in self.shapes.values():
            shape.replace(node)

    def best(self, request: PlacementRequest, holds: frozenset[str]) -> NodeSnapshot | None:
        key = _shape_of(request)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape(request, self.nodes.values())
        # Every node outside these scores the same but for its free GPUs, so
        # the first of them in order is the best of them.
        unlike = self.holders.get(request.model, set()) | holds
        candidates = [self.nodes[i] for i in unlike if i in shape.keys and self._fits(request, self.nodes[i])]
        for _, node_id in shape.order:
            if node_id not in unlike and self._fits(request, self.nodes[node_id]):
                candidates.append(self.nodes[node_id])
                break
        if not candidates:
            return None
        return min(candidates, key=lambda node: (-scorers.total(request, node, holds), node.id))

    @staticmethod
    def _fits(request: PlacementRequest, node: NodeSnapshot) -> bool:
        return all(step.check(request, node) is None for step in _PER_CANDIDATE)
