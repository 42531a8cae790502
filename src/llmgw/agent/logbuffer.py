"""The agent's own last lines, kept in memory so an operator reads them over the link.

Seeing why a node misbehaved should not need ssh to it, a jump host, and a
journal only root may open.  The lines still go wherever twistd writes them.
"""

from __future__ import annotations

import time
from collections import deque

from twisted.logger import formatEvent

AGENT_SOURCE = "agent"
KEEP_LINES = 2000


class LogBuffer:
    """A log observer keeping the last ``keep`` formatted lines."""

    def __init__(self, keep: int = KEEP_LINES):
        self.lines: deque[str] = deque(maxlen=keep)

    def __call__(self, event) -> None:
        try:
            text = formatEvent(event)
        except Exception:  # a broken event must not break logging
            text = repr(event.get("log_format"))
        if event.get("log_failure") is not None:
            text += "\n" + event["log_failure"].getTraceback()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(event.get("log_time", time.time())))
        level = getattr(event.get("log_level"), "name", "info")
        for line in text.splitlines() or [""]:
            self.lines.append(f"{stamp} [{level}] {line}")

    def last(self, n: int) -> list[str]:
        if n <= 0:
            return []
        return list(self.lines)[-n:]
