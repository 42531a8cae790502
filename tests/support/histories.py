"""A journal and an hour of figures as the control plane answers them (``llmgw.history``), built by hand.

For the admin page's and the dashboard's tests: a known pattern whose values
a test reads back from what is drawn, and a hostile node's words in a reason.
"""

from __future__ import annotations

from llmgw.history import Figures, JournalEntry, JournalKind, JournalPage, Scope, Series

NOW = 1_790_000_000.0  # a fixed "now" (2026-09-21 14:13 UTC)
BUCKET_S = 10.0
POINTS = 360
HOSTILE = "<script>alert('pwned')</script>\x1b[2J\u202e"

#: The known traffic pattern: nothing for 50 minutes, 2 requests/s for 9, then 3.5 for the last minute.
QWEN_REQUESTS = [None] * 300 + [2.0] * 54 + [3.5] * 6


def entry(seq: int, ago_s: float, kind: JournalKind, subject: str, reason: str = "", **where) -> JournalEntry:
    return JournalEntry(seq=seq, at=NOW - ago_s, kind=kind, subject=subject, reason=reason, **where)


def journal(node: str = "gpu01", other: str = "cpu07", dropped: int = 0) -> JournalPage:
    """What happened to a small fleet over the last hour, oldest first."""
    entries = [
        entry(1, 3500, JournalKind.SERVER_STARTED, "server", "llmgw-server 0.1 started"),
        entry(2, 3400, JournalKind.NODE_REGISTERED, node, "agent 0.1, protocol 1", node=node),
        entry(3, 3390, JournalKind.PLACED, "qwen/0", f"{node}: 64 GB of GPU memory free, needs 40",
              node=node, model="qwen", replica="qwen/0"),
        entry(4, 3300, JournalKind.READY, "qwen/0", "ready after 41 s", node=node, model="qwen", replica="qwen/0"),
        entry(5, 1800, JournalKind.EXITED, "qwen/0", f"exited 137 (killed): {HOSTILE}", node=node, model="qwen",
              replica="qwen/0"),
        entry(6, 1790, JournalKind.READY, "qwen/0", "ready after 12 s", node=node, model="qwen", replica="qwen/0"),
        entry(7, 900, JournalKind.NODE_LOST, other, "no heartbeat for 60 s", node=other),
        entry(8, 840, JournalKind.SLEPT, "llama/0", "idle: scaled to zero, last request 14 min ago",
              node=other, model="llama", replica="llama/0"),
        entry(9, 60, JournalKind.RELOAD, "catalog", "added llama; qwen: replicas 1 -> {min: 0, max: 3}"),
    ]
    return JournalPage(entries=entries, newest_seq=entries[-1].seq, dropped=dropped)


def figures(node: str = "gpu01") -> Figures:
    """An hour of 10 s buckets: ``QWEN_REQUESTS`` and what goes with it, and *node*'s heartbeats."""
    busy = [None if r is None else r * 10 for r in QWEN_REQUESTS]
    series = [
        Series(Scope.MODEL, "qwen", "requests_per_s", "req/s", QWEN_REQUESTS),
        Series(Scope.MODEL, "qwen", "tokens_out_per_s", "tok/s", [None if r is None else r * 120 for r in QWEN_REQUESTS]),
        Series(Scope.MODEL, "qwen", "ttft_p50_ms", "ms", [None if r is None else 180.0 for r in QWEN_REQUESTS]),
        Series(Scope.MODEL, "qwen", "ttft_p99_ms", "ms", [None if r is None else 950.0 for r in QWEN_REQUESTS]),
        Series(Scope.MODEL, "qwen", "errors_per_s", "req/s", [None if r is None else 0.0 for r in QWEN_REQUESTS]),
        Series(Scope.MODEL, "qwen", "queue", "requests", [None if r is None else 0.0 for r in QWEN_REQUESTS]),
        Series(Scope.NODE, node, "memory_used_pct", "%", [20 + i / 10 for i in range(POINTS)]),
        # A gap: heartbeats missed for five minutes.
        Series(Scope.NODE, node, "gpu_util_pct", "%", [float(i % 100) if not 200 <= i < 230 else None
                                                       for i in range(POINTS)]),
        Series(Scope.NODE, node, "gpu_memory_used_pct", "%", [50.0 if b is None else 75.0 for b in busy]),
    ]
    return Figures(bucket_s=BUCKET_S, end=NOW, series=series)
