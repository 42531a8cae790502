"""A node's or a model's last hour in the details screen: a sparkline per series, and its own events.

The sparklines are drawn here rather than with Textual's ``Sparkline``: that
widget takes numbers only, so a stretch with nothing known (a node that
missed its heartbeats) would be drawn as the lowest figure, and absent is
not zero.  Here each column is one stretch of the hour, the highest figure
known in it as one of eight blocks, and a stretch with nothing known is a
blank.  The words beside it say the newest figure, the range and the
unit (``llmgw.figurewords``, as the admin page says them).

The panel asks ``llmgw.cp.figures`` and ``llmgw.cp.events`` for its subject
when the screen opens and every ``POLL_S`` after, and shows nothing at all
for a subject with neither.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from llmgw import figurewords as words
from llmgw.history import Figures, JournalEntry, JournalPage, Scope
from llmgw.render import said
from llmgw.tui.backend import ActionFailed, NotConnected
from llmgw.tui.events import ShownEntries, event_line

BLOCKS = "▁▂▃▄▅▆▇█"
#: Columns a sparkline takes: one a minute of the hour.
SPARK_WIDTH = 60
LABEL_WIDTH = 24
#: How often the panel asks again: the series' buckets are 10 s.
POLL_S = 10.0
#: A subject's events the panel shows, newest last.
OWN_EVENTS = 12


def spark(points: list[float | None], width: int = SPARK_WIDTH) -> str:
    """*points* as *width* columns of blocks (the top is the highest figure); a blank where nothing was known."""
    if not points:
        return " " * width
    known = [p for p in points if p is not None]
    top = max(known, default=0.0)
    out = []
    for column in range(width):
        start, end = column * len(points) // width, max((column + 1) * len(points) // width, column * len(points) // width + 1)
        stretch = [p for p in points[start:end] if p is not None]
        if not stretch:
            out.append(" ")
            continue
        high = max(stretch)
        out.append(BLOCKS[0] if top <= 0 else BLOCKS[min(len(BLOCKS) - 1, int(high / top * (len(BLOCKS) - 1) + 0.5))])
    return "".join(out)


def series_lines(figures: Figures, scope: Scope, subject: str) -> Text:
    """Two lines a series: its name, the newest figure and the range; then the sparkline."""
    text = Text()
    window = words.window(figures)
    for group in words.groups(figures, scope, subject):
        for series in group.series:
            points = words.recent(series, window)
            summary = words.summary(points)
            text.append(f"{words.label(series):<{LABEL_WIDTH}}", style="bold")
            text.append(f"now {words.value(summary.latest, series.unit)}")
            text.append(f"   {words.value(summary.low, series.unit)} to {words.value(summary.high, series.unit)}"
                        if summary.latest is not None else "   nothing known this hour", style="dim")
            text.append("\n")
            text.append(spark(points), style="cyan")
            text.append("\n")
    text.rstrip()
    return text


class HistoryPanel(Vertical):
    """The last hour of one node (``Scope.NODE``) or one model (a replica's), and its subject's events."""

    def __init__(self, scope: Scope, subject: str, replica: str | None = None, poll_s: float = POLL_S,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.scope, self.subject, self.replica = scope, subject, replica
        self.poll_s = poll_s
        self.journal = ShownEntries(OWN_EVENTS * 4)
        self.figures: Figures | None = None
        self.problem: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="history-title")
        yield Static(id="history-figures")
        yield Static(id="history-events")

    def on_mount(self) -> None:
        self.display = False
        self.fetch()
        self.set_interval(self.poll_s, self.fetch)

    def mine(self, entry: JournalEntry) -> bool:
        if self.scope == Scope.NODE:
            return self.subject in (entry.node, entry.subject)
        return self.replica in (entry.replica, entry.subject)

    def add(self, entry: JournalEntry) -> None:
        if self.mine(entry):
            self.journal.add(entry)
            self._show()

    @work(exclusive=True, group="history")
    async def fetch(self) -> None:
        backend = self.app.backend
        which = {"node": self.subject} if self.scope == Scope.NODE else {"model": self.subject}
        try:
            page: JournalPage = await backend.events(**which)
            self.figures = await backend.figures(self.scope, self.subject)
            self.problem = None
        except (NotConnected, ActionFailed) as e:
            self.problem = f"the last hour could not be read: {said(e)}"
        else:
            for entry in page.entries:
                if self.mine(entry):
                    self.journal.add(entry)
        self._show()

    def _show(self) -> None:
        figures = self.figures
        lines = series_lines(figures, self.scope, self.subject) if figures is not None else Text()
        own = self.journal.ordered()[-OWN_EVENTS:]
        self.display = bool(lines.plain or own or self.problem)
        kind = "node" if self.scope == Scope.NODE else "model"
        title = Text(f"last hour of {kind} {said(self.subject)}", style="bold underline")
        if self.problem:
            title.append(f"  {self.problem}", style="yellow")
        self.query_one(".history-title", Static).update(title)
        self.query_one("#history-figures", Static).update(lines)
        events = Text()
        if own:
            events.append("events\n", style="bold underline")
        for entry in own:
            events.append(event_line(entry, 10))
            events.append("\n")
        events.rstrip()
        self.query_one("#history-events", Static).update(events)
