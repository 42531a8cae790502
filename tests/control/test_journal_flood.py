"""A hostile node changing state a thousand times a second: the journal holds its memory and file bounds.

The node really goes through the fleet (register, its link closed,
register again), so the feed, the journal's rate and its file all take
the flood as the server would.  The process's resident memory is measured
before and after.
"""

from __future__ import annotations

import gc
import os

from twisted.internet.task import Clock

from llmgw.config.history import HistorySettings
from llmgw.control.fleet import Fleet
from llmgw.control.journal import Journal
from llmgw.control.journalfeed import JournalFeed
from llmgw.history import JournalKind
from llmgw.records import Inventory


def resident_bytes() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_flood_from_one_node_holds_memory_and_files_and_keeps_the_others_history(tmp_path):
    clock = Clock()
    clock.advance(1_800_000_000)
    settings = HistorySettings(journal_entries=1000, journal_file_bytes=65536, journal_files=2)
    journal = Journal(clock, settings, str(tmp_path))
    feed = JournalFeed(journal)
    fleet = Fleet(clock, feed.observe, unreachable_after=15, lost_after=60)

    def inventory(node_id):
        return Inventory(node_id=node_id, address="10.0.0.5", agent_version="0.1.0")

    fleet.register("node01", 1, inventory("node01"))
    good = journal.page(node="node01").entries
    assert [e.kind for e in good] == [JournalKind.NODE_REGISTERED]

    def flood(cycles: int, start: int) -> None:
        for i in range(start, start + cycles):
            fleet.register("evil", 1000 + i, inventory("evil"))
            fleet.link_closed(1000 + i)
            clock.advance(0.001)  # a thousand changes a second

    flood(5_000, 0)  # the journal and its files reach their bounds, and every cache its size
    before = resident_bytes()
    flood(30_000, 5_000)
    after = resident_bytes()

    assert after - before < 8 * 1024 * 1024, f"grew {(after - before) / 1e6:.1f} MB"
    assert len(journal) <= settings.journal_entries
    on_disk = sum(os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path))
    assert on_disk <= settings.journal_file_bytes * (settings.journal_files + 1)
    # 70,000 changes over 35 s of the test's clock: the burst, then one per journal_refill_s.
    evil = journal.page(node="evil", limit=10_000).entries
    assert len(evil) <= settings.journal_burst + 35 / settings.journal_refill_s + 1
    assert "were not kept" in evil[-1].reason
    assert journal.page(node="node01").entries == good  # the rest of the fleet's history is still there
    assert journal.page().dropped >= 69_000
