"""The main screen: the nodes and replicas tables one above the other, the logs or events pane instead of them.

Each table is as tall as its rows, so a small fleet shows both at 80x24; when
they do not fit, the one with fewer rows keeps what it needs up to half and
the other scrolls in the rest.  Tab moves between nodes, replicas, logs and
events (``e``, or 4: the control plane's journal, ``llmgw.tui.events``); the
tab line keeps the counts in view.
"""

from __future__ import annotations

from typing import Iterable

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.containers import Vertical
from textual.widgets import Footer, Input, Static

from llmgw.tui.common import FleetView, LinkBanner
from llmgw.tui.events import EventsPane
from llmgw.tui.logs import LogPane, LogTarget, replica_log_target
from llmgw.tui.nodes import NodesPane
from llmgw.tui.replicas import ReplicasPane
from llmgw.tui.servers import servers_line
from llmgw.tui.store import FleetStore
from llmgw.tui.table import FleetTable, TablePane

PANES = ("nodes", "replicas", "logs", "events")
#: The panes shown instead of the tables.
INSTEAD = ("logs", "events")


class FleetScreen(FleetView, Screen):
    BINDINGS = [
        Binding("tab", "next_pane", "Pane", priority=True),
        Binding("shift+tab", "previous_pane", "Pane", show=False, priority=True),
        Binding("1", "pane('nodes')", "Nodes", show=False),
        Binding("2", "pane('replicas')", "Replicas", show=False),
        Binding("3", "pane('logs')", "Logs", show=False),
        Binding("4", "pane('events')", "Events", show=False),
        Binding("e", "pane('events')", "Events", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("d", "node_verb('drain')", "Drain"),
        Binding("c", "node_verb('cordon')", "Cordon"),
        Binding("u", "node_verb('uncordon')", "Uncordon"),
    ]

    def __init__(self) -> None:
        super().__init__()
        # The table pane whose selection the logs pane follows.
        self._source_pane = "nodes"
        self._current = "nodes"

    def compose(self) -> ComposeResult:
        yield Static(id="tabs")
        yield LinkBanner(id="banner")
        with Vertical(id="panes"):
            with Vertical(id="tables"):
                yield NodesPane(id="nodes")
                yield ReplicasPane(id="replicas")
            yield LogPane(id="logs")
            yield EventsPane(id="events")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(LinkBanner).show_link(self.app.link_problem)
        self.query_one(NodesPane).filter_input.display = False
        self.query_one(ReplicasPane).filter_input.display = False
        self.query_one(LogPane).display = False
        self.query_one(EventsPane).display = False
        self.fleet_loaded(self.app.store)
        self.query_one(NodesPane).focus_table()

    # -- panes --

    @property
    def current(self) -> str:
        return self._current

    def action_pane(self, name: str) -> None:
        if self.current in ("nodes", "replicas"):
            self._source_pane = self.current
        self._current = name
        self.query_one("#tables").display = name not in INSTEAD
        self.query_one(LogPane).display = name == "logs"
        self.query_one(EventsPane).display = name == "events"
        if name == "logs":
            self._follow_selection()
            self.query_one(LogPane).focus_log()
        elif name == "events":
            self.query_one(EventsPane).shown()
            self.query_one(EventsPane).log_widget.focus()
        else:
            self.query_one(f"#{name}", TablePane).focus_table()
        self._show_tabs()

    def action_next_pane(self) -> None:
        self.action_pane(PANES[(PANES.index(self.current) + 1) % len(PANES)])

    def action_previous_pane(self) -> None:
        self.action_pane(PANES[(PANES.index(self.current) - 1) % len(PANES)])

    def action_filter(self) -> None:
        if self.current in ("nodes", "replicas"):
            self.query_one(f"#{self.current}", TablePane).start_filter()
            self._size_tables()

    def on_resize(self) -> None:
        self.call_after_refresh(self._size_tables)

    @on(FleetTable.ScrollbarsChanged)
    def _scrollbars_changed(self) -> None:
        self._size_tables()

    def _size_tables(self) -> None:
        """Each table as tall as its rows (and header) where both fit; else share the room."""
        panes = [self.query_one(NodesPane), self.query_one(ReplicasPane)]
        room = self.query_one("#panes").size.height - sum(p.filter_input.display for p in panes)
        if room <= 0:
            return
        needs = [p.table.row_count + 1 + (p.table.styles.scrollbar_size_horizontal
                                          if p.table.needs_horizontal_scrollbar() else 0) for p in panes]
        if sum(needs) > room:
            small = min(range(2), key=lambda i: needs[i])
            needs[small] = min(needs[small], room // 2)
            needs[1 - small] = room - needs[small]
        for pane, height in zip(panes, needs):
            pane.table.styles.height = max(height, 2)

    def selected_node(self) -> str | None:
        if self.current != "nodes":
            return None
        return self.query_one(NodesPane).table.selected_key()

    def action_node_verb(self, verb: str) -> None:
        node = self.selected_node()
        if node is None:
            self.app.notify("select a node on the Nodes pane first (Tab, or 1)", severity="warning")
            return
        self.app.ask_node_verb(verb, node)

    @on(TablePane.Opened)
    def _opened(self, event: TablePane.Opened) -> None:
        self.app.open_details(event.kind, event.key)

    @on(Input.Changed)
    def _filtered(self, event: Input.Changed) -> None:
        self._show_tabs()

    def _follow_selection(self) -> None:
        store: FleetStore = self.app.store
        pane = self.query_one(f"#{self._source_pane}", TablePane)
        key = pane.table.selected_key()
        target = None
        if key is not None and self._source_pane == "nodes" and key in store.nodes:
            target = LogTarget(key)
        elif key is not None and key in store.replicas:
            target = replica_log_target(store.replicas[key])
        self.query_one(LogPane).follow(target)

    # -- the fleet changed --

    def fleet_loaded(self, store: FleetStore) -> None:
        self.query_one(NodesPane).load(store)
        self.query_one(ReplicasPane).load(store)
        self._show_tabs()

    def nodes_changed(self, store: FleetStore, node_ids: Iterable[str]) -> None:
        self.query_one(NodesPane).changed(store, node_ids)
        self._show_tabs()

    def replicas_changed(self, store: FleetStore) -> None:
        self.query_one(ReplicasPane).load(store)
        self._show_tabs()

    def tick(self, store: FleetStore) -> None:
        self.query_one(NodesPane).tick(store)
        self.query_one(ReplicasPane).tick(store)

    def show_link(self, problem: str | None) -> None:
        self.query_one(LinkBanner).show_link(problem)

    def link_back(self) -> None:
        self.query_one(EventsPane).link_up()

    def journal_entry(self, entry) -> None:
        self.query_one(EventsPane).add(entry)

    def servers_changed(self) -> None:
        self._show_tabs()

    def _show_tabs(self) -> None:
        store: FleetStore = self.app.store
        nodes, ready_nodes, replicas, ready_replicas = store.counts()
        labels = {
            "nodes": f" Nodes {ready_nodes}/{nodes} ready ",
            "replicas": f" Replicas {ready_replicas}/{replicas} ready ",
            "logs": " Logs ",
            "events": " Events ",
        }
        line = Text()
        for name in PANES:
            line.append(labels[name], style="reverse bold" if name == self.current else "")
            line.append(" ")
        for name in ("nodes", "replicas"):
            table = self.query_one(f"#{name}", TablePane).table
            if table.filter_text:
                line.append(f" {name} filtered: {table.shown}/{table.total}", style="yellow")
        line.append_text(servers_line(self.app.servers, self.app.backend.hub))
        self.query_one("#tabs", Static).update(line)
        self._size_tables()
