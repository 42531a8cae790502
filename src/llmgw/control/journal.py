"""The control plane's journal: what it decided and what nodes told it, each a ``JournalEntry``.

``record`` is cheap and never fails on account of the disk: it numbers the
entry, keeps it in memory, hands it to the listeners (``llmgw.event.journal``)
and leaves the line for ``llmgw.control.journalfile`` to write at the end of
the turn.  Memory holds at most ``history.journal_entries`` entries whose
reasons together are at most ``history.journal_reason_chars``; the oldest go
first.  The numbers go on from the last one the files hold, so ``seq`` only
grows, across restarts too.

A node that changes a thousand times a second must not wipe out everyone
else's history: each node (or, for an entry about no node, each subject)
may add ``journal_burst`` entries at once, then one every
``journal_refill_s``.  What is over that is counted, not kept: the next entry
it may add says how many were let go, and every page's ``dropped`` counts
them with the entries the bounds let go.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable

import attrs
from twisted.logger import Logger

from llmgw.config.history import HistorySettings
from llmgw.control.journalfile import JournalFile
from llmgw.history import PAGE_MOST, REASON_CHARS, JournalEntry, JournalKind, JournalPage
from llmgw.wiretext import prose

log = Logger()

#: Entries one page holds when the caller does not say.
PAGE_DEFAULT = 1000
#: One page's entries together, in characters (about its bytes on the link, far inside the link's 16 MiB message).
PAGE_CHARS = 4_000_000
#: Nodes and subjects whose rate is followed at once; the one longest quiet is forgotten first.
LIMITED_MOST = 4096
#: What an entry costs a page beside its strings.
_ENTRY_CHARS = 160
# The bounds of the entry's names (``JournalEntry``): longer ones are cut, so every entry fits its record.
_NAME_CHARS = {"subject": 1024, "node": 256, "model": 1024, "replica": 1024}


@attrs.define
class _Rate:
    """One node's (or subject's) allowance: a token bucket, and what it let go since its last entry."""

    tokens: float
    at: float
    over: int = 0


class Journal:
    """Entries in memory, bounded, their file on disk (or none), and who is told of each new one."""

    def __init__(self, clock, settings: HistorySettings, directory: str | None):
        self._clock = clock
        self.settings = settings
        self._entries: collections.deque[JournalEntry] = collections.deque()
        self._reason_chars = 0
        self._rates: collections.OrderedDict[str, _Rate] = collections.OrderedDict()
        # Entries the rate let go since this server started.
        self.over = 0
        # Called with each new entry; one that raises is logged and the others still run.
        self.listeners: list[Callable[[JournalEntry], None]] = []
        self.file = (JournalFile(clock, directory, settings.journal_file_bytes, settings.journal_files)
                     if directory is not None else None)
        back = self.file.read_back(settings.journal_entries) if self.file is not None else None
        self.restored = len(back.entries) if back is not None else 0
        self.skipped = back.skipped if back is not None else 0
        self._seq = 0
        for entry in back.entries if back is not None else ():
            self._keep(entry)
            self._seq = entry.seq

    @property
    def newest_seq(self) -> int:
        return self._seq

    @property
    def dropped(self) -> int:
        """Entries no longer held: those the bounds let go since the journal began, and those the rate let go."""
        oldest = self._entries[0].seq if self._entries else self._seq + 1
        return oldest - 1 + self.over

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, kind: JournalKind, subject: str, reason: str = "", *, node: str | None = None,
               model: str | None = None, replica: str | None = None) -> JournalEntry | None:
        """Keep what happened, and tell the listeners; None when *node*'s (or *subject*'s) rate let it go."""
        now = self._clock.seconds()
        over = self._allowance(node or subject, now)
        if over is None:
            return None
        reason = prose(reason, REASON_CHARS)
        if over:
            note = f" ({over} earlier entries of {node or subject} were not kept: more than history.journal_burst)"
            reason = prose(reason[:REASON_CHARS - len(note)] + note, REASON_CHARS)
        self._seq += 1
        entry = JournalEntry(self._seq, max(0.0, now), JournalKind(kind), _name(subject, "subject"), reason,
                             _name(node, "node"), _name(model, "model"), _name(replica, "replica"))
        self._keep(entry)
        if self.file is not None:
            self.file.append(entry)
        for listener in self.listeners:
            try:
                listener(entry)
            except Exception:
                log.failure("a journal listener failed on entry {seq}", seq=entry.seq)
        return entry

    def _allowance(self, key: str, now: float) -> int | None:
        """None when *key* is over its rate (counted); else how many of its entries were let go before this one."""
        refill_s = self.settings.journal_refill_s
        if refill_s <= 0:
            return 0
        burst = self.settings.journal_burst
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = _Rate(float(burst), now)
            while len(self._rates) > LIMITED_MOST:
                self._rates.popitem(last=False)
        else:
            self._rates.move_to_end(key)
            rate.tokens = min(float(burst), rate.tokens + max(0.0, now - rate.at) / refill_s)
            rate.at = now
        if rate.tokens < 1:
            if rate.over == 0:
                log.warn("history: {key} adds more than {burst} journal entries at once; the rest are counted, not "
                         "kept, one every {s:g} s kept (history.journal_burst, journal_refill_s)",
                         key=key, burst=burst, s=refill_s)
            rate.over += 1
            self.over += 1
            return None
        rate.tokens -= 1
        over, rate.over = rate.over, 0
        return over

    def _keep(self, entry: JournalEntry) -> None:
        self._entries.append(entry)
        self._reason_chars += len(entry.reason)
        most, chars = self.settings.journal_entries, self.settings.journal_reason_chars
        while len(self._entries) > most or (self._reason_chars > chars and len(self._entries) > 1):
            self._reason_chars -= len(self._entries.popleft().reason)

    def page(self, node: str | None = None, model: str | None = None, since: float | None = None,
             after_seq: int | None = None, limit: int = PAGE_DEFAULT) -> JournalPage:
        """Entries about *node* and *model*, recorded in the last *since* seconds, oldest first.

        With *after_seq*: the first *limit* entries after it, so a reader
        pages forward from the last ``seq`` it has.  Without: the newest
        *limit*.  A page stops short at ``PAGE_CHARS``.
        """
        limit = max(1, min(limit, PAGE_MOST))
        start = None if since is None else self._clock.seconds() - since

        def wanted(e: JournalEntry) -> bool:
            return ((node is None or e.node == node) and (model is None or e.model == model)
                    and (start is None or e.at >= start))

        found: list[JournalEntry] = []
        chars = 0
        if after_seq is not None:
            source = itertools.islice(self._entries, _first_after(self._entries, after_seq), None)
        else:
            source = reversed(self._entries)
        for entry in source:
            if not wanted(entry):
                continue
            chars += _ENTRY_CHARS + len(entry.reason) + len(entry.subject) + len(entry.model or "") + len(
                entry.replica or "")
            if len(found) >= limit or (chars > PAGE_CHARS and found):
                break
            found.append(entry)
        if after_seq is None:
            found.reverse()
        return JournalPage(found, self._seq, self.dropped)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _first_after(entries: collections.deque[JournalEntry], seq: int) -> int:
    """The index of the first entry whose seq is after *seq* (they are in order)."""
    low, high = 0, len(entries)
    while low < high:
        mid = (low + high) // 2
        if entries[mid].seq <= seq:
            low = mid + 1
        else:
            high = mid
    return low


def _name(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    most = _NAME_CHARS[what]
    return value if len(value) <= most else value[:most]
