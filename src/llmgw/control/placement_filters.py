"""Which nodes could take a replica at all, and in each refused node's terms why not.

Every filter is ``filter(request, nodes) -> (kept, reasons)``: ``reasons`` maps
the id of each node it refused to a sentence about that node, written to follow
its id ("node05: " + "has 8 GB of memory, needs 24").  ``run`` applies them in
the order of ``FILTERS``, so a node is refused for the first thing wrong with
it, most basic first: nobody needs to read about memory on a node that is down.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from llmgw.sizes import GB, gb, gb_short_of
from llmgw.states import EngineState, NodeState

if TYPE_CHECKING:
    from llmgw.control.placement import NodeSnapshot, PlacementRequest
    from llmgw.records import EngineInfo

Reasons = dict[str, str]
Filter = Callable[["PlacementRequest", Sequence["NodeSnapshot"]], tuple[list["NodeSnapshot"], Reasons]]

# EngineInfo.origin of a build the operator named on the node itself.
AGENT_YAML = "agent.yaml"

def each_node(check: Callable[[PlacementRequest, NodeSnapshot], str | None]) -> Filter:
    """A filter from a check of one node that returns why it is refused, or None."""

    def filter(request: PlacementRequest, nodes: Sequence[NodeSnapshot]) -> tuple[list[NodeSnapshot], Reasons]:
        kept, reasons = [], {}
        for node in nodes:
            why = check(request, node)
            if why is None:
                kept.append(node)
            else:
                reasons[node.id] = why
        return kept, reasons

    filter.__name__ = check.__name__
    filter.__doc__ = check.__doc__
    filter.check = check  # type: ignore[attr-defined]
    return filter


@each_node
def ready(request: PlacementRequest, node: NodeSnapshot) -> str | None:
    """Heartbeats arriving, and not cordoned by an operator."""
    if node.state != NodeState.READY:
        return f"is {node.state}"
    if node.cordoned:
        return "is cordoned"
    return None


@each_node
def labels(request: PlacementRequest, node: NodeSnapshot) -> str | None:
    """Every label of the profile's node_selector, with the value it asks for."""
    for key in sorted(request.node_selector):
        wanted = request.node_selector[key]
        if key not in node.labels:
            return f"label {key}={wanted} wanted, has no label {key}"
        if node.labels[key] != wanted:
            return f"label {key}={wanted} wanted, has {key}={node.labels[key]}"
    return None


@each_node
def engine(request: PlacementRequest, node: NodeSnapshot) -> str | None:
    """The engine installed and seen to run, at the catalog's version; a node too old to say is not refused.

    A build named in the node's agent.yaml is taken at whatever version it
    is, and so is one an agent older than install states reported: neither
    can install another.  Otherwise the refusal is the node's own words for
    the build it is missing.
    """
    if node.engines is None:
        return None
    name, wanted = request.engine, request.engine_version
    mine = [e for e in node.engines if e.name == name]
    usable = [e for e in mine if e.state in (None, EngineState.INSTALLED)]
    if any(wanted is None or e.version == wanted or e.origin == AGENT_YAML or e.state is None for e in usable):
        return None
    wanted_entry = next((e for e in mine if wanted is not None and e.version == wanted), None)
    if usable:
        has = " and ".join(sorted({e.version or "of no stated version" for e in usable}))
        why = f"has {name} {has}, needs {wanted}"
        if wanted_entry is not None and wanted_entry.state == EngineState.INSTALLING:
            return f"{why}: installing"
        if wanted_entry is not None and wanted_entry.state == EngineState.BROKEN:
            return f"{why}: broken: {wanted_entry.reason or 'no reason given'}"
        return why
    entry = wanted_entry or next((e for e in mine if e.state != EngineState.ABSENT), None)
    if entry is not None and entry.state == EngineState.INSTALLING:
        return _installing(entry)
    if entry is not None and entry.state == EngineState.BROKEN:
        return _broken(entry)
    absent = next((e for e in mine if e.reason), None)
    return (absent.reason if absent else None) or node.engines_reason or f"has no {name} engine"


def _installing(entry: EngineInfo) -> str:
    reason = entry.reason or f"{entry.name} {entry.version or ''}".rstrip()
    # Some agents' words already begin so ("installing: pip install vllm==0.11.0").
    return reason if reason.startswith("installing") else f"installing: {reason}"


def _broken(entry: EngineInfo) -> str:
    return f"{entry.name} broken: {entry.reason}" if entry.reason else f"{entry.name} broken"


@each_node
def memory(request: PlacementRequest, node: NodeSnapshot) -> str | None:
    """At least min_memory_gb of memory in all, and for a CPU profile that much left unreserved.

    What is left is the node's total less what the replicas already placed
    there reserve, never its reported available memory, which already counts
    the engines running there.  A node that did not say is not refused.
    """
    need = request.min_memory_gb
    has = node.memory_total_bytes
    if need is None or has is None:
        return None
    if has < need * GB:
        return f"has {gb_short_of(has, need)} GB of memory, needs {number(need)}"
    if request.memory_bytes() is None:
        return None
    left = max(0, has - node.memory_reserved_bytes())
    if left >= need * GB:
        return None
    holders = [r.replica for r in node.reserved if r.memory_bytes]
    return f"{gb_short_of(left, need)} GB of {gb(has)} left after {names(holders)}, needs {number(need)}"


@each_node
def disk(request: PlacementRequest, node: NodeSnapshot) -> str | None:
    """Room for the weights, shaped like the memory check — and skipped on a node holding them.

    Holding the file is what used the space: without the exception the node
    best placed to run a model would be the one most likely refused.
    """
    need = request.disk_gb
    has = node.weights_free_bytes
    if need is None or has is None or node.holds_weights or has >= need * GB:
        return None
    return f"has {gb_short_of(has, need)} GB free for weights, needs {number(need)}"


@each_node
def gpus(request: PlacementRequest, node: NodeSnapshot) -> str | None:
    """Enough GPUs that no shard holds, each with enough free memory when that is asked for.

    A node that did not report its GPUs is refused a GPU request, unlike one that
    did not report its memory: a shard needs concrete GPU indices, and handing
    out cards nobody has seen fails on the node for certain.
    """
    need = request.gpus
    if need == 0:
        return None
    if node.gpus is None:
        return f"did not say how many GPUs it has, needs {need}"
    if not node.gpus:
        return f"has no GPUs, needs {need}"
    free = node.free_gpus()
    if len(free) < need:
        return f"has {count(len(free), 'free GPU')}, needs {need}{_gpu_holders(node)}"
    usable = usable_gpus(request, node)
    if len(usable) < need:
        return (
            f"has {count(len(usable), 'free GPU')} with {gb(request.min_gpu_free_bytes)} GB free,"
            f" needs {need}{_gpu_holders(node)}"
        )
    return None


def _gpu_holders(node: NodeSnapshot) -> str:
    """"; echo/0 and qwen/1 hold 6 of 8": whose the node's taken cards are, as the memory refusal says."""
    cards = {g.index for g in node.gpus or ()}
    holders = [r for r in node.reserved if r.gpus & cards]
    if not holders:
        return ""
    held = len(cards & frozenset().union(*(r.gpus for r in holders)))
    verb = "holds" if len({r.replica for r in holders}) == 1 else "hold"
    return f"; {names([r.replica for r in holders])} {verb} {held} of {len(cards)}"


def fabric(request: PlacementRequest, nodes: Sequence[NodeSnapshot]) -> tuple[list[NodeSnapshot], Reasons]:
    """A replica of several ranks needs that many nodes on one InfiniBand fabric.

    Keeps every node of every fabric with enough nodes left after the other
    filters; ``place`` chooses among those fabrics.  Run it last, since what
    it counts is the nodes every other filter kept.
    """
    ranks = request.ranks
    if ranks == 1:
        return list(nodes), {}
    members: dict[str, int] = {}
    for node in nodes:
        for name in node.fabrics:
            members[name] = members.get(name, 0) + 1
    kept, reasons = [], {}
    for node in nodes:
        if not node.fabrics:
            reasons[node.id] = f"is on no InfiniBand fabric; a {ranks}-rank replica needs one"
        elif any(members[name] >= ranks for name in node.fabrics):
            kept.append(node)
        else:
            names = ", ".join(sorted(node.fabrics))
            most = max(members[name] for name in node.fabrics)
            reasons[node.id] = (
                f"is on {names}, where only {count(most, 'node')} can take a rank"
                f" and a {ranks}-rank replica needs {ranks}"
            )
    return kept, reasons


FILTERS: tuple[Filter, ...] = (ready, labels, engine, memory, disk, gpus, fabric)


def run(request: PlacementRequest, nodes: Sequence[NodeSnapshot]) -> tuple[list[NodeSnapshot], Reasons]:
    """Every filter in turn; a node refused by one is not shown to the next."""
    kept, reasons = list(nodes), {}
    for step in FILTERS:
        kept, refused = step(request, kept)
        reasons.update(refused)
    return kept, reasons


def usable_gpus(request: PlacementRequest, node: NodeSnapshot) -> list[int]:
    """Free GPU indices with at least min_gpu_free_bytes free, lowest first.

    A card that did not report its memory counts as usable, as a node that did
    not report its memory does.
    """
    want = request.min_gpu_free_bytes
    if want is None:
        return node.free_gpus()
    cards = {}
    for card in node.gpus or ():
        cards.setdefault(card.index, card)
    usable = []
    for index in node.free_gpus():
        card = cards[index]
        total, used = card.memory_total_bytes, card.memory_used_bytes
        if total is None or used is None or total - used >= want:
            usable.append(index)
    return usable


# -- how figures read in a sentence --


def count(n: int, noun: str) -> str:
    if n == 0:
        return f"no {noun}s"
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


#: Replicas a refusal names before it counts the rest.
NAMED = 4


def names(replicas: Sequence[str]) -> str:
    """"echo/0", "echo/0 and qwen/1", "a/0, b/0, c/0, d/0 and 3 more": sorted, and
    bounded, since a node may hold hundreds of small replicas."""
    shown = sorted(set(replicas))  # a model's name stands for each of its unnamed replicas
    if len(shown) > NAMED:
        shown = [*shown[:NAMED], f"{len(shown) - NAMED} more"]
    if len(shown) < 2:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def number(value: float) -> str:
    """A figure an operator wrote, as they would write it: 24, 7.5, 0.25."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")
