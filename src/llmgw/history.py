"""What happened and how it is going: the records of the control plane's journal and its rolling figures.

The journal (``llmgw.control.journal``) keeps the control plane's decisions
and what nodes told it, each a ``JournalEntry``; ``llmgw.cp.events`` answers
a ``JournalPage`` and ``llmgw.event.journal`` publishes each new entry.  The
figures (``llmgw.control.series``) keep short rolling series of what the
routers and the nodes already count; ``llmgw.cp.figures`` answers
``Figures``.  ctl, the TUI and the admin page read these fields.

The reasons are words from nodes and from placement: shown escaped
(``llmgw.text.printable``), never decided on.
"""

from __future__ import annotations

import enum

import attrs

from llmgw.wire import Text, field

#: A reason in the journal: cut past this.
REASON_CHARS = 2048
#: Entries one page holds at most.
PAGE_MOST = 10_000


class JournalKind(enum.StrEnum):
    """What a journal entry records; the value is what ctl shows and ``--json`` writes."""

    # Nodes, from what they told the control plane.
    NODE_REGISTERED = "node registered"
    NODE_UNREACHABLE = "node unreachable"
    NODE_LOST = "node lost"
    NODE_BACK = "node back"
    NODE_CORDONED = "node cordoned"
    NODE_UNCORDONED = "node uncordoned"
    NODE_DRAINED = "node drained"
    NODE_FORGOTTEN = "node forgotten"
    ENGINE_INSTALLED = "engine installed"
    ENGINE_BROKEN = "engine broken"
    # Replicas, from the reconciler's decisions and the shards' reports.
    PLACED = "placed"
    UNPLACEABLE = "unplaceable"
    READY = "ready"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"
    # Elastic replicas (docs/scaling.rst).
    COLD_START = "cold start"
    SCALED_UP = "scaled up"
    SCALED_DOWN = "scaled down"
    SLEPT = "slept"
    EVICTED = "evicted"
    # The catalog and the server.
    RELOAD = "reload"
    SERVER_STARTED = "server started"


@attrs.frozen
class JournalEntry:
    """One thing that happened: when, what, to whom, and why in the node's or placement's words."""

    seq: int = field(least=0, most=2**62)  # increasing, across restarts (read back from the file)
    at: float = field(least=0, most=2**40)  # seconds since the epoch
    kind: JournalKind = attrs.field(converter=JournalKind)
    subject: str = field(chars=1024)  # "node03", "qwen/0", "qwen", a key's name
    reason: str = field("", chars=REASON_CHARS, text=Text.PROSE)
    node: str | None = field(None, chars=256)
    model: str | None = field(None, chars=1024)
    replica: str | None = field(None, chars=1024)


@attrs.frozen
class JournalPage:
    """``llmgw.cp.events``: entries oldest first, and how many the bounds have let go of."""

    entries: list[JournalEntry] = field(factory=list, items=PAGE_MOST)
    newest_seq: int = field(0, least=0, most=2**62)
    # Entries no longer kept (memory and file bounds), since the journal began.
    dropped: int = field(0, least=0, most=2**62)


class Scope(enum.StrEnum):
    """What a series is about."""

    MODEL = "model"
    KEY = "key"
    NODE = "node"


@attrs.frozen
class Series:
    """One figure over the last hour: a point per bucket, oldest first; None where nothing was known."""

    scope: Scope = attrs.field(converter=Scope)
    subject: str = field(chars=1024)  # the model, key or node
    name: str = field(chars=64)  # "requests_per_s", "ttft_p99_ms", "gpu_util_pct", ... (docs/metrics.rst)
    unit: str = field(chars=32)  # "req/s", "tok/s", "ms", "%", "bytes", "requests"
    points: list[float | None] = field(factory=list, items=100_000)


@attrs.frozen
class Figures:
    """``llmgw.cp.figures``: every series, bucketed alike; ``end`` is when the newest bucket ends."""

    bucket_s: float = field(10.0, least=0, most=86_400)
    end: float = field(0.0, least=0, most=2**40)
    series: list[Series] = field(factory=list, items=PAGE_MOST)
