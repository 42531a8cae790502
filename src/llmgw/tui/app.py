"""The dashboard app: one backend, one store, and the screens kept current from it.

The backend's callbacks only queue (node events) or post a message (link up
and down), so a burst of events costs a dictionary write each.  The flush
timer applies what is urgent (a node changed state) every ``FLUSH_S``; the
tick applies heartbeats' figures and ages "last seen" every ``SEEN_TICK_S``
(see ``store``).  Both change the screens' tables in place.  Replicas are
refetched after shard events (one cheap call gives them all) and reconciled
row by row.
"""

from __future__ import annotations

import time
from typing import Callable

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.message import Message

from llmgw import render
from llmgw.history import JournalEntry
from llmgw.render import said
from llmgw.states import ReplicaState
from llmgw.tui.backend import ActionFailed, Backend, NotConnected
from llmgw.tui.common import FleetView
from llmgw.tui.confirm import ConfirmScreen
from llmgw.tui.details import DetailsScreen
from llmgw.tui.fleet import FleetScreen
from llmgw.tui.help import HelpScreen
from llmgw.tui.store import FLUSH_S, FleetStore
from llmgw.views import NodeView, ServerView

SEEN_TICK_S = 2.0
# Shard events come in bursts (a replica's shards all change at once): one
# refetch per burst, at most this often.
REFETCH_S = 0.5
# While a replica is moving (fetching, starting, waiting to retry) its
# view changes without a shard event; fetch them this often meanwhile.
MOVING_POLL_S = 5.0
MOVING_STATES = frozenset(ReplicaState) - {ReplicaState.READY}
SNAPSHOT_RETRY_S = 5.0
# How often the header's servers and roles are asked again (ha:): a failover shows within this.
SERVERS_POLL_S = 5.0

CONNECTING = "connecting to the hub…"
LOADING = "connected; loading the fleet…"


class DashboardApp(App):
    CSS_PATH = ["app.tcss", "nodes.tcss", "replicas.tcss", "logs.tcss"]
    TITLE = "llmgw"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Keys"),
    ]

    class LinkUp(Message):
        """The backend has a session: take a snapshot."""

    class Recorded(Message):
        """The control plane recorded an entry (``llmgw.event.journal``)."""

        def __init__(self, entry: JournalEntry) -> None:
            super().__init__()
            self.entry = entry

    class LinkDown(Message):
        """The backend lost its session and is reconnecting."""

        def __init__(self, reason: str) -> None:
            super().__init__()
            self.reason = reason

    def __init__(
        self,
        backend: Backend,
        clock: Callable[[], float] = time.monotonic,
        flush_s: float = FLUSH_S,
        seen_tick_s: float = SEEN_TICK_S,
        moving_poll_s: float = MOVING_POLL_S,
        servers_poll_s: float = SERVERS_POLL_S,
    ):
        super().__init__()
        self.backend = backend
        self.store = FleetStore(clock)
        self._flush_s = flush_s
        self._seen_tick_s = seen_tick_s
        self._moving_poll_s = moving_poll_s
        self._servers_poll_s = servers_poll_s
        #: With ha:, every server of the cluster as the hub's llmgw.cp.status last listed it; [] without.
        self.servers: list[ServerView] = []
        #: What the banner says; None while the link is up and the fleet loaded.
        self.link_problem: str | None = CONNECTING
        self._last_refetch = float("-inf")
        self._refetching = False

    def on_mount(self) -> None:
        self.backend.subscribe(self)
        self.push_screen(FleetScreen())
        self.set_interval(self._flush_s, self.flush)
        self.set_interval(self._seen_tick_s, self._tick)
        self.set_interval(self._moving_poll_s, self._poll_moving)
        self.set_interval(self._servers_poll_s, self._refetch_servers)
        self._start_backend()

    @work(group="link")
    async def _start_backend(self) -> None:
        await self.backend.start()

    async def on_unmount(self) -> None:
        await self.backend.stop()

    # -- the backend's listener: called on the loop's thread, from outside Textual --

    def link_up(self) -> None:
        self.post_message(self.LinkUp())

    def link_down(self, reason: str) -> None:
        self.post_message(self.LinkDown(reason))

    def node_changed(self, view: NodeView) -> None:
        self.store.queue_node(view)

    def node_forgotten(self, node_id: str) -> None:
        self.store.forget_node(node_id)

    def shard_changed(self, shard_id: str | None) -> None:
        self.store.mark_replicas()

    def nodes_heard(self, seen_ago_s: dict[str, float]) -> None:
        self.store.heard(seen_ago_s)

    def journal_entry(self, entry: JournalEntry) -> None:
        self.post_message(self.Recorded(entry))

    @on(Recorded)
    def _recorded(self, message: Recorded) -> None:
        for view in self.fleet_views():
            view.journal_entry(message.entry)

    @on(LinkUp)
    def _link_up(self) -> None:
        self.store.syncing = True
        self._show_link(LOADING)
        self._sync()

    @on(LinkDown)
    def _link_down(self, message: LinkDown) -> None:
        self.store.syncing = True
        self._show_link(f"disconnected — reconnecting: {said(message.reason)}")

    # -- keeping the screens current --

    def fleet_views(self) -> list[FleetView]:
        return [screen for screen in self.screen_stack if isinstance(screen, FleetView)]

    @work(exclusive=True, group="sync")
    async def _sync(self) -> None:
        # No await between these two: whatever is queued now is older than
        # the answer, and whatever arrives after the answer is newer.
        self.store.link_up()
        try:
            nodes, replicas = await self.backend.snapshot()
        except NotConnected:
            return  # LinkDown says so; the next LinkUp syncs again
        except ActionFailed as e:
            self._show_link(f"cannot read the fleet: {said(e)}; trying again")
            self.set_timer(SNAPSHOT_RETRY_S, self._sync)
            return
        self.store.load(nodes, replicas)
        self._last_refetch = time.monotonic()
        self._show_link(None)
        for view in self.fleet_views():
            view.fleet_loaded(self.store)
            view.link_back()
        self.flush(figures=True)
        self._refetch_servers()

    @work(exclusive=True, group="servers")
    async def _refetch_servers(self) -> None:
        try:
            servers = await self.backend.servers()
        except (NotConnected, ActionFailed):
            return  # the banner says why; the last list stays until the next answer
        if servers != self.servers:
            self.servers = servers
            for view in self.fleet_views():
                view.servers_changed()

    def flush(self, figures: bool = False) -> None:
        """Apply the urgent queued events (with *figures*, all) to every fleet screen."""
        store = self.store
        if store.syncing:
            return
        changed = store.take_nodes(figures)
        if changed:
            for view in self.fleet_views():
                view.nodes_changed(store, changed)
        if store.replicas_dirty and not self._refetching and time.monotonic() - self._last_refetch >= REFETCH_S:
            self._refetch_replicas()

    @work(exclusive=True, group="replicas")
    async def _refetch_replicas(self) -> None:
        self._refetching = True
        self._last_refetch = time.monotonic()
        # Events during the fetch are in its answer or mark it dirty again.
        self.store.replicas_dirty = False
        try:
            replicas = await self.backend.replicas()
        except (NotConnected, ActionFailed):
            self.store.replicas_dirty = True
            return
        finally:
            self._refetching = False
        self.store.set_replicas(replicas)
        for view in self.fleet_views():
            view.replicas_changed(self.store)

    def _poll_moving(self) -> None:
        if any(r.progress is not None or r.state in MOVING_STATES for r in self.store.replicas.values()):
            self.store.mark_replicas()

    def _tick(self) -> None:
        """The slow pass: heartbeats' figures, then "last seen" ages."""
        if self.store.loaded:
            self.flush(figures=True)
            for view in self.fleet_views():
                view.tick(self.store)

    def _show_link(self, problem: str | None) -> None:
        self.link_problem = problem
        for view in self.fleet_views():
            view.show_link(problem)

    # -- what a person asks for --

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def open_details(self, kind: str, key: str) -> None:
        self.push_screen(DetailsScreen(kind, key))

    def ask_node_verb(self, verb: str, node: str) -> None:
        """Drain and cordon ask first; uncordon, which only allows placement, does not."""
        if verb == "uncordon":
            self._node_verb(verb, node)
            return
        running = self.store.replicas_on(node)
        name = said(node)
        if verb == "drain":
            question = f"Drain {name}?"
            detail = (f"It is cordoned and its {len(running)} replica(s) are stopped here "
                      "and placed on other nodes.")
        else:
            question = f"Cordon {name}?"
            detail = "Nothing new is placed on it; what runs there stays."

        def answered(yes: bool | None) -> None:
            if yes:
                self._node_verb(verb, node)

        self.push_screen(ConfirmScreen(question, detail), answered)

    @work(group="commands")
    async def _node_verb(self, verb: str, node: str) -> None:
        # A node's words in a notification are never markup, and shown escaped.
        name = said(node)
        self.notify(f"{verb} {name}…", timeout=2, markup=False)
        try:
            result = await getattr(self.backend, verb)(node)
        except (NotConnected, ActionFailed) as e:
            self.notify(said(e), title=f"{verb} {name} failed", severity="error", timeout=10, markup=False)
            return
        self.notify(render.node_verb_text(result), title=f"{verb} {name}", markup=False)
