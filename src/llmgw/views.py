"""What the control plane hands to ctl, the dashboard, the collector and the routers.

Frozen records, built from the fleet by the control plane and sent with
``llmgw.wire.to_wire``, so their field names are the JSON keys ctl and the
TUI have always read.  A reader builds them back with ``from_wire``: keys it
does not know are ignored (a newer server) and keys it is not sent stay
``None`` (an older one) — absent is not zero, and every display shows ``-``.

A state is a member of ``llmgw.states`` when it is one this code knows, and
the string as it was sent when it is not (a newer server's), so one new state
does not make a whole answer unreadable.

What the control plane answers a command (cordon, drain, reload, logs,
weights, onboarding's) is not a view of the fleet: it is in ``llmgw.answers``.
"""

from __future__ import annotations

import enum
from typing import Callable

import attrs

from llmgw.records import (
    CPU, GPU, IDENT, TIME, EngineInfo, Filesystem, IBAdapter, Inventory, Progress, ShardStatus, WeightsReport,
)
from llmgw.states import NodeState, ReplicaState, ShardState
from llmgw.wire import field
from llmgw.wiretext import Text

#: The inventory's facts a node view carries, flattened beside the node's own
#: fields; the view's id and cordon are the fleet's, its shards have their own views;
#: ``fencing`` says how the agent takes commands (llmgw.ha.fence), not what the node is.
NODE_FACTS = tuple(f.name for f in attrs.fields(Inventory) if f.name not in ("node_id", "cordoned", "shards", "fencing"))


def _known(states: type) -> Callable:
    def convert(value):
        try:
            return states(value)
        except ValueError:
            return value  # None, or a state only a newer server knows: kept as it was sent
    return convert


@attrs.frozen
class NodeView:
    """A node as ``llmgw.cp.nodes`` and ``llmgw.event.node`` give it."""

    id: str
    state: str | None = attrs.field(default=None, converter=_known(NodeState))
    reason: str | None = None
    cordoned: bool | None = None
    last_seen: float | None = None
    seen_ago_s: float | None = None
    state_since: float | None = None
    registered_at: float | None = None
    # What the node reported (``NODE_FACTS``), as in ``Inventory``.
    protocol: int | None = None
    agent_version: str | None = None
    address: str | None = None
    hostname: str | None = None
    os: str | None = None
    kernel: str | None = None
    arch: str | None = None
    cpu: CPU | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    nvidia_driver: str | None = None
    gpus: list[GPU] | None = None
    filesystems: list[Filesystem] | None = None
    infiniband: list[IBAdapter] | None = None
    labels: dict[str, str] = attrs.Factory(dict)
    engines: list[EngineInfo] | None = None
    weights: WeightsReport | None = None
    warnings: list[str] = attrs.Factory(list)
    # The control plane's, not the node's: when the node's certificate
    # expires (seconds since the epoch), and what the hub refused on its
    # behalf (a second agent with its certificate).
    certificate_not_after: float | None = None
    link_warnings: list[str] = attrs.Factory(list)

    @property
    def gpu_summary(self) -> GpuSummary | None:
        return GpuSummary.of(self.gpus)

    @property
    def disk_summary(self) -> DiskSummary | None:
        return DiskSummary.of(self.filesystems)


@attrs.frozen
class GpuSummary:
    """A node's GPUs as one line shows them: how many of each kind, their memory summed.

    A sum is None when one card did not report its figure: absent is not
    zero, and a sum of the others would read as the whole.
    """

    # Each card's name as the node gave it ("NVIDIA H100 80GB HBM3"; "GPU" for
    # a card without one), with how many of it, in the order the node listed them.
    kinds: dict[str, int] = attrs.Factory(dict)
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None

    @classmethod
    def of(cls, cards: list[GPU] | None) -> GpuSummary | None:
        """None when the node reported no GPUs at all; no kinds when it reported it has none."""
        if cards is None:
            return None
        kinds: dict[str, int] = {}
        used = total = 0
        for card in cards:
            name = card.name or "GPU"
            kinds[name] = kinds.get(name, 0) + 1
            if used is not None:
                used = None if card.memory_used_bytes is None else used + card.memory_used_bytes
            if total is not None:
                total = None if card.memory_total_bytes is None else total + card.memory_total_bytes
        return cls(kinds, used if cards else None, total if cards else None)


@attrs.frozen
class Space:
    """Free and total bytes of some filesystems, summed; both known, or the ``Space`` is not given."""

    free_bytes: int
    total_bytes: int

    @classmethod
    def of(cls, filesystems: list[Filesystem]) -> Space | None:
        """None when there are none, or one did not report a figure."""
        free = total = 0
        for f in filesystems:
            if f.free_bytes is None or f.total_bytes is None:
                return None
            free += f.free_bytes
            total += f.total_bytes
        return cls(free, total) if filesystems else None


@attrs.frozen
class DiskSummary:
    """A node's weights filesystems as one line shows them: local space, and shared apart (a filer's is everyone's)."""

    local: Space | None = None
    shared: Space | None = None

    @classmethod
    def of(cls, filesystems: list[Filesystem] | None) -> DiskSummary | None:
        """None when the node reported no filesystems."""
        if filesystems is None:
            return None
        return cls(Space.of([f for f in filesystems if not f.shared]), Space.of([f for f in filesystems if f.shared]))


@attrs.frozen
class NodeBrief:
    """A node as ``ctl nodes``' table shows it: ``llmgw.cp.nodes`` asked with ``brief=True``.

    What the table prints and no more: the node's state and why, where it
    is, its CPU, memory, GPUs counted by kind with their memory summed, its
    filesystems' space summed, its engines, and every warning.  An
    eight-GPU node's brief is about a third of its ``NodeView``; the full
    view (``ctl nodes --json``, the dashboard, the admin page) has the rest.
    Fields and absence read as in ``NodeView``.
    """

    id: str
    state: str | None = attrs.field(default=None, converter=_known(NodeState))
    reason: str | None = None
    cordoned: bool | None = None
    seen_ago_s: float | None = None
    address: str | None = None
    cpu: CPU | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    gpu_summary: GpuSummary | None = None
    disk_summary: DiskSummary | None = None
    engines: list[EngineInfo] | None = None
    warnings: list[str] = attrs.Factory(list)
    certificate_not_after: float | None = None
    link_warnings: list[str] = attrs.Factory(list)

    @classmethod
    def of(cls, view: NodeView) -> NodeBrief:
        """The brief of a full view: what a server that does not know ``brief`` is turned into."""
        return cls(**{f.name: getattr(view, f.name) for f in attrs.fields(cls)})


def engine_words(engine: EngineInfo) -> str:
    """One engine entry in full, as the log and node details say it.

    "llama.cpp b6000 installed"; "vllm absent (not in the catalog's engines,
    nor in agent.yaml)"; an agent older than install states: "llama.cpp b6000".
    """
    words = " ".join(w for w in (engine.name or "?", engine.version, engine.state) if w)
    return f"{words} ({engine.reason})" if engine.reason else words


def engines_words(engines: list[EngineInfo] | None) -> str:
    """Every entry of a node's report, "; " between them; "none" for an empty one, "-" for none reported."""
    if engines is None:
        return "-"
    return "; ".join(engine_words(e) for e in engines) or "none"


@attrs.frozen
class ShardView:
    """One shard of a replica view: where it runs and what its node says of it."""

    shard: str
    node: str | None = None
    state: str | None = attrs.field(default=None, converter=_known(ShardState))
    pid: int | None = None
    endpoint: str | None = None
    reason: str | None = None
    # A failed shard's last lines of output, as its node sent them; None otherwise.
    output_tail: list[str] | None = None
    rank: int | None = None
    # Seconds in its present state (a starting rank: how long it has waited,
    # and ``reason`` says for what); None: unknown.
    age_s: float | None = None
    # What a rank not yet ready waits for, in the control plane's words
    # ("waiting for rank 0's rendezvous on node01"); None: nothing, or not said.
    waiting: str | None = None
    # False: a rank placed and held for, not yet asked to start (it waits for
    # rank 0's rendezvous); None: an older server that did not say.
    started: bool | None = None


@attrs.frozen
class ReplicaView:
    """A slot of a model as ``llmgw.cp.replicas`` (``ctl replicas``) gives it."""

    model: str
    replica: str
    state: str | None = attrs.field(default=None, converter=_known(ReplicaState))
    # The nodes of its shards that are not lost, rank 0's first.
    nodes: list[str] = attrs.Factory(list)
    # Rank 0's, while the replica is ready or draining.
    endpoint: str | None = None
    age_s: float | None = None
    # None: unknown (nothing runs, or an agent too old to report a fingerprint).
    stale: bool | None = None
    fingerprint: str | None = None
    # Why it is not ready, in words; displayed, never decided on.
    reason: str | None = None
    progress: Progress | None = None
    shards: list[ShardView] = attrs.Factory(list)


@attrs.frozen
class ModelStatus:
    """One model's line of ``ctl status``: desired against ready."""

    model: str
    profile: str | None = None
    engine: str | None = None
    desired: int | None = None
    ready: int | None = None
    # Replicas by state; only the states some replica is in.
    states: dict[str, int] = attrs.Factory(dict)
    stale: int | None = None
    # Nodes holding the weights, per fabric ("-": on none).
    weights_by_fabric: dict[str, int] | None = None


class ServerRole(str, enum.Enum):
    """What a server of several (server.yaml's ``ha:``) is doing: leading, standing by, or neither yet."""

    LEADER = "leader"
    STANDBY = "standby"
    # Campaigning: no leader known (an election under way, or etcd not answering).
    CAMPAIGNING = "campaigning"


@attrs.frozen
class ServerView:
    """One server as it lists itself in etcd (``llmgw.ha.servers``): its name, role, URLs and epoch."""

    name: str = field(chars=253)
    role: str | None = attrs.field(default=None, converter=_known(ServerRole))
    # The hub URL agents and ctl dial (ha.advertise), and the OpenAI API's (ha.api_advertise).
    url: str | None = field(None, chars=512, text=Text.PATH)
    api_url: str | None = field(None, chars=512, text=Text.PATH)
    # The leader's epoch while it leads; None on a standby.
    epoch: int | None = field(None, least=1, most=2**63 - 1)
    # When it took its present role (seconds since the epoch, its own clock).
    since: float | None = field(None, least=0, most=TIME)


@attrs.frozen
class FleetStatus:
    """``llmgw.cp.status``: every model's status, the nodes counted by state, and with ``ha:`` every server."""

    models: list[ModelStatus] = attrs.Factory(list)
    nodes: dict[str, int] = attrs.Factory(dict)
    servers: list[ServerView] = field(factory=list, items=64)


@attrs.frozen
class EndpointEntry:
    """One ready replica a router may send to: rank 0's URL and its node."""

    id: str
    model: str
    url: str
    node_id: str | None = None


@attrs.frozen
class ColdStart:
    """A model that starts on demand (``replicas: {min: 0, ...}``): how a router holds a request while it wakes."""

    # How long a request is held before it is answered 503 (scale.cold_start_timeout_s).
    timeout_s: float = field(least=0, most=86_400)
    # How many requests one router holds for the model at once (scale.max_held); the next is 503 at once.
    max_held: int = field(least=0, most=1_000_000)


@attrs.frozen
class EndpointTable:
    """What the routers route on, and why each model without an endpoint has none.

    ``elastic`` names the models that may have no replica and start on
    demand: a request for one with no endpoint is held, not refused.
    """

    endpoints: list[EndpointEntry] = attrs.Factory(list)
    unavailable: dict[str, str] = attrs.Factory(dict)
    elastic: dict[str, ColdStart] = attrs.Factory(dict)
    # Models whose answers are not continued on another replica when their engine fails mid-stream.
    no_continuation: list[str] = attrs.Factory(list)


class EventKind(enum.StrEnum):
    """Which of the fleet's events it is: ``llmgw.event.`` and this value is the topic it is published on."""

    NODE = "node"
    SHARD = "shard"
    PROGRESS = "progress"
    # A new entry of the control plane's journal (llmgw.history.JournalEntry).
    JOURNAL = "journal"


class NodeChange(enum.StrEnum):
    """How a node changed, as its ``NodeEvent`` says."""

    REGISTERED = "registered"
    # Its figures moved, and enough to be news (``llmgw.control.news``).
    HEARTBEAT = "heartbeat"
    STATE = "state"
    CORDON = "cordon"
    LINK_WARNING = "link warning"
    # Offboarded: it is gone from the fleet, and the event carries its last view.
    FORGOTTEN = "forgotten"


@attrs.frozen
class NodeEvent:
    """``llmgw.event.node``: a node changed (``change`` says how) and is now ``node``.

    A change this side does not know is refused by ``from_wire``: a reader
    cannot tell whether the node is still there.
    """

    change: NodeChange
    node: NodeView


#: The most nodes one ``llmgw.event.heard`` names; a larger fleet's batch goes out in several.
HEARD_PAGE = 10_000


@attrs.frozen
class HeardEvent:
    """``llmgw.event.heard``: the nodes heard from since the last, each with the seconds since it last was.

    Published every few seconds (``llmgw.control.heard``), so "last seen"
    is true between the node events a steady node's heartbeats do not make.
    """

    seen_ago_s: dict[str, float] = field(factory=dict, chars=IDENT, items=HEARD_PAGE, least=0, most=TIME)


class ShardChange(enum.StrEnum):
    """How a shard changed, as its ``ShardEvent`` says."""

    STATUS = "status"
    # Forgotten by the fleet: stopped, or its node was; the event carries its last status.
    REMOVED = "removed"


@attrs.frozen
class ShardEvent:
    """``llmgw.event.shard``: a shard's new status, or its last one when ``change`` is ``REMOVED``."""

    change: ShardChange
    node_id: str
    shard: ShardStatus


@attrs.frozen
class ProgressEvent:
    """``llmgw.event.progress``: how far a node's download has come."""

    node_id: str
    progress: Progress


#: How many nodes ctl and the dashboard ask ``llmgw.cp.nodes`` for at a time:
#: a page of nodes with eight GPUs each is about 2 MB, far inside the link's
#: 16 MiB message, which a whole fleet of ten thousand would not be.
NODES_PAGE = 1000


async def node_pages(fetch: Callable, page: int = NODES_PAGE) -> list:
    """Every node ``llmgw.cp.nodes`` lists, in id order: ``await fetch(after, limit)`` a page at a time.

    Each page starts after the last id of the one before, so a node that
    registers or leaves meanwhile moves no other: none is listed twice.
    """
    nodes: list = []
    after = None
    while True:
        got = await fetch(after, page)
        nodes.extend(got)
        if len(got) < page or not isinstance(got[-1], dict) or not isinstance(got[-1].get("id"), str):
            return nodes
        after = got[-1]["id"]
