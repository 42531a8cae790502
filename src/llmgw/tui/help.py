"""`?`: every key, on one screen that fits 80x24."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("Tab / Shift+Tab", "next / previous pane: Nodes, Replicas, Logs, Events"),
    ("1 2 3 4, e", "go to the Nodes, Replicas, Logs or Events pane"),
    ("↑ ↓ PgUp PgDn", "move in a table; ← → scroll its columns"),
    ("Enter", "details and log of the node or replica"),
    ("/", "filter the table: every word must appear"),
    ("Esc", "clear the filter; leave details or this help"),
    ("d", "drain the node (asks first)"),
    ("c", "cordon the node (asks first)"),
    ("u", "uncordon the node"),
    ("s", "next log source of the node (agent, shards)"),
    ("?", "this help"),
    ("q", "quit"),
)

NOTES = (
    "-  the node did not report it (an older agent, or a probe that failed)",
    "!  after a node's state: it has warnings (see details), e.g. no AVX2",
    "?  under STALE: the agent is too old to say",
)


class HelpScreen(ModalScreen[None]):
    CSS_PATH = "help.tcss"
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold cyan", no_wrap=True)
        keys.add_column()
        for key, what in KEYS:
            keys.add_row(key, what)
        with Vertical(id="help"):
            yield Static("Keys", id="help-title")
            yield Static(keys)
            yield Static("\n".join(NOTES), id="help-notes", markup=False)
            yield Static("Esc or ? closes", id="help-close")

    def action_close(self) -> None:
        self.dismiss(None)
