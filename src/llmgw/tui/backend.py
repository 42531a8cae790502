"""Where the dashboard's facts come from: the hub, or a fake for tests and benchmarks.

The app talks to one ``Backend``.  A backend tells its listener when the link
comes up or goes down and passes on the fleet's events as they arrive; the
app takes a snapshot after every ``link_up`` and applies events on top.

``WampBackend`` is the same autobahn.twisted client as ``llmgw ctl``, run on
Twisted's asyncio reactor installed on Textual's event loop (see
``install_reactor``), so one process has one loop, one reactor and one txaio
framework (Twisted's) — never ``autobahn.asyncio``.
"""

from __future__ import annotations

import abc
import asyncio
import sys
from typing import Protocol

from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer

from llmgw.answers import CordonAnswer, DrainAnswer, LogsAnswer
from llmgw.errors import LlmgwError
from llmgw.history import Figures, JournalEntry, JournalPage, Scope
from llmgw.link import uris
from llmgw.link.client import client_service, describe_failure
from llmgw.views import (NODES_PAGE, FleetStatus, HeardEvent, NodeChange, NodeEvent, NodeView, ReplicaView,
                         ServerView, node_pages)
from llmgw.wire import WireError, from_wire

# The relay of a node's logs through the control plane: (node, source, n) ->
# {"sources": [...], "lines": [...]}.  A source of None is the agent's own log.
# Kept here until llmgw.link.uris names it.
CP_LOGS = "llmgw.cp.logs"

NOT_ANSWERING = "agent too old or not answering"


class NotConnected(LlmgwError):
    """The dashboard is not connected to the hub just now; it is reconnecting."""


class ActionFailed(LlmgwError):
    """The control plane refused or failed a request; the message is its own."""

    def __init__(self, message: str, error: str | None = None):
        super().__init__(message)
        #: The WAMP error URI, or "timeout"; None when neither applies.
        self.error = error


class LogsUnavailable(LlmgwError):
    """A node's logs could not be fetched; the message says why, for the logs pane."""


class ReactorTaken(LlmgwError):
    """Another Twisted reactor is installed in this process, so the TUI cannot use Textual's loop."""


class FleetListener(Protocol):
    """What a backend tells the app.  Called on the event loop's thread."""

    def link_up(self) -> None:
        """A session is open and subscribed; take a snapshot now."""

    def link_down(self, reason: str) -> None:
        """The session is gone; the backend is reconnecting by itself."""

    def node_changed(self, view: NodeView) -> None:
        """A node event: the whole node view, as ``llmgw.cp.nodes`` gives it."""

    def node_forgotten(self, node_id: str) -> None:
        """The node left the fleet (offboarded): nothing of it is shown any more."""

    def shard_changed(self, shard_id: str | None) -> None:
        """A shard changed, or a download moved (None); replicas derive from both, so the app refetches them."""

    def nodes_heard(self, seen_ago_s: dict[str, float]) -> None:
        """Nodes heard from lately, each with the seconds since it last was (``llmgw.event.heard``)."""

    def journal_entry(self, entry: JournalEntry) -> None:
        """The control plane recorded this (``llmgw.event.journal``)."""


class Backend(abc.ABC):
    """The dashboard's one source of facts and one way to act on the fleet."""

    #: What the title bar says the dashboard is connected to.
    hub: str = ""

    def __init__(self) -> None:
        self.listener: FleetListener | None = None

    def subscribe(self, listener: FleetListener) -> None:
        self.listener = listener

    @abc.abstractmethod
    async def start(self) -> None:
        """Begin connecting; ``link_up`` follows when a session is open."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Close the link and stop reconnecting."""

    @abc.abstractmethod
    async def snapshot(self) -> tuple[list[NodeView], list[ReplicaView]]:
        """(node views, replica views).

        Every node event the listener receives after this is called is newer
        than the node list it returns (a backend drops the ones that are not),
        so the app applies those on top of it.
        """

    @abc.abstractmethod
    async def replicas(self) -> list[ReplicaView]:
        """The replica views alone: cheap, refetched after shard events."""

    @abc.abstractmethod
    async def logs(self, node_id: str, source: str | None, n: int) -> list[str]:
        """The last *n* lines of *source* on *node_id* (None: the agent's own log)."""

    @abc.abstractmethod
    async def log_sources(self, node_id: str) -> list[str]:
        """The log sources a node offers, as it names them."""

    @abc.abstractmethod
    async def events(self, node: str | None = None, model: str | None = None) -> JournalPage:
        """The journal's newest entries (``llmgw.cp.events``), only *node*'s or *model*'s when named."""

    @abc.abstractmethod
    async def figures(self, scope: Scope | None = None, subject: str | None = None) -> Figures:
        """The last hour's series (``llmgw.cp.figures``): every one, *scope*'s, or one *subject*'s."""

    async def servers(self) -> list[ServerView]:
        """With ``ha:``, every server of the cluster, its role and epoch (``llmgw.cp.status``); [] without."""
        return []

    # The node verbs answer as llmgw.cp.<verb> does, a drain with the shards it stopped;
    # a refusal raises ActionFailed with the control plane's words.

    @abc.abstractmethod
    async def drain(self, node_id: str) -> DrainAnswer: ...

    @abc.abstractmethod
    async def cordon(self, node_id: str) -> CordonAnswer: ...

    @abc.abstractmethod
    async def uncordon(self, node_id: str) -> CordonAnswer: ...


def install_reactor(loop: asyncio.AbstractEventLoop):
    """Install Twisted's asyncio reactor on *loop* and return it.

    Must run before anything imports ``twisted.internet.reactor``: whatever
    reactor is imported first is the process's for good.  Installing on the
    same loop twice returns the installed reactor.
    """
    if "twisted.internet.reactor" in sys.modules:
        from twisted.internet import reactor
        from twisted.internet.asyncioreactor import AsyncioSelectorReactor

        if isinstance(reactor, AsyncioSelectorReactor) and reactor._asyncioEventloop is loop:
            return reactor
        raise ReactorTaken(
            f"a {type(reactor).__name__} is already installed in this process; llmgw-tui needs "
            "Twisted's asyncio reactor on Textual's loop (run it in its own process)"
        )
    from twisted.internet import asyncioreactor

    asyncioreactor.install(eventloop=loop)
    from twisted.internet import reactor

    return reactor


class WampBackend(Backend):
    """The hub, through a session that reconnects by itself (``client_service``)."""

    def __init__(self, reactor, hub, tls, call_timeout_s: float = 10.0, command_timeout_s: float = 120.0):
        super().__init__()
        self._reactor = reactor
        self._hub = hub
        self._tls = tls
        self.hub = hub.url
        self._call_timeout_s = call_timeout_s
        self._command_timeout_s = command_timeout_s
        self._service = None
        self._session: DashboardSession | None = None
        # Node events that arrive while a snapshot's node list is on its way
        # describe, for the nodes still to come, a fleet the snapshot will
        # include (the hub delivers a session's messages in order): drop
        # those, or the app would apply them on top of the newer view.
        self._snapshotting = False
        # While a paged snapshot arrives: the last id in hand, and the newer
        # views of nodes at or before it that events brought meanwhile.
        self._snapshot_upto: str | None = None
        self._snapshot_newer: dict | None = None
        self.page = NODES_PAGE

    async def start(self) -> None:
        self._service = client_service(self._reactor, self._hub, self._tls, lambda config: DashboardSession(config, self))
        self._service.startService()
        self._watch()

    async def stop(self) -> None:
        service, self._service = self._service, None
        if service is not None and service.running:
            await _future(service.stopService())

    # -- the link --

    def _watch(self) -> None:
        """Report the next failed attempt, so the banner says why it is still disconnected."""
        if self._service is None:
            return

        def failed(failure):
            if failure.check(defer.CancelledError) or self._service is None:
                return None
            self._down(describe_failure(failure, self._hub))
            self._watch()
            return None

        # On success the session reports what follows, and re-arms this when it ends.
        self._service.whenConnected(failAfterFailures=1).addCallbacks(lambda _: None, failed)

    def _joined(self, session: DashboardSession) -> None:
        self._session = session
        if self.listener is not None:
            self.listener.link_up()

    def _left(self, session: DashboardSession, reason: str) -> None:
        if session is not self._session:
            return
        self._session = None
        self._down(reason)
        self._watch()

    def _down(self, reason: str) -> None:
        if self.listener is not None:
            self.listener.link_down(reason)

    def _node_event(self, node_id, event) -> None:
        if self.listener is None:
            return
        if self._snapshotting and (self._snapshot_upto is None or not isinstance(node_id, str)
                                   or node_id > self._snapshot_upto):
            return
        try:
            decoded = from_wire(NodeEvent, event)
        except WireError:
            return  # not a node event this dashboard can read; the next snapshot has the node
        view = decoded.node
        gone = decoded.change is NodeChange.FORGOTTEN
        if self._snapshotting:
            self._snapshot_newer[view.id] = None if gone else view
            return
        if gone:
            self.listener.node_forgotten(view.id)
        else:
            self.listener.node_changed(view)

    def _shard_event(self, shard_id) -> None:
        if self.listener is not None:
            self.listener.shard_changed(shard_id)

    def _journal_event(self, event) -> None:
        if self.listener is None:
            return
        try:
            entry = from_wire(JournalEntry, event)
        except WireError:
            return  # an entry this dashboard cannot read; the events pane's next fetch has it as the server words it
        self.listener.journal_entry(entry)

    def _heard_event(self, event) -> None:
        # While a snapshot is taken its own views say when each node was heard; the next batch is seconds away.
        if self.listener is None or self._snapshotting:
            return
        try:
            seen = from_wire(HeardEvent, event).seen_ago_s
        except WireError:
            return
        self.listener.nodes_heard(seen)

    # -- calls --

    async def _call(self, uri: str, *args, timeout: float | None = None, answered=None, **kwargs):
        """Call *uri*; *answered(result)* runs the moment the answer (or error) arrives, before any later event."""
        session = self._session
        if session is None:
            raise NotConnected("not connected to the hub; reconnecting")
        seconds = timeout or self._call_timeout_s
        d = session.call(uri, *args, **kwargs)
        if answered is not None:
            d.addBoth(lambda result: (answered(result), result)[1])
        d.addTimeout(seconds, self._reactor)
        try:
            return await _future(d)
        except ApplicationError as e:
            raise ActionFailed(str(e.args[0]) if e.args else e.error, error=e.error) from None
        except defer.TimeoutError:
            raise ActionFailed(f"{uri}: no answer within {seconds:g} s", error="timeout") from None
        except Exception as e:
            if self._session is not session:
                raise NotConnected("the link to the hub closed during the request; reconnecting") from None
            raise ActionFailed(f"{uri}: {e or type(e).__name__}") from None

    async def snapshot(self):
        """Every node, a page at a time (``views.node_pages``), and every replica.

        While the pages arrive, a node event for an id already in hand is
        newer than its page and is kept to replace it; one for an id still
        to come is older than the page that will bring it, and is dropped.
        """
        held: dict = {}  # node id -> the newest event's view (None: forgotten), for ids already paged in

        def answered(result):
            # From the answer's own callback: events after it are newer than this page.
            if isinstance(result, list) and len(result) == self.page and isinstance(result[-1], dict):
                self._snapshot_upto = result[-1].get("id")
            else:
                self._snapshotting = False

        async def fetch(after, limit):
            return await self._call(uris.CP_NODES, answered=answered, limit=limit,
                                    **({"after": after} if after is not None else {}))

        self._snapshotting, self._snapshot_upto, self._snapshot_newer = True, None, held
        try:
            nodes = await node_pages(fetch, self.page)
        finally:
            self._snapshotting, self._snapshot_upto, self._snapshot_newer = False, None, None
        views = _decode(list[NodeView], nodes, uris.CP_NODES)
        listed = {v.id for v in views}
        views = [held.get(v.id, v) for v in views] + [v for node_id, v in held.items() if node_id not in listed]
        return [v for v in views if v is not None], await self.replicas()

    async def replicas(self):
        return _decode(list[ReplicaView], await self._call(uris.CP_REPLICAS), uris.CP_REPLICAS)

    async def _logs(self, node_id: str, source: str | None, n: int) -> LogsAnswer:
        try:
            answer = _decode(LogsAnswer, await self._call(CP_LOGS, node_id, source, n, timeout=15.0), CP_LOGS)
        except NotConnected as e:
            raise LogsUnavailable(str(e)) from None
        except ActionFailed as e:
            if e.error == "wamp.error.no_such_procedure":
                raise LogsUnavailable(f"this server does not relay logs ({CP_LOGS} is missing): upgrade it") from None
            if e.error in ("timeout", "wamp.error.canceled", "wamp.error.timeout"):
                raise LogsUnavailable(f"{node_id}: {NOT_ANSWERING}") from None
            raise LogsUnavailable(str(e)) from None
        return answer

    async def logs(self, node_id, source, n):
        return (await self._logs(node_id, source, n)).lines

    async def log_sources(self, node_id):
        return (await self._logs(node_id, None, 0)).sources

    async def events(self, node=None, model=None):
        which = {k: v for k, v in (("node", node), ("model", model)) if v is not None}
        return _decode(JournalPage, await self._call(uris.CP_EVENTS, **which), uris.CP_EVENTS)

    async def figures(self, scope=None, subject=None):
        which = {k: v for k, v in (("scope", scope and str(scope)), ("subject", subject)) if v is not None}
        return _decode(Figures, await self._call(uris.CP_FIGURES, **which), uris.CP_FIGURES)

    async def servers(self):
        return _decode(FleetStatus, await self._call(uris.CP_STATUS), uris.CP_STATUS).servers

    async def drain(self, node_id):
        return await self._verb(uris.CP_DRAIN, DrainAnswer, node_id)

    async def cordon(self, node_id):
        return await self._verb(uris.CP_CORDON, CordonAnswer, node_id)

    async def uncordon(self, node_id):
        return await self._verb(uris.CP_UNCORDON, CordonAnswer, node_id)

    async def _verb(self, uri: str, kind: type, node_id: str):
        return _decode(kind, await self._call(uri, node_id, timeout=self._command_timeout_s), uri)


class DashboardSession(ApplicationSession):
    """Subscribes to the fleet's events, then tells the backend the link is usable."""

    def __init__(self, config, backend: WampBackend):
        super().__init__(config)
        self._backend = backend

    def onConnect(self):
        self.join(self.config.realm)

    async def onJoin(self, details):
        await self.subscribe(self._backend._node_event, uris.EVENT_NODE)
        await self.subscribe(lambda shard_id, event: self._backend._shard_event(shard_id), uris.EVENT_SHARD)
        # A download's progress shows on its replica, which is refetched like a shard change.
        await self.subscribe(lambda node_id, event: self._backend._shard_event(None), uris.EVENT_PROGRESS)
        await self.subscribe(self._backend._heard_event, uris.EVENT_HEARD)
        await self.subscribe(self._backend._journal_event, uris.EVENT_JOURNAL)
        self._backend._joined(self)

    def onLeave(self, details):
        self._backend._left(self, f"the hub closed the session: {details.message or details.reason}")
        self.disconnect()

    def onDisconnect(self):
        self._backend._left(self, f"the link to {self._backend.hub} closed")


def _decode(kind, answer, uri: str):
    """An answer as its view records; one that does not fit is the server's failure, said as such."""
    try:
        return from_wire(kind, answer)
    except WireError as e:
        raise ActionFailed(f"{uri} answered something this dashboard cannot read: {e}") from None


def _future(d) -> asyncio.Future:
    """A Deferred as a future on the running loop (Textual's, which the reactor shares)."""
    return d.asFuture(asyncio.get_running_loop())
