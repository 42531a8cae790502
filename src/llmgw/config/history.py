"""server.yaml's ``history:``: where the control plane keeps its journal, and how much of it and of its figures.

The journal (``llmgw.control.journal``) is held in memory up to
``journal_entries`` and appended to ``DIR/journal.jsonl``, which is rotated at
``journal_file_bytes`` with ``journal_files`` older files kept, so a restart
reads back what the last run wrote.  The rolling figures
(``llmgw.control.series``) keep ``series_buckets`` buckets of
``series_bucket_s`` seconds for at most ``series_subjects`` models, keys and
nodes.  All of it is read when the server starts (docs/configuration.rst).
"""

from __future__ import annotations

import os

import attrs

from llmgw.config.schema import LocalPath, Nullable
from llmgw.setting import setting

#: Where the journal goes when ``history.dir`` is not given: this, beside server.yaml.
DEFAULT_DIR = "history"


@attrs.frozen
class HistorySettings:
    """server.yaml's ``history:``: the journal's directory and bounds, and the rolling figures' size."""

    # None: ``history/`` in server.yaml's directory (``where``).
    dir: str | None = setting(None, kind=Nullable(LocalPath()))
    # Entries held in memory, which ``ctl events`` pages through.
    journal_entries: int = setting(10_000, least=100)
    # The reasons of those entries together, in characters: the oldest go first past it.
    journal_reason_chars: int = setting(4 * 1024 * 1024, least=4096)
    # journal.jsonl is rotated to journal.jsonl.1 when it would grow past this.
    journal_file_bytes: int = setting(8 * 1024 * 1024, least=65536)
    # Rotated files kept beside journal.jsonl (journal.jsonl.1 the newest); 0: none.
    journal_files: int = setting(3, least=0)
    # What one node (or one subject the control plane names) may add at once, then one per journal_refill_s.
    journal_burst: int = setting(30, least=1)
    journal_refill_s: float = setting(10.0, least=0)
    # The rolling figures: a bucket's width, how many are kept, and how many models, keys and nodes they follow.
    series_bucket_s: float = setting(10.0, above=0)
    series_buckets: int = setting(360, least=1)
    series_subjects: int = setting(2000, least=1)

    def where(self, config_path: str) -> str:
        """The journal's directory: ``dir``, or ``history/`` beside *config_path* (server.yaml)."""
        if self.dir is not None:
            return self.dir
        return os.path.join(os.path.dirname(os.path.abspath(config_path)), DEFAULT_DIR)
