"""The fleet: what every node last said about itself, and whether it still says it.

A node is ``ready`` while its heartbeats arrive, ``unreachable`` once they
have stopped for ``unreachable_after`` seconds (or its link closed), and
``lost`` after ``lost_after``; hearing from it again makes it ready.  Those
transitions are the machine of ``llmgw.control.nodemachine``; nothing else
decides a node's state.  Every change goes through ``_update``, which
stores the new record and emits ``(kind, id, event)``, an event record of
``llmgw.views``; nothing else writes
``nodes``, so the events a TUI or ctl follows are the whole story — except
for heartbeats that change nothing a subscriber shows (``llmgw.control.news``).
The listings' indexes (``llmgw.control.nodelisting``) and their JSON text
(``llmgw.control.nodetext``) are kept from the same path.

What a node says it runs is held to ``llmgw.control.claims``: only shards the
control plane placed on it, or adopted from it when it registered, are kept.
"""

from __future__ import annotations

from typing import Callable, Mapping

import attrs
from twisted.logger import Logger

from llmgw.control.claims import ClaimRefused, Claims, ModelSlots, Why, host_of
from llmgw.control.news import NewsSettings, is_heartbeat_news
from llmgw.control.nodelisting import NodeIndex, NodeQuery
from llmgw.control.nodemachine import NodeInput, node_after
from llmgw.control.nodetext import NodeTexts
from llmgw.records import Heartbeat, Inventory, Progress, ShardSpec, ShardStatus
from llmgw.states import EngineState, NodeState, ShardState
from llmgw.views import (
    NODE_FACTS, EventKind, NodeChange, NodeEvent, NodeView, ProgressEvent, ShardChange, ShardEvent, engines_words,
)
from llmgw.wire import JsonText

# server.yaml's fleet.downloads_per_node: downloads in progress one node may have shown.
DOWNLOADS_PER_NODE = 64

log = Logger()


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


class NotRegistered(Exception):
    """A heartbeat from a node the control plane does not know (it restarted)."""


class TooManyDownloads(Exception):
    """A node reported more downloads in progress than ``downloads_per_node``; the message says so."""


class Fleet:
    def __init__(
        self,
        clock,
        emit: Callable[[EventKind, str, NodeEvent | ShardEvent | ProgressEvent], None],
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
        # The listings' indexes, kept by ``_update`` and ``forget_node``.
        self._index = NodeIndex(self.nodes)
        # Per node, the JSON text of its view and brief as last listed.
        self._texts = NodeTexts()

    def configure(self, news: NewsSettings, downloads_per_node: int,
                  refusal_log: tuple[int, float] | None = None) -> None:
        """server.yaml's fleet limits, at start and on every reload; *refusal_log* is (lines, window_s)."""
        self.news = news
        self.downloads_per_node = downloads_per_node
        if refusal_log is not None:
            self.claims.log_budget.lines, self.claims.log_budget.window_s = refusal_log

    def _update(self, new: Node, change: NodeChange) -> None:
        old = self.nodes.get(new.id)
        self._index.moved(new.id, old, new)
        self.nodes[new.id] = new
        now = self._clock.seconds()
        if change is NodeChange.HEARTBEAT:
            last = self._published.get(new.id)
            if last is not None and now - last[1] < self.news.interval_s and not is_heartbeat_news(
                    last[0], new.state, new.reason, new.inventory, self.news.change):
                return
        view = new.view(now)
        self._published[new.id] = (view, now)
        self._emit(EventKind.NODE, new.id, NodeEvent(change, view))

    def _update_shard(self, node_id: str, shard_id: str, status: ShardStatus | None, order: int = 0) -> None:
        """The one way shards change: store (or forget, when ``status`` is None) and emit.

        Forgetting a shard ends its grant: a report of it after that is a new claim.
        """
        if status is None:
            self.claims.drop(node_id, shard_id)
            gone = self.shards.pop((node_id, shard_id), None)
            if gone is not None:
                self._emit(EventKind.SHARD, shard_id, ShardEvent(ShardChange.REMOVED, node_id, gone.status))
            return
        self.shards[(node_id, shard_id)] = ReportedShard(node_id, status, order)
        self._emit(EventKind.SHARD, shard_id, ShardEvent(ShardChange.STATUS, node_id, status))

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
            NodeChange.REGISTERED,
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
        self._emit(EventKind.PROGRESS, node_id, ProgressEvent(node_id, progress))

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
        self._texts.forget(node_id)
        self._index.moved(node_id, node, None)
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
        self._emit(EventKind.NODE, node_id, NodeEvent(NodeChange.FORGOTTEN, node.view(self._clock.seconds())))
        return True

    def forget_shard(self, node_id: str, shard_id: str) -> None:
        self._update_shard(node_id, shard_id, None)

    def set_cordoned(self, node_id: str, cordoned: bool) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotRegistered(node_id)
        if node.cordoned != cordoned:
            log.info("node {id} {what}", id=node_id, what="cordoned" if cordoned else "uncordoned")
            self._update(attrs.evolve(node, cordoned=cordoned), NodeChange.CORDON)

    def duplicate_refused(self, node_id: str, sentence: str) -> None:
        """The hub refused a second session with *node_id*'s certificate: the latest refusal is shown with the node.

        It stays until the server restarts: the agent that was refused keeps
        retrying, and the operator has two machines to sort out.
        """
        node = self.nodes.get(node_id)
        if node is None or node.link_warnings == (sentence,):
            return
        self._update(attrs.evolve(node, link_warnings=(sentence,)), NodeChange.LINK_WARNING)

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
            NodeChange.STATE if back else NodeChange.HEARTBEAT,
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
            NodeChange.STATE,
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

    def listing(self, query: NodeQuery) -> list[Node]:
        """The nodes *query* asks for, in id order (``NodeIndex.listing``)."""
        return self._index.listing(query)

    def json_listing(self, query: NodeQuery, brief: bool = False) -> JsonText:
        """``llmgw.cp.nodes``'s answer: the views of ``listing(query)`` as the link's JSON, ready to send.

        *brief*: each node's ``NodeBrief`` (what ``ctl nodes``' table prints) rather than its ``NodeView``.
        """
        return self._texts.listing(self._index.listing(query), self._clock.seconds(), brief)

