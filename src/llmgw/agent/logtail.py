"""An engine's last lines, kept in memory by following its log file.

The engine writes its stdout and stderr straight into the log file, not into
a pipe to the agent: a pipe would die with the agent and take the engine with
it (SIGPIPE, or EPIPE on its next write), and an agent that adopts the engine
could never read it. Following the file costs one ``stat`` per poll and
works the same for an engine this agent started and one it adopted.

Lines the agent itself has to say about the shard (started, adopted, stopped)
are appended to the same file, so the file and the tail tell one story.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

# Read at most this much per poll: an engine that logs a gigabyte between two
# polls must not stall the reactor. What is skipped is said, not hidden.
MAX_READ_BYTES = 1 << 20


class LogFollower:
    def __init__(self, path: Path, *, keep: int, offset: int = 0):
        self.path = path
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._offset = offset
        self._partial = b""

    @staticmethod
    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    def read_back(self, max_bytes: int) -> bool:
        """Fill the tail from what is already in the file (an adopted engine's
        earlier output), reading no more than its last *max_bytes*; False when
        the file is not there."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return False
        if size - self._offset > max_bytes:
            self._offset = size - max_bytes
            self._partial = b""
            self.poll()
            if self.lines:
                self.lines.popleft()  # most likely the end of a line cut in two
            return True
        self.poll()
        return True

    def poll(self) -> None:
        """Take in whatever was written since the last poll."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size < self._offset:
            # Truncated (logrotate's copytruncate): start over from the top.
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return
        if size - self._offset > MAX_READ_BYTES:
            skipped = size - MAX_READ_BYTES - self._offset
            self._flush_partial()
            self.lines.append(f"llmgw: [{skipped} bytes of output skipped; the log file has them]")
            self._offset = size - MAX_READ_BYTES
            self._partial = b""
            drop_first = True
        else:
            drop_first = False
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return
        self._offset += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        if drop_first and chunks:
            chunks.pop(0)
        for chunk in chunks:
            self.lines.append(chunk.rstrip(b"\r").decode("utf-8", "replace"))

    def finish(self) -> None:
        """The writer is gone: its last words need no newline to count."""
        self.poll()
        self._flush_partial()

    def _flush_partial(self) -> None:
        if self._partial:
            self.lines.append(self._partial.rstrip(b"\r").decode("utf-8", "replace"))
            self._partial = b""

    def last(self, n: int) -> list[str]:
        if n <= 0:
            return []
        return list(self.lines)[-n:]


def append_line(path: Path, line: str) -> None:
    """Add one line of the agent's own to a shard's log (O_APPEND: it lands
    after whatever the engine has written, never over it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)
