"""What the journal hears from the fleet, and what it answers on the link.

``JournalFeed.observe`` is one of the control session's event listeners: it
keeps, per node, the state, cordon and engine builds the last event showed,
and per shard its last state, and records each change worth an operator's
reading — a node registered, unreachable, lost, back, cordoned, uncordoned
or forgotten; an engine build installed or broken; a shard that exited
(it was serving) or failed (it never was), with its reason and its last
lines.  Heartbeats that change none of those record nothing.  What it keeps
is bounded by the fleet's own nodes and shards: a removed shard and a
forgotten node are let go.

``JournalProcedures`` answers ``llmgw.cp.events`` with a ``JournalPage`` and
publishes each new entry on ``llmgw.event.journal``.  ``attach`` puts both,
and the reload listener that records what a reload changed, on a session.

The reconciler's decisions (placed, ready, stopped, scaled...) are recorded
where they are made, by ``journal.record``.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from autobahn.wamp.exception import ApplicationError

from llmgw import __version__
from llmgw.control.journal import PAGE_DEFAULT, Journal
from llmgw.control.reload import Listener
from llmgw.history import PAGE_MOST, JournalKind
from llmgw.link import uris
from llmgw.records import EngineInfo, ShardStatus
from llmgw.states import EngineState, NodeState, ShardState
from llmgw.views import EventKind, NodeChange, NodeEvent, NodeView, ShardChange, ShardEvent
from llmgw.wire import to_wire

#: A failed shard's last lines of output the entry quotes, each cut to this many characters.
TAIL_LINES = 3
TAIL_CHARS = 300
#: Shards followed at once; past it a new shard's failure is recorded as failed, whatever it was before.
SHARDS_MOST = 200_000
#: What ``llmgw.cp.events`` takes: the longest node or model name, and the furthest back.
NAME_MOST = 1024
SINCE_MOST = 2**40


@attrs.frozen
class _Seen:
    """A node as the journal last saw it."""

    state: NodeState | str | None
    cordoned: bool | None
    # (name, version) -> state, of each engine build it reported.
    engines: dict[tuple[str, str | None], EngineState | None]


def _engines(engines: list[EngineInfo] | None) -> dict[tuple[str, str | None], EngineState | None]:
    return {(e.name, e.version): e.state for e in engines or ()}


class JournalFeed:
    """Turns the fleet's events into journal entries."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self._nodes: dict[str, _Seen] = {}
        self._shards: dict[tuple[str, str], ShardState] = {}

    def observe(self, kind: EventKind, ident: str, event) -> None:
        if kind is EventKind.NODE and isinstance(event, NodeEvent):
            self._node(event)
        elif kind is EventKind.SHARD and isinstance(event, ShardEvent):
            self._shard(event)

    # -- nodes --

    def _node(self, event: NodeEvent) -> None:
        view = event.node
        node_id = view.id
        old = self._nodes.get(node_id)
        record = self.journal.record
        if event.change is NodeChange.FORGOTTEN:
            self._nodes.pop(node_id, None)
            for key in [k for k in self._shards if k[0] == node_id]:
                del self._shards[key]
            record(JournalKind.NODE_FORGOTTEN, node_id, "offboarded: its certificate revoked", node=node_id)
            return
        new = _Seen(view.state, view.cordoned, _engines(view.engines) if view.engines is not None else
                    (old.engines if old is not None else {}))
        if old is not None and old == new and event.change is not NodeChange.REGISTERED:
            return
        self._nodes[node_id] = new
        if event.change is NodeChange.REGISTERED:
            where = f"from {view.address}" if view.address else "from an address it did not say"
            version = f", agent {view.agent_version}" if view.agent_version else ""
            if old is None:
                record(JournalKind.NODE_REGISTERED, node_id, f"{where}{version}", node=node_id)
            elif old.state in (NodeState.UNREACHABLE, NodeState.LOST):
                record(JournalKind.NODE_BACK, node_id, f"registered again after being {old.state}, {where}{version}",
                       node=node_id)
            else:
                record(JournalKind.NODE_REGISTERED, node_id, f"registered again (a new session), {where}{version}",
                       node=node_id)
        elif old is not None and new.state != old.state:
            self._state(node_id, old.state, view)
        if old is not None and new.cordoned != old.cordoned and new.cordoned is not None:
            record(JournalKind.NODE_CORDONED if new.cordoned else JournalKind.NODE_UNCORDONED, node_id,
                   "nothing new is placed on it" if new.cordoned else "placement may use it again", node=node_id)
        self._builds(node_id, old.engines if old is not None else None, new.engines, view)

    def _state(self, node_id: str, before, view: NodeView) -> None:
        why = view.reason or ""
        if view.state == NodeState.UNREACHABLE:
            self.journal.record(JournalKind.NODE_UNREACHABLE, node_id, why, node=node_id)
        elif view.state == NodeState.LOST:
            self.journal.record(JournalKind.NODE_LOST, node_id, why or "silent too long", node=node_id)
        elif view.state == NodeState.READY and before in (NodeState.UNREACHABLE, NodeState.LOST):
            self.journal.record(JournalKind.NODE_BACK, node_id, f"heard again after being {before}", node=node_id)

    def _builds(self, node_id: str, before: dict | None, after: dict, view: NodeView) -> None:
        """An engine build newly broken, or newly installed on a node already known, in the node's words."""
        if before == after:
            return
        reasons = {(e.name, e.version): e.reason for e in view.engines or ()}
        for key, state in after.items():
            was = before.get(key, EngineState.ABSENT) if before is not None else None
            if state == was:
                continue
            name = " ".join(w for w in key if w)
            why = reasons.get(key)
            if state == EngineState.BROKEN:
                self.journal.record(JournalKind.ENGINE_BROKEN, node_id, f"{name}: {why}" if why else name,
                                    node=node_id)
            elif before is not None and state in (EngineState.INSTALLED, None) and was not in (None,
                                                                                              EngineState.INSTALLED):
                self.journal.record(JournalKind.ENGINE_INSTALLED, node_id,
                                    f"{name} (was {was})" if was != EngineState.ABSENT else name, node=node_id)

    # -- shards --

    def _shard(self, event: ShardEvent) -> None:
        status = event.shard
        key = (event.node_id, status.spec.shard_id)
        if event.change is ShardChange.REMOVED:
            self._shards.pop(key, None)
            return
        before = self._shards.get(key)
        if before is not None or len(self._shards) < SHARDS_MOST:
            self._shards[key] = status.state
        if status.state != ShardState.FAILED or before == ShardState.FAILED:
            return
        served = before in (ShardState.READY, ShardState.DRAINING)
        spec = status.spec
        self.journal.record(JournalKind.EXITED if served else JournalKind.FAILED, spec.replica_id,
                            _failure_words(status, before), node=event.node_id, model=spec.model,
                            replica=spec.replica_id)

    # -- reloads and the start --

    def reload_listener(self, changes: Callable[[object], list[str]], path: str) -> Listener:
        """A reload's part that records what it changed, in the words ``ctl reload`` answers."""

        def prepare(config):
            said = changes(config)

            def apply() -> None:
                self.journal.record(JournalKind.RELOAD, "server.yaml", f"{path}: " + ("; ".join(said) or "no changes"))

            return apply

        return Listener("the journal", prepare)

    def started(self, directory: str | None) -> None:
        journal = self.journal
        kept = (f"{journal.restored} entries read back from {directory}" if directory is not None
                else "no history directory: kept in memory only")
        skipped = f" ({journal.skipped} unreadable lines skipped)" if journal.skipped else ""
        journal.record(JournalKind.SERVER_STARTED, "server", f"llmgw {__version__}; {kept}{skipped}")


def _failure_words(status: ShardStatus, before) -> str:
    """The node's reason, where it was, and its last lines: "killed by signal 9 (SIGKILL) while ready; last output: ..."."""
    words = status.reason or "no reason given"
    if before is not None:
        words += f" (it was {before})"
    tail = [line[:TAIL_CHARS] for line in (status.output_tail or [])[-TAIL_LINES:] if line.strip()]
    if tail:
        words += "; last output: " + " | ".join(tail)
    return words


class JournalProcedures:
    """``llmgw.cp.events`` and ``llmgw.event.journal``: the extension a control session registers."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self._session = None

    async def register(self, session) -> None:
        await session.register(self.events, uris.CP_EVENTS)
        if self._session is None:
            self.journal.listeners.append(self._publish)
        self._session = session

    def _publish(self, entry) -> None:
        session = self._session
        if session is not None and session.is_attached():
            session.publish(uris.EVENT_JOURNAL, to_wire(entry))

    def events(self, node=None, model=None, since=None, after_seq=None, limit=PAGE_DEFAULT):
        """``ctl events``: the journal's entries about *node* and *model* in the last *since* seconds (``JournalPage``)."""
        for name, value in (("node", node), ("model", model)):
            if value is not None and (not isinstance(value, str) or len(value) > NAME_MOST):
                _invalid(f"{name} is a name of at most {NAME_MOST} characters, not {_shown(value)}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))
                                  or not 0 <= since <= SINCE_MOST):
            _invalid(f"since is seconds, from 0 to {SINCE_MOST}, not {_shown(since)}")
        if after_seq is not None and (isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0):
            _invalid(f"after_seq is an entry's seq (a whole number, 0 or more), not {_shown(after_seq)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE_MOST:
            _invalid(f"limit is from 1 to {PAGE_MOST} entries, not {_shown(limit)}")
        return to_wire(self.journal.page(node, model, since, after_seq, limit))


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _invalid(why: str):
    from llmgw.control.relay import words

    raise ApplicationError(uris.ERROR_INVALID_ARGUMENT, f"llmgw.cp.events: {words(why)}")


def attach(session, journal: Journal) -> JournalFeed:
    """Put *journal* on the control *session*: its feed, its procedures, its share of a reload; record the start."""
    feed = JournalFeed(journal)
    session.journal = journal
    session.event_listeners.append(feed.observe)
    session.extensions.append(JournalProcedures(journal))
    catalog = session.catalog
    if catalog is not None:
        listeners = session.reload_listeners

        def changes(config) -> list[str]:
            return catalog.changes(config, applied=[key for listener in listeners for key in listener.applies])

        listeners.append(feed.reload_listener(changes, catalog.config.path))
    feed.started(journal.file.directory if journal.file is not None else None)
    return feed
