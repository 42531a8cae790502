"""The fleet: what every node last said about itself, and whether it still says it.

A node is ``ready`` while its heartbeats arrive, ``unreachable`` once they
have stopped for ``unreachable_after`` seconds (or its link closed), and
``lost`` after ``lost_after``; hearing from it again makes it ready.  Those
transitions are the table at the bottom of this module, on ``NodeState``
members; nothing else decides a node's state.  Every change goes through ``_update``, which
stores the new record and emits ``(kind, id, event)``, an event record of
``llmgw.views``; nothing else writes
``nodes``, so the events a TUI or ctl follows are the whole story — except
for heartbeats that change nothing a subscriber shows (``llmgw.control.news``).

What a node says it runs is held to ``llmgw.control.claims``: only shards the
control plane placed on it, or adopted from it when it registered, are kept.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
from typing import Any, Callable, Mapping

import attrs
from twisted.logger import Logger

from llmgw.control.claims import ClaimRefused, Claims, ModelSlots, Why, host_of
from llmgw.control.news import NewsSettings, is_heartbeat_news
from llmgw.records import Heartbeat, Inventory, Progress, ShardSpec, ShardStatus
from llmgw.states import EngineState, NodeState, ShardState
from llmgw.views import (
    NODE_FACTS, DiskSummary, GpuSummary, NodeEvent, NodeView, ProgressEvent, ShardEvent, engines_words,
)
from llmgw.wire import JsonText, encode_json, json_text, sparse_json_text

# server.yaml's fleet.downloads_per_node: downloads in progress one node may have shown.
DOWNLOADS_PER_NODE = 64
# The most nodes one page of ``llmgw.cp.nodes`` holds: a page of nodes with
# eight GPUs each stays far inside the link's 16 MiB message.
MAX_PAGE = 2000

log = Logger()


class NodeInput(enum.Enum):
    """What the fleet learns about a node."""

    HEARD = "heard"  # it registered, or a heartbeat arrived on its session
    LINK_CLOSED = "link closed"  # the hub says its session ended
    SILENT = "silent"  # no heartbeat for unreachable_after
    SILENT_LONG = "silent long"  # no heartbeat for lost_after


@attrs.frozen
class Node:
    id: str
    state: NodeState
    inventory: Inventory
    session: int | None
    registered_at: float
    last_seen: float
    state_since: float
    reason: str | None = None
    cordoned: bool = False
    # When the certificate its session proved itself with expires; None: not known.
    certificate_not_after: float | None = None
    # The control plane's own words about the node's link ("a second agent
    # with its certificate was refused"), beside the node's warnings.
    link_warnings: tuple[str, ...] = ()

    def view(self, now: float) -> NodeView:
        """The node as ctl, the TUI and events show it: flat, absent stays None."""
        return NodeView(
            id=self.id,
            state=self.state,
            reason=self.reason,
            cordoned=self.cordoned,
            last_seen=self.last_seen,
            seen_ago_s=round(max(0.0, now - self.last_seen), 1),
            state_since=self.state_since,
            registered_at=self.registered_at,
            certificate_not_after=self.certificate_not_after,
            link_warnings=list(self.link_warnings),
            **{name: getattr(self.inventory, name) for name in NODE_FACTS},
        )


@attrs.frozen
class ReportedShard:
    """A shard as its node last reported it, under the grant it was reported on."""

    node_id: str
    status: ShardStatus
    # The grant's arrival order at the control plane (``claims.Grant.order``):
    # of two copies of one slot, the lower is the one placed or accepted first.
    order: int = 0

    @property
    def id(self) -> str:
        return self.status.spec.shard_id

    @property
    def replica_id(self) -> str:
        return self.status.spec.replica_id


@attrs.frozen
class NodeQuery:
    """Which nodes ``llmgw.cp.nodes`` lists: by state and label, in id order, a page at a time.

    ``after`` is the last id of the page before (a cursor: a node that
    registers or leaves between pages moves no other node), ``limit`` the
    most this page holds; None is no condition.
    """

    state: NodeState | None = None
    label: tuple[str, str] | None = None
    after: str | None = None
    limit: int | None = None

    @classmethod
    def parse(cls, state: Any = None, label: Any = None, after: Any = None, limit: Any = None) -> NodeQuery:
        """The query an operator's call asks for; ``ValueError`` says which argument is wrong and how."""
        if state is not None:
            known = ", ".join(s.value for s in NodeState)
            if not isinstance(state, str) or state not in {s.value for s in NodeState}:
                raise ValueError(f"state {state!r} is none of {known}")
            state = NodeState(state)
        if label is not None:
            if not isinstance(label, str) or "=" not in label or label.startswith("="):
                raise ValueError(f"label {label!r} is not KEY=VALUE (gpu=h100)")
            key, _, value = label.partition("=")
            label = (key, value)
        if after is not None and not isinstance(after, str):
            raise ValueError(f"after {after!r} is not a node id (the last id of the page before)")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE):
            raise ValueError(f"limit {limit!r} is not a number of nodes from 1 to {MAX_PAGE}")
        return cls(state, label, after, limit)


class NotRegistered(Exception):
    """A heartbeat from a node the control plane does not know (it restarted)."""


class TooManyDownloads(Exception):
    """A node reported more downloads in progress than ``downloads_per_node``; the message says so."""


class Fleet:
    def __init__(
        self,
        clock,
        emit: Callable[[str, str, NodeEvent | ShardEvent | ProgressEvent], None],
        unreachable_after: float = 15.0,
        lost_after: float = 120.0,
    ):
        self._clock = clock
        self._emit = emit
        self.unreachable_after = unreachable_after
        self.lost_after = lost_after
        self.nodes: dict[str, Node] = {}
        # Keyed by (node, shard id): after a lost node comes back, the same
        # slot can run on two nodes, and both copies must be seen to stop one.
        self.shards: dict[tuple[str, str], ReportedShard] = {}
        # Downloads under way, by (node, source): one download serves every
        # shard on that node waiting for the source.
        self.progress: dict[tuple[str, str], Progress] = {}
        self.claims = Claims(clock)
        self.news = NewsSettings()
        self.downloads_per_node = DOWNLOADS_PER_NODE
        # When a node last arrived: its session joined the hub, or it
        # registered; None before the first.  A restarted control plane
        # places nothing while the fleet is still arriving (Reconciler).
        self.last_arrival: float | None = None
        # How many connections the hub has accepted that have not finished their handshakes (TLS, the
        # WebSocket upgrade, HELLO): nodes still arriving, as far as anyone can tell.  The server sets it
        # to its link listener's count; the reconciler's settling reads it after a restart.
        self.handshaking: Callable[[], int] = lambda: 0
        # Per node, the view last published and when: a heartbeat is published when it is news.
        self._published: dict[str, tuple[NodeView, float]] = {}
        # Nodes told they are at downloads_per_node, until they are under it again: said once.
        self._downloads_full: set[str] = set()
        # Progress reports refused, per node (``llmgw_node_progress_refused_total``).
        self.progress_refused: dict[str, int] = {}
        # Node ids in order, for paged listings; None once a node is new.
        self._ids: list[str] | None = None
        # The ids of the nodes in each state, and with each label (KEY, VALUE),
        # for the filtered listings: kept by ``_update`` and ``forget_node``,
        # put in order when a listing first asks (``_ordered``).
        self._members: dict[NodeState | tuple[str, str], set[str]] = {}
        self._in_order: dict[NodeState | tuple[str, str], list[str]] = {}
        # Per node, the JSON text of its view as last listed: each field it
        # reported beside the value it was written from (a heartbeat changes
        # the figures; the rest is not written again).  See ``json_view``.
        self._text: dict[str, _NodeText] = {}
        self._brief: dict[str, _NodeText] = {}

    def configure(self, news: NewsSettings, downloads_per_node: int,
                  refusal_log: tuple[int, float] | None = None) -> None:
        """server.yaml's fleet limits, at start and on every reload; *refusal_log* is (lines, window_s)."""
        self.news = news
        self.downloads_per_node = downloads_per_node
        if refusal_log is not None:
            self.claims.log_budget.lines, self.claims.log_budget.window_s = refusal_log

    def _update(self, new: Node, change: str) -> None:
        old = self.nodes.get(new.id)
        if old is None:
            self._ids = None
        self._reindex(new.id, old, new)
        self.nodes[new.id] = new
        now = self._clock.seconds()
        if change == "heartbeat":
            last = self._published.get(new.id)
            if last is not None and now - last[1] < self.news.interval_s and not is_heartbeat_news(
                    last[0], new.state, new.reason, new.inventory, self.news.change):
                return
        view = new.view(now)
        self._published[new.id] = (view, now)
        self._emit("node", new.id, NodeEvent(change, view))

    def _update_shard(self, node_id: str, shard_id: str, status: ShardStatus | None, order: int = 0) -> None:
        """The one way shards change: store (or forget, when ``status`` is None) and emit.

        Forgetting a shard ends its grant: a report of it after that is a new claim.
        """
        if status is None:
            self.claims.drop(node_id, shard_id)
            gone = self.shards.pop((node_id, shard_id), None)
            if gone is not None:
                self._emit("shard", shard_id, ShardEvent("removed", node_id, gone.status))
            return
        self.shards[(node_id, shard_id)] = ReportedShard(node_id, status, order)
        self._emit("shard", shard_id, ShardEvent("status", node_id, status))

    def address(self, node_id: str) -> str | None:
        """The address a node's engines must listen on: its link's, when the hub said it, else the one it reported."""
        node = self.nodes.get(node_id)
        return None if node is None else node.inventory.address

    def place(self, node_id: str, spec: ShardSpec) -> None:
        """The reconciler starts *spec* on *node_id*: from now on the node may report it."""
        self.claims.place(node_id, spec)

    def unplace(self, node_id: str, shard_id: str) -> None:
        """A start that did not happen: its grant ends, unless the node already reported the shard."""
        if (node_id, shard_id) not in self.shards:
            self.claims.drop(node_id, shard_id)

    # -- what agents say --

    def node_joined(self) -> None:
        """A node's session joined the hub: it is arriving, and registers next (its procedures first)."""
        self.last_arrival = self._clock.seconds()

    def register(self, node_id: str, session: int | None, inventory: Inventory, *, peer: str | None = None,
                 certificate_not_after: float | None = None,
                 catalog: Mapping[str, ModelSlots] | None = None) -> dict[str, str]:
        """*node_id* (re)registered from the address *peer*, as the hub saw it (None: not known).

        Returns the shards of its list that were refused, shard id -> the
        sentence saying why; the rest are kept.  *catalog* is the models a
        shard may be adopted for, with their slots (None: no catalog to hold
        adoptions to).
        """
        now = self.last_arrival = self._clock.seconds()
        if peer is not None and (inventory.address is None or host_of(inventory.address) != host_of(peer)):
            log.warn("node {id} says its address is {said}, and its link comes from {peer}: {peer} is the one "
                     "its engines must listen on", id=node_id, said=inventory.address or "nothing", peer=peer)
            inventory = attrs.evolve(inventory, address=peer)
        old = self.nodes.get(node_id)
        if old is None:
            log.info("node {id} registered from {addr}", id=node_id, addr=inventory.address or "-")
            self._log_engines(node_id, None, inventory.engines)
        else:
            if old.session is not None and old.session != session and old.state == NodeState.READY:
                log.warn("node {id} registered from a second session; the newer one wins", id=node_id)
            self._log_changes(node_id, old.inventory, inventory.memory_total_bytes)
            self._log_engines(node_id, old.inventory.engines, inventory.engines)
            log.info("node {id} registered again (was {state})", id=node_id, state=old.state)
        state = NodeState.READY if old is None else node_after(old.state, NodeInput.HEARD)
        self._update(
            Node(
                id=node_id,
                state=state,
                inventory=inventory,
                session=session,
                registered_at=now,
                last_seen=now,
                state_since=now if old is None or old.state != state else old.state_since,
                cordoned=bool(inventory.cordoned),
                certificate_not_after=certificate_not_after,
                link_warnings=old.link_warnings if old is not None else (),
            ),
            "registered",
        )
        # A fresh agent reports its downloads again; what the last one left is not news.
        for key in [k for k in self.progress if k[0] == node_id]:
            del self.progress[key]
        self._downloads_full.discard(node_id)
        # What the node runs is what it says it runs, as far as the claims
        # allow: a control plane that restarted learns its replicas here, and
        # a shard the node no longer mentions is gone.
        refused: dict[str, str] = {}
        if inventory.shards is None:
            return refused
        reported: dict[str, tuple[ShardStatus, int]] = {}
        for status in inventory.shards:
            if status.state == ShardState.STOPPED:
                continue
            try:
                grant = self.claims.check(node_id, status, inventory.address, adopting=True, catalog=catalog,
                                          usable=self.usable, inventory=inventory)
            except ClaimRefused as e:
                refused[status.spec.shard_id] = str(e)
                continue
            reported[status.spec.shard_id] = (status, grant.order)
        for shard in [s for s in self.shards.values() if s.node_id == node_id and s.id not in reported]:
            self._update_shard(node_id, shard.id, None)
        for shard_id, (status, order) in reported.items():
            self._update_shard(node_id, shard_id, status, order)
        return refused

    def shard_status(self, node_id: str, status: ShardStatus) -> None:
        """A shard's new status from its node; ``ClaimRefused`` when the node may not report it (nothing changes).

        A stopped shard is forgotten (a stop of one it does not hold changes
        nothing).  A shard the control plane placed that reports an endpoint
        (or a rendezvous) off its node is kept as failed, in those words, so the reconciler
        stops it and places it again; the report is refused all the same.
        """
        if node_id not in self.nodes:
            raise NotRegistered(node_id)
        shard_id = status.spec.shard_id
        if status.state == ShardState.STOPPED:
            if (node_id, shard_id) in self.claims.grants:
                self._update_shard(node_id, shard_id, None)
            return
        try:
            grant = self.claims.check(node_id, status, self.address(node_id))
        except ClaimRefused as e:
            held = self.claims.grants.get((node_id, shard_id))
            if e.why in (Why.ENDPOINT, Why.RENDEZVOUS) and held is not None:
                failed = attrs.evolve(status, state=ShardState.FAILED, endpoint=None, rendezvous=None,
                                      reason=f"the control plane refused its {e.why.value}: {e}")
                self._update_shard(node_id, shard_id, failed, held.order)
            raise
        self._update_shard(node_id, shard_id, status, grant.order)

    def download(self, node_id: str, progress: Progress) -> None:
        """A download's progress: kept beside the shards, never a transition of theirs.

        A node shows at most ``downloads_per_node`` downloads in progress; a
        new one beyond that raises ``TooManyDownloads`` (logged once, until
        the node is under the limit again) and is neither kept nor published.
        """
        if node_id not in self.nodes:
            raise NotRegistered(node_id)
        key = (node_id, progress.source)
        if progress.final:
            self.progress.pop(key, None)
        elif key in self.progress:
            self.progress[key] = progress
        else:
            held = sum(1 for node, _ in self.progress if node == node_id)
            if held >= self.downloads_per_node:
                self.progress_refused[node_id] = self.progress_refused.get(node_id, 0) + 1
                words = (f"{node_id} already shows {held} downloads in progress, the most fleet.downloads_per_node "
                         f"allows; {progress.source} is not shown until one of them ends")
                if node_id not in self._downloads_full:
                    self._downloads_full.add(node_id)
                    log.warn("refused a download's progress: {words} (said once while it lasts)", words=words)
                raise TooManyDownloads(words)
            self.progress[key] = progress
        if node_id in self._downloads_full and sum(1 for node, _ in self.progress if node == node_id) < \
                self.downloads_per_node:
            self._downloads_full.discard(node_id)
        self._emit("progress", node_id, ProgressEvent(node_id, progress))

    def forget_node(self, node_id: str) -> bool:
        """An offboarded node (its certificate revoked): gone from the fleet, its shards and downloads with it.

        Its ``llmgw_node_state`` series go (no LlmgwNodeLost for a node taken
        away on purpose); a last ``forgotten`` event carries its final view.
        False when the fleet did not know it.  A machine onboarded again
        registers as new.
        """
        node = self.nodes.pop(node_id, None)
        if node is None:
            return False
        self._ids = None
        self._text.pop(node_id, None)
        self._brief.pop(node_id, None)
        self._reindex(node_id, node, None)
        for held, shard_id in [k for k in self.shards if k[0] == node_id]:
            self._update_shard(held, shard_id, None)
        for shard_id in [s for n, s in self.claims.grants if n == node_id]:
            self.claims.drop(node_id, shard_id)
        for key in [k for k in self.progress if k[0] == node_id]:
            del self.progress[key]
        self._published.pop(node_id, None)
        self._downloads_full.discard(node_id)
        self.progress_refused.pop(node_id, None)
        log.info("node {id} forgotten: offboarded, its certificate revoked", id=node_id)
        self._emit("node", node_id, NodeEvent("forgotten", node.view(self._clock.seconds())))
        return True

    def forget_shard(self, node_id: str, shard_id: str) -> None:
        self._update_shard(node_id, shard_id, None)

    def set_cordoned(self, node_id: str, cordoned: bool) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotRegistered(node_id)
        if node.cordoned != cordoned:
            log.info("node {id} {what}", id=node_id, what="cordoned" if cordoned else "uncordoned")
            self._update(attrs.evolve(node, cordoned=cordoned), "cordon")

    def duplicate_refused(self, node_id: str, sentence: str) -> None:
        """The hub refused a second session with *node_id*'s certificate: the latest refusal is shown with the node.

        It stays until the server restarts: the agent that was refused keeps
        retrying, and the operator has two machines to sort out.
        """
        node = self.nodes.get(node_id)
        if node is None or node.link_warnings == (sentence,):
            return
        self._update(attrs.evolve(node, link_warnings=(sentence,)), "link warning")

    def usable(self, node_id: str) -> bool:
        """A node whose shards still count: known and not lost (an unreachable one's engines keep serving)."""
        node = self.nodes.get(node_id)
        return node is not None and node.state != NodeState.LOST

    def replicas(self) -> dict[str, list[ReportedShard]]:
        out: dict[str, list[ReportedShard]] = {}
        for shard in self.shards.values():
            out.setdefault(shard.replica_id, []).append(shard)
        return out

    def heartbeat(self, node_id: str, session: int | None, beat: Heartbeat) -> None:
        old = self.nodes.get(node_id)
        if old is None or old.session != session:
            raise NotRegistered(node_id)
        now = self._clock.seconds()
        self._log_changes(node_id, old.inventory, beat.memory_total_bytes)
        if beat.engines is not None:
            self._log_engines(node_id, old.inventory.engines, beat.engines)
        live = {
            name: getattr(beat, name)
            for name in ("memory_total_bytes", "memory_available_bytes", "gpus", "filesystems", "engines", "weights")
            if getattr(beat, name) is not None
        }
        state = node_after(old.state, NodeInput.HEARD)
        back = state != old.state
        if back:
            log.info("node {id} is ready again after being {state}", id=node_id, state=old.state)
        self._update(
            attrs.evolve(
                old,
                inventory=attrs.evolve(old.inventory, **live),
                last_seen=now,
                state=state,
                reason=None,
                state_since=now if back else old.state_since,
            ),
            "state" if back else "heartbeat",
        )

    def link_closed(self, session: int) -> None:
        for node in list(self.nodes.values()):
            if node.session == session:
                self._fire(node, NodeInput.LINK_CLOSED, "its link to the hub closed")

    # -- time passing --

    def check(self) -> None:
        now = self._clock.seconds()
        for node in list(self.nodes.values()):
            silent = now - node.last_seen
            event = (NodeInput.SILENT_LONG if silent >= self.lost_after
                     else NodeInput.SILENT if silent >= self.unreachable_after else None)
            if event is not None:
                self._fire(node, event, f"no heartbeat for {silent:.0f} s")

    def _fire(self, node: Node, event: NodeInput, reason: str) -> None:
        """Move *node* on by the table; an input its state ignores changes nothing."""
        state = node_after(node.state, event)
        if state != node.state:
            self._set_state(node, state, reason)

    def _set_state(self, node: Node, state: NodeState, reason: str) -> None:
        log.warn("node {id} is {state}: {reason}", id=node.id, state=state, reason=reason)
        self._update(
            attrs.evolve(node, state=state, reason=reason, state_since=self._clock.seconds()),
            "state",
        )

    def _log_changes(self, node_id: str, old: Inventory, memory_total: int | None) -> None:
        # "The node now qualifies" is the answer to why a model placed an hour
        # after it was asked for, so say when a node's memory changes.
        before = old.memory_total_bytes
        if memory_total is not None and before is not None and memory_total != before:
            log.info(
                "node {id} memory changed from {a:.1f} GB to {b:.1f} GB",
                id=node_id, a=before / 1e9, b=memory_total / 1e9,
            )

    def _log_engines(self, node_id: str, before, after) -> None:
        # Once per change: an install finishing, or breaking, is why a model
        # placed (or stopped placing) there; a heartbeat repeating it, or a
        # download's bytes moving on in its reason, is not news.
        def changes(engines):
            return None if engines is None else [
                (e.name, e.version, e.path, e.state, e.origin, None if e.state == EngineState.INSTALLING else e.reason)
                for e in engines
            ]

        if after is not None and changes(after) != changes(before):
            log.info("{id} engines: {engines}", id=node_id, engines=engines_words(after))

    def views(self) -> list[NodeView]:
        now = self._clock.seconds()
        return [node.view(now) for node in self.listing(NodeQuery())]

    def _reindex(self, node_id: str, old: Node | None, new: Node | None) -> None:
        """*node_id*'s state and labels in the indexes, from *old* (None: it is new) to *new* (None: it is gone)."""
        before, after = (None if old is None else old.state), (None if new is None else new.state)
        if before is not after:
            self._index(node_id, before, after)
        had = {} if old is None else old.inventory.labels
        has = {} if new is None else new.inventory.labels
        if had is not has:
            for pair in had.items() - has.items():
                self._index(node_id, pair, None)
            for pair in has.items() - had.items():
                self._index(node_id, None, pair)

    def _index(self, node_id: str, left: NodeState | tuple[str, str] | None,
               joined: NodeState | tuple[str, str] | None) -> None:
        """*node_id* leaves the state or label *left* and joins *joined* (None: neither)."""
        if left is not None:
            members = self._members.get(left)
            if members is not None:
                members.discard(node_id)
                if not members:
                    del self._members[left]
            self._in_order.pop(left, None)
        if joined is not None:
            self._members.setdefault(joined, set()).add(node_id)
            self._in_order.pop(joined, None)

    def _ordered(self, key: NodeState | tuple[str, str] | None) -> list[str]:
        """The ids in *key*'s state or with its label, in order; every id for None."""
        if key is None:
            if self._ids is None:
                self._ids = sorted(self.nodes)
            return self._ids
        ids = self._in_order.get(key)
        if ids is None:
            ids = self._in_order[key] = sorted(self._members.get(key, ()))
        return ids

    def listing(self, query: NodeQuery) -> list[Node]:
        """The nodes *query* asks for, in id order.

        A state or label is answered from its index; with both, the smaller
        one is walked and the other condition checked on each node.
        """
        conditions = [key for key in (query.state, query.label) if key is not None]
        ids = self._ordered(min(conditions, key=lambda k: len(self._members.get(k, ()))) if conditions else None)
        start = 0 if query.after is None else bisect.bisect_right(ids, query.after)
        out: list[Node] = []
        for node_id in itertools.islice(ids, start, None):
            node = self.nodes[node_id]
            if query.state is not None and node.state != query.state:
                continue
            if query.label is not None and node.inventory.labels.get(query.label[0]) != query.label[1]:
                continue
            out.append(node)
            if query.limit is not None and len(out) >= query.limit:
                break
        return out

    def json_listing(self, query: NodeQuery, brief: bool = False) -> JsonText:
        """``llmgw.cp.nodes``'s answer: the views of ``listing(query)`` as the link's JSON, ready to send.

        *brief*: each node's ``NodeBrief`` (what ``ctl nodes``' table prints) rather than its ``NodeView``.
        """
        now = self._clock.seconds()
        text = self.json_brief if brief else self.json_view
        return JsonText(("[" + ",".join([text(node, now) for node in self.listing(query)]) + "]").encode())

    def json_view(self, node: Node, now: float) -> str:
        """``to_wire(node.view(now))`` as JSON text, writing again only what the node reported that changed since the last.

        The same text, byte for byte, as the link's serializer writes for
        that wire form (``tests/fleet/test_listing_text.py``): the node's own
        fields, then its facts (``NODE_FACTS``), then the control plane's.
        """
        held = self._text.get(node.id)
        if held is None or held.inventory is not node.inventory:
            parts = held.parts if held is not None else {}
            for name in NODE_FACTS:
                value = getattr(node.inventory, name)
                part = parts.get(name)
                if part is None or part[0] is not value:
                    parts[name] = (value, json_text(value))
            held = self._text[node.id] = _NodeText(node.inventory, parts)
        own = (node.state, node.reason, node.cordoned, node.state_since, node.registered_at,
               node.certificate_not_after, tuple(node.link_warnings))
        if held.own != own:
            held.own = own
            held.head = (f'{{"id":{encode_json(node.id)},"state":{encode_json(node.state.value)},'
                         f'"reason":{_scalar(node.reason)},"cordoned":{_scalar(node.cordoned)},"last_seen":')
            held.tail = (f',"state_since":{_scalar(node.state_since)},"registered_at":{_scalar(node.registered_at)},'
                         + ",".join([f'"{name}":{held.parts[name][1]}' for name in NODE_FACTS])
                         + f',"certificate_not_after":{_scalar(node.certificate_not_after)},'
                         f'"link_warnings":{encode_json(list(node.link_warnings))}}}')
        return f'{held.head}{_scalar(node.last_seen)},"seen_ago_s":{_scalar(round(max(0.0, now - node.last_seen), 1))}{held.tail}'

    def json_brief(self, node: Node, now: float) -> str:
        """``NodeBrief.of(node.view(now))`` as ``sparse_json_text`` writes it, kept as ``json_view`` keeps the view.

        A field at its default is left out (``to_sparse_wire``).  The GPUs
        are summed again only when a heartbeat brought new figures for them,
        the filesystems only when they changed; the text before
        ``seen_ago_s`` only when one of the node's own fields did.
        """
        held = self._brief.get(node.id)
        if held is None:
            held = self._brief[node.id] = _NodeText(None, {})
        if held.inventory is not node.inventory:
            parts = held.parts
            for name, source, write in _BRIEF_FACTS:
                value = getattr(node.inventory, source)
                part = parts.get(name)
                if part is None or part[0] is not value:
                    text = write(value)
                    parts[name] = (value, "" if text == _LEFT_OUT.get(name, "null") else f',"{name}":{text}')
            held.inventory = node.inventory
            held.tail = ""
        own = (node.state, node.reason, node.cordoned, node.certificate_not_after, node.link_warnings)
        if held.own != own:
            held.own = own
            reason = "" if node.reason is None else f',"reason":{encode_json(node.reason)}'
            held.head = (f'{{"id":{encode_json(node.id)},"state":{encode_json(node.state.value)}{reason},'
                         f'"cordoned":{_scalar(node.cordoned)},"seen_ago_s":')
            held.tail = ""
        if not held.tail:
            expires = node.certificate_not_after
            held.tail = "".join([
                *(part for _, part in held.parts.values()),
                "" if expires is None else f',"certificate_not_after":{_scalar(expires)}',
                f',"link_warnings":{encode_json(list(node.link_warnings))}' if node.link_warnings else "",
                "}",
            ])
        return f'{held.head}{_scalar(round(max(0.0, now - node.last_seen), 1))}{held.tail}'


class _NodeText:
    """A node's listing text as last written: each fact's text, and its view's text around the two figures that move.

    Made anew when the node's inventory changes; its head and tail again
    when one of the node's own fields does (``own``).
    """

    __slots__ = ("inventory", "parts", "own", "head", "tail")

    def __init__(self, inventory: Inventory, parts: dict[str, tuple[Any, str]]):
        self.inventory = inventory
        self.parts = parts
        self.own: tuple | None = None
        self.head = self.tail = ""


def _scalar(value: Any) -> str:
    """One of a node's own fields as the link's JSON writes it: a finite float as ``repr`` does, as ``json`` does."""
    if value is None:
        return "null"
    if type(value) is int:
        return int.__repr__(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return encode_json(value)


def _gpu_summary_text(cards: list | None) -> str:
    """``sparse_json_text(GpuSummary.of(cards))``, written here: it is made again at every heartbeat's listing."""
    summary = GpuSummary.of(cards)
    if summary is None:
        return "null"
    fields = [f'"kinds":{encode_json(summary.kinds)}'] if summary.kinds else []
    if summary.memory_used_bytes is not None:
        fields.append(f'"memory_used_bytes":{summary.memory_used_bytes}')
    if summary.memory_total_bytes is not None:
        fields.append(f'"memory_total_bytes":{summary.memory_total_bytes}')
    return "{" + ",".join(fields) + "}"


# What a node's brief (``NodeBrief``) says of its inventory, in the brief's
# order: each field's name, the inventory's field it comes from, and how its
# text is written; a field whose text is its default's (``null``, or
# ``_LEFT_OUT``'s) is left out.
_BRIEF_FACTS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("address", "address", _scalar),
    ("cpu", "cpu", sparse_json_text),
    ("memory_total_bytes", "memory_total_bytes", _scalar),
    ("memory_available_bytes", "memory_available_bytes", _scalar),
    ("gpu_summary", "gpus", _gpu_summary_text),
    ("disk_summary", "filesystems", lambda filesystems: sparse_json_text(DiskSummary.of(filesystems))),
    ("engines", "engines", sparse_json_text),
    ("warnings", "warnings", sparse_json_text),
)
_LEFT_OUT = {"warnings": "[]"}


def node_after(state: NodeState, event: NodeInput) -> NodeState:
    """The state a node in *state* is in after *event*: itself, when its state ignores it."""
    return _NODE_TABLE.get((state, event), state)


_N, _NI = NodeState, NodeInput
_NODE_TABLE: dict[tuple[NodeState, NodeInput], NodeState] = {
    (_N.READY, _NI.LINK_CLOSED): _N.UNREACHABLE,
    (_N.READY, _NI.SILENT): _N.UNREACHABLE,
    # A check that came late (a stalled control plane), or lost_after set no
    # longer than unreachable_after: silence long enough is lost from ready too.
    (_N.READY, _NI.SILENT_LONG): _N.LOST,
    (_N.UNREACHABLE, _NI.SILENT_LONG): _N.LOST,
    (_N.UNREACHABLE, _NI.HEARD): _N.READY,
    # A lost node that comes back is simply ready: its shards were placed
    # elsewhere meanwhile, and the reconciler stops whichever copy is extra.
    (_N.LOST, _NI.HEARD): _N.READY,
}
