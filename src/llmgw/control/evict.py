"""Making room: which idle replicas to stop so that a model with requests waiting can be placed.

When placement cannot fit a replica of a model that has requests waiting,
the control plane may stop idle replicas of *other* models to make room:

- only replicas of equal or lower ``scale.priority``;
- never one with a request in flight in any router, nor one of a model with
  requests queued or held;
- never below its model's ``min`` (a fixed ``replicas: N`` is at its min);
- least recently used first (the model's last request, oldest first; a
  model never asked is older than any).

``choose`` tries the candidates in that order, each time as if those before
had gone, until placement fits; then drops again any it turns out not to
need (one on a node placement did not use).  When nothing can go, its
answer names what holds the memory and why each stays.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from llmgw.control import placement
from llmgw.render import age


@attrs.frozen
class Candidate:
    """A running replica that might make room, and what decides whether it may."""

    replica: str
    model: str
    nodes: tuple[str, ...]
    priority: int
    # Seconds since its model's last request; None: never asked since the server started.
    idle_s: float | None
    inflight: int
    # Requests of its model queued or held: a model with waiting requests keeps its replicas.
    waiting: int
    # How many replicas of its model may still go before it is at its min.
    spare: int

    def words(self, priority: int) -> str:
        idle = "never asked" if self.idle_s is None else f"idle {age(self.idle_s)}"
        return f"{idle}, priority {self.priority} ≤ {priority}"


def _kept(c: Candidate, priority: int) -> str | None:
    """Why *c* may not make room; None when it may."""
    where = f"{c.replica} on {', '.join(c.nodes)}"
    if c.priority > priority:
        return f"{where}: priority {c.priority} > {priority}"
    if c.inflight:
        return f"{where}: {c.inflight} request(s) in flight"
    if c.waiting:
        return f"{where}: {c.waiting} request(s) of {c.model} waiting"
    if c.spare <= 0:
        return f"{where}: {c.model} is at its min"
    return None


def without(nodes: Iterable[placement.NodeSnapshot], replica: str, model: str) -> list[placement.NodeSnapshot]:
    """*nodes* as they would be once *replica* is stopped: its GPUs, memory and count given back."""
    out = []
    for node in nodes:
        held = [r for r in node.reserved if r.replica == replica]
        if not held:
            out.append(node)
            continue
        replicas = dict(node.replicas)
        replicas[model] = max(0, replicas.get(model, 0) - len(held))
        gpus = frozenset().union(*(r.gpus for r in held))
        out.append(attrs.evolve(node, reserved=tuple(r for r in node.reserved if r.replica != replica),
                                gpus_in_use=node.gpus_in_use - gpus, replicas=replicas))
    return out


def choose(request: placement.PlacementRequest, nodes: Sequence[placement.NodeSnapshot], holds: frozenset[str],
           candidates: Iterable[Candidate], priority: int) -> tuple[list[Candidate], str]:
    """The replicas to stop, least recently used first, and words; ``([], why)`` when nothing can make room."""
    allowed, kept = [], []
    spare: dict[str, int] = {}
    for c in sorted(candidates, key=lambda c: (-(c.idle_s if c.idle_s is not None else float("inf")), c.replica)):
        why = _kept(c, priority)
        if why is None and spare.setdefault(c.model, c.spare) <= 0:
            why = f"{c.replica} on {', '.join(c.nodes)}: {c.model} is at its min"
        if why is not None:
            kept.append(why)
            continue
        spare[c.model] -= 1
        allowed.append(c)
    chosen: list[Candidate] = []
    trial = list(nodes)
    for c in allowed:
        chosen.append(c)
        trial = without(trial, c.replica, c.model)
        if isinstance(placement.place(request, trial, holds), placement.Placement):
            return _needed(request, nodes, holds, chosen), ""
    held = "; ".join(kept) if kept else "no replica runs that could be stopped"
    if allowed:
        held = f"stopping every idle replica would not be enough ({', '.join(c.replica for c in allowed)}); {held}"
    return [], f"nothing can be stopped to make room: {held}"


def _needed(request: placement.PlacementRequest, nodes: Sequence[placement.NodeSnapshot], holds: frozenset[str],
            chosen: list[Candidate]) -> list[Candidate]:
    """*chosen* less any it still fits without, the most recently used tried first."""
    needed = list(chosen)
    for c in reversed(chosen[:-1]):
        rest = [o for o in needed if o is not c]
        trial = list(nodes)
        for o in rest:
            trial = without(trial, o.replica, o.model)
        if isinstance(placement.place(request, trial, holds), placement.Placement):
            needed = rest
    return needed
