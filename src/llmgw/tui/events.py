"""The events pane: the control plane's journal, newest at the bottom, followed live.

The entries come from ``llmgw.event.journal`` as they are recorded; the
first time the pane is shown (and after the link comes back while it is) it
asks ``llmgw.cp.events`` for the newest ones, and merges the two by ``seq``,
so an entry is shown once whichever way it came.  While hidden it asks
nothing.  Every word of an entry is placed through ``render.said`` and the
lines are ``Text``, never markup: a reason is a node's words.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from llmgw.history import JournalEntry, JournalKind, JournalPage
from llmgw.render import said
from llmgw.tui.backend import ActionFailed, NotConnected

#: Entries the pane keeps; the oldest go first.
KEEP_EVENTS = 2000
KIND_WIDTH = 16

KIND_STYLES = {
    JournalKind.NODE_LOST: "bold red", JournalKind.NODE_UNREACHABLE: "yellow", JournalKind.ENGINE_BROKEN: "bold red",
    JournalKind.UNPLACEABLE: "yellow", JournalKind.EXITED: "bold red", JournalKind.FAILED: "bold red",
    JournalKind.READY: "green", JournalKind.NODE_BACK: "green", JournalKind.NODE_REGISTERED: "green",
    JournalKind.ENGINE_INSTALLED: "green",
    JournalKind.COLD_START: "blue", JournalKind.SCALED_UP: "blue", JournalKind.SCALED_DOWN: "blue",
    JournalKind.SLEPT: "blue", JournalKind.EVICTED: "magenta",
}


def stamp(at: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(at))


def event_line(entry: JournalEntry, subject_width: int = 14) -> Text:
    """``12-06 03:12:07  exited           qwen/0         node03  exited 137 (killed)``: one line, escaped."""
    line = Text(stamp(entry.at) + "  ", style="dim")
    line.append(f"{said(entry.kind):<{KIND_WIDTH}}", style=KIND_STYLES.get(entry.kind, ""))
    line.append(" ")
    line.append(f"{said(entry.subject):<{subject_width}}", style="bold")
    if entry.node and entry.node != entry.subject:
        line.append(f" {said(entry.node)}", style="dim")
    if entry.reason:
        line.append(f"  {said(entry.reason)}")
    return line


class ShownEntries:
    """The entries one view shows: by ``seq``, at most *keep*, each once."""

    def __init__(self, keep: int = KEEP_EVENTS) -> None:
        self.keep = keep
        self.entries: dict[int, JournalEntry] = {}

    def add(self, entry: JournalEntry) -> bool:
        """Keep *entry*; True when it is the newest, so a view appends it rather than redraws."""
        newest = max(self.entries, default=-1)
        self.entries[entry.seq] = entry
        self._trim()
        return entry.seq > newest

    def merge(self, page: JournalPage) -> None:
        for entry in page.entries:
            self.entries[entry.seq] = entry
        self._trim()

    def ordered(self) -> list[JournalEntry]:
        return [self.entries[seq] for seq in sorted(self.entries)]

    def _trim(self) -> None:
        if len(self.entries) > self.keep:
            for seq in sorted(self.entries)[: len(self.entries) - self.keep]:
                del self.entries[seq]


class EventsPane(Vertical):
    def __init__(self, keep: int = KEEP_EVENTS, **kwargs) -> None:
        super().__init__(**kwargs)
        self.journal = ShownEntries(keep)
        #: Whether the newest page was fetched since the link last came up.
        self.fetched = False
        self.dropped = 0

    def compose(self) -> ComposeResult:
        yield Static(Text(" Events (UTC), newest last; following llmgw.event.journal"), classes="events-title")
        yield Static(classes="events-status")
        yield RichLog(id="events-log", max_lines=self.journal.keep, wrap=False, markup=False, highlight=False,
                      auto_scroll=True)

    def on_mount(self) -> None:
        self._status(None)

    @property
    def log_widget(self) -> RichLog:
        return self.query_one(RichLog)

    def shown(self) -> None:
        """The pane came on screen: fetch the newest page once per link."""
        if not self.fetched:
            self.fetch()

    def link_up(self) -> None:
        self.fetched = False
        if self.display:
            self.fetch()

    def add(self, entry: JournalEntry) -> None:
        if self.journal.add(entry) and len(self.journal.entries) > 1:
            self.log_widget.write(event_line(entry))
        else:
            self._redraw()

    @work(exclusive=True, group="events")
    async def fetch(self) -> None:
        try:
            page = await self.app.backend.events()
        except (NotConnected, ActionFailed) as e:
            self._status(f"the journal could not be read: {said(e)}")
            return
        self.fetched = True
        self.dropped = page.dropped
        self.journal.merge(page)
        self._status(f"the journal has let go of {page.dropped} older entries (its bounds)" if page.dropped else None)
        self._redraw()

    def _redraw(self) -> None:
        log = self.log_widget
        log.clear()
        entries = self.journal.ordered()
        if not entries:
            log.write(Text("nothing recorded yet", style="dim"))
        for entry in entries:
            log.write(event_line(entry))

    def _status(self, words: str | None) -> None:
        status = self.query_one(".events-status", Static)
        status.update(Text(words or ""))
        status.display = words is not None
