"""Which of the nodes that could take a replica should: weighted scores, summed.

The weights are far apart on purpose, so the sum reads as an order rather than
a trade: a node with fewer replicas of the model always wins (spread, 100);
among those, one that already holds the weights (10); among those, the best
fit for the GPUs asked for (pack, at most 1); and last the node id, so equal
nodes are chosen the same way every time.  docs/placement.rst says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from llmgw.control.placement import NodeSnapshot, PlacementRequest


@attrs.frozen
class Scorer:
    name: str
    weight: float
    score: Callable[[PlacementRequest, NodeSnapshot, frozenset[str]], float]


def spread(request: PlacementRequest, node: NodeSnapshot, holds: frozenset[str]) -> float:
    """Minus the replicas of this model already on the node: two replicas on one
    node are one failure away from none."""
    return -float(node.replicas.get(request.model, 0))


def holds_weights(request: PlacementRequest, node: NodeSnapshot, holds: frozenset[str]) -> float:
    """1 on a node that already holds the model's weights, which then starts without
    moving tens of gigabytes; 0 elsewhere, and everywhere while *holds* is empty."""
    return 1.0 if node.id in holds else 0.0


def pack_gpus(request: PlacementRequest, node: NodeSnapshot, holds: frozenset[str]) -> float:
    """1 / (1 + GPUs left free after placing here), for a GPU request; 0 otherwise.

    Best fit: a one-GPU model goes to the node with one GPU free rather than
    breaking into a whole eight-GPU node that a big model will need.
    """
    if request.gpus == 0:
        return 0.0
    left = max(0, len(node.free_gpus()) - request.gpus)
    return 1.0 / (1 + left)


SCORERS: tuple[Scorer, ...] = (
    Scorer("spread", 100.0, spread),
    Scorer("holds the weights", 10.0, holds_weights),
    Scorer("pack GPUs", 1.0, pack_gpus),
)


def scores(request: PlacementRequest, node: NodeSnapshot, holds: frozenset[str] = frozenset()) -> dict[str, float]:
    """Each scorer's weighted contribution for *node*, by scorer name: what a log or ctl can show."""
    return {s.name: s.weight * s.score(request, node, holds) for s in SCORERS}


def total(request: PlacementRequest, node: NodeSnapshot, holds: frozenset[str] = frozenset()) -> float:
    return sum(scores(request, node, holds).values())


def ranked(
    request: PlacementRequest, nodes: Sequence[NodeSnapshot], holds: frozenset[str] = frozenset()
) -> list[NodeSnapshot]:
    """*nodes*, best first; equal scores in node id order."""
    return sorted(nodes, key=lambda node: (-total(request, node, holds), node.id))
