"""The logs pane: one node's log source, followed live while it is on screen.

Following is polling: every ``POLL_S`` the pane asks for the last ``LINES``
lines and appends those after the ones it already shows (where the new batch
overlaps the old, found as ``ctl logs -f`` finds it).  It asks nothing while
it is hidden, so a thousand-node dashboard costs its agents nothing until
someone looks at a log.  Each line is written escaped (``render.log_lines``):
Textual's ``Log`` passes an escape sequence on to the terminal as it is.
"""

from __future__ import annotations

import attrs
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Log, Static

from llmgw.render import log_lines, new_lines_start, not_started, said
from llmgw.tui.backend import LogsUnavailable
from llmgw.views import ReplicaView

POLL_S = 2.0
LINES = 200
KEEP_LINES = 5000
AGENT = "agent"
NOTHING = "nothing to follow: select a node, or a replica that runs somewhere, then come back here"


@attrs.frozen
class LogTarget:
    """A node's log source: ``source`` None is the agent's own log."""

    node: str
    source: str | None = None
    #: What the pane's title says it follows ("echo/0 on node01").
    what: str = ""
    #: The replica whose shard this is: asked for only once the shard has started.
    replica: str | None = None

    @property
    def source_name(self) -> str:
        return self.source or AGENT


def replica_log_target(replica: ReplicaView) -> LogTarget | None:
    """The log of a replica's first shard, on the node that runs it."""
    if not replica.shards or replica.shards[0].node is None:
        return None
    first = replica.shards[0]
    return LogTarget(first.node, first.shard, replica.replica, replica.replica)


class LogPane(Vertical):
    BINDINGS = [Binding("s", "next_source", "Log source")]

    def __init__(self, poll_s: float = POLL_S, **kwargs) -> None:
        super().__init__(**kwargs)
        self._poll_s = poll_s
        self.target: LogTarget | None = None
        self.lines: list[str] = []
        self.status: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="log-title")
        yield Static(classes="log-status")
        yield Log(max_lines=KEEP_LINES, auto_scroll=True)

    def on_mount(self) -> None:
        self.set_interval(self._poll_s, self.poll)
        self._show_title()
        self._set_status(NOTHING)

    def focus_log(self) -> None:
        self.query_one(Log).focus()

    # -- what to follow --

    def follow(self, target: LogTarget | None) -> None:
        if target == self.target:
            return
        self.target = target
        self.lines = []
        self.query_one(Log).clear()
        self._set_status(None if target is not None else NOTHING)
        self._show_title()
        self.poll()

    def action_next_source(self) -> None:
        if self.target is not None:
            self._next_source(self.target)

    @work(exclusive=True, group="log-sources")
    async def _next_source(self, target: LogTarget) -> None:
        try:
            sources = await self.app.backend.log_sources(target.node)
        except LogsUnavailable as e:
            self._set_status(str(e))
            return
        if not sources or self.target != target:
            return
        current = target.source_name
        after = sources[(sources.index(current) + 1) % len(sources)] if current in sources else sources[0]
        self.follow(LogTarget(target.node, None if after == AGENT else after, target.what))

    # -- following --

    def visible(self) -> bool:
        return self.is_attached and self.screen.is_current and all(node.display for node in self.ancestors_with_self)

    def poll(self) -> None:
        if self.target is None or not self.visible():
            return
        waiting = not_started(self.app.store.replicas.get(self.target.replica or ""), self.target.source)
        self.set_class(waiting is not None, "-waiting")
        if waiting is not None:
            self._set_status(waiting)
            return
        self._fetch(self.target)

    @work(exclusive=True, group="log-fetch")
    async def _fetch(self, target: LogTarget) -> None:
        try:
            lines = await self.app.backend.logs(target.node, target.source, LINES)
        except LogsUnavailable as e:
            if target == self.target:
                self._set_status(str(e))
            return
        if target != self.target:
            return
        self._set_status(None if lines or self.lines else "no lines yet")
        self._append(lines)

    def _append(self, new: list[str]) -> None:
        log = self.query_one(Log)
        k = new_lines_start(self.lines, new)
        if k is None:
            # More was written than one poll fetches, or the source started
            # again: show the fresh window rather than a seam.
            log.clear()
            k = 0
        if new[k:]:
            log.write_lines(log_lines(new[k:]))
        self.lines = new

    # -- showing --

    def _show_title(self) -> None:
        title = self.query_one(".log-title", Static)
        if self.target is None:
            title.update(Text("logs"))
        else:
            what = f"{said(self.target.what)} · " if self.target.what else ""
            title.update(Text(f"logs · {what}{said(self.target.node)} · {said(self.target.source_name)}   (s: next source)"))

    def _set_status(self, text: str | None) -> None:
        self.status = text
        status = self.query_one(".log-status", Static)
        status.update(Text(said(text or "")))
        status.display = bool(text)
