"""The journal on disk: JSON lines appended to ``journal.jsonl``, rotated, and read back when the server starts.

``journal.jsonl`` grows to ``file_bytes`` and is then renamed
``journal.jsonl.1`` (the one before becomes ``.2``, and so on), keeping
``files`` of them: the journal never holds more than ``file_bytes`` times
``files + 1`` bytes on disk.  Lines are written at the end of the reactor's
turn that recorded them, in one write, with no fsync: a crash of the server
loses nothing it recorded before its last turn, a crash of the machine may
lose the last seconds.

Reading back is from the newest file to the oldest until enough entries
are found.  A line that is not a whole entry — the torn last line a crash
leaves, or anything else written there — is skipped and counted, never
fatal; so is an entry whose sequence number does not follow the one before.
A path that is not a regular file (a FIFO, a device) is not read, and no
file is read past the bytes the journal itself would have written.
A directory or file that cannot be written is logged once: the journal goes
on in memory.
"""

from __future__ import annotations

import json
import os
import stat

import attrs
from twisted.logger import Logger

from llmgw.history import JournalEntry
from llmgw.wire import WireError, encode_json, from_wire, to_wire

log = Logger()

NAME = "journal.jsonl"
#: The longest line read back: an entry's fields at their bounds, in UTF-8, with room to spare.
LINE_MOST = 64 * 1024
#: Lines waiting for the turn's end past this many bytes are written at once.
PENDING_MOST = 1024 * 1024


@attrs.frozen
class ReadBack:
    """What the files held: the newest entries, oldest first, and how many lines were not entries."""

    entries: list[JournalEntry]
    skipped: int = 0


class JournalFile:
    """``DIRECTORY/journal.jsonl`` and its rotated files, written at the end of each turn."""

    def __init__(self, clock, directory: str, file_bytes: int, files: int):
        self._clock = clock
        self.directory = directory
        self.path = os.path.join(directory, NAME)
        self._file_bytes = file_bytes
        self._files = files
        self._handle = None
        self._size = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._flush_call = None
        # The file does not end with a newline (a torn line, a failed write): the next write starts one.
        self._torn = False
        # The last write failed and said so; the next failure is not logged again.
        self._failing = False

    def paths(self) -> list[str]:
        """``journal.jsonl`` and its rotated files, newest first."""
        return [self.path] + [f"{self.path}.{n}" for n in range(1, self._files + 1)]

    def read_back(self, most: int) -> ReadBack:
        """The newest *most* entries the files hold, oldest first; lines that are not entries counted."""
        chunks: list[list[JournalEntry]] = []
        found = skipped = 0
        for path in self.paths():
            if found >= most:
                break
            entries, bad = self._read(path)
            chunks.append(entries)
            found += len(entries)
            skipped += bad
        ordered: list[JournalEntry] = []
        for entry in (e for chunk in reversed(chunks) for e in chunk):
            if ordered and entry.seq <= ordered[-1].seq:
                skipped += 1  # out of order: not what this journal wrote
                continue
            ordered.append(entry)
        if skipped:
            log.warn("history: skipped {n} line(s) of {path} and its rotated files that are not journal entries "
                     "(a crash leaves a torn last line; anything else was written there by something else)",
                     n=skipped, path=self.path)
        return ReadBack(ordered[-most:] if most else [], skipped)

    def _read(self, path: str) -> tuple[list[JournalEntry], int]:
        """The entries of one file and how many of its lines were not; a file that cannot be read is none."""
        try:
            # Not blocking: a FIFO put there would hold the server's start until something wrote to it.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            with open(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    log.warn("history: {path} is not a regular file; its entries are not read back (move it away)",
                             path=path)
                    return [], 0
                # A file longer than this journal writes is read from where the last file_bytes begin; and no
                # more than that, should it grow as it is read.
                start = max(0, st.st_size - self._file_bytes - LINE_MOST)
                f.seek(start)
                data = f.read(self._file_bytes + LINE_MOST)
        except FileNotFoundError:
            return [], 0
        except OSError as e:
            log.warn("history: cannot read {path} ({why}); its entries are not read back", path=path, why=e.strerror)
            return [], 0
        if path == self.path and data and not data.endswith(b"\n"):
            self._torn = True
        lines = data.split(b"\n")
        skipped = 0
        if start > 0 and lines:
            lines.pop(0)  # begun mid-line
            skipped += 1
        last = lines.pop()  # b"" after the final newline; else a torn line
        if last:
            skipped += 1
        entries = []
        for line in lines:
            entry = _entry(line)
            if entry is None:
                skipped += 1
            else:
                entries.append(entry)
        return entries, skipped

    def append(self, entry: JournalEntry) -> None:
        """Write *entry* at the end of this turn (at once when much is waiting)."""
        line = encode_json(to_wire(entry)).encode("utf-8") + b"\n"
        self._pending.append(line)
        self._pending_bytes += len(line)
        if self._pending_bytes >= PENDING_MOST:
            self.flush()
        elif self._flush_call is None:
            self._flush_call = self._clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Write what is waiting; a failure is logged once and what was waiting is let go (it stays in memory)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        try:
            for line in pending:
                self._write(line)
        except OSError as e:
            self._close()
            self._torn = True
            if not self._failing:
                self._failing = True
                log.warn("history: cannot write {path} ({why}); the journal goes on in memory only, and a restart "
                         "will not show what it records until {dir} is writable (history.dir in server.yaml)",
                         path=self.path, why=e.strerror or e, dir=self.directory)
            return
        if self._failing:
            self._failing = False
            log.info("history: writing {path} again", path=self.path)

    def _write(self, line: bytes) -> None:
        if self._handle is None:
            os.makedirs(self.directory, mode=0o750, exist_ok=True)
            self._handle = open(self.path, "ab", buffering=0)
            self._size = os.fstat(self._handle.fileno()).st_size
        if self._size and self._size + len(line) > self._file_bytes:
            self._rotate()
        if self._torn:
            line = b"\n" + line
        written = self._handle.write(line)
        self._size += written or 0
        self._torn = written != len(line)
        if self._torn:
            raise OSError(f"wrote {written} of {len(line)} bytes")

    def _rotate(self) -> None:
        self._close()
        paths = self.paths()
        if self._files == 0:
            os.unlink(self.path)
        else:
            for older, newer in zip(reversed(paths[1:]), reversed(paths[:-1])):
                if os.path.exists(newer):
                    os.replace(newer, older)
        self._torn = False
        self._handle = open(self.path, "ab", buffering=0)
        self._size = 0

    def _close(self) -> None:
        if self._handle is not None:
            try:
                self._handle.close()
            except OSError:
                pass
            self._handle = None

    def close(self) -> None:
        """Write what waits, then let go of the file."""
        self.flush()
        self._close()


def _entry(line: bytes) -> JournalEntry | None:
    if len(line) > LINE_MOST:
        return None
    try:
        return from_wire(JournalEntry, json.loads(line))
    except (ValueError, TypeError, RecursionError, WireError):
        return None
