"""The words three UIs share: the control plane's views (``llmgw.views``) as text a person reads.

``llmgw ctl``, the dashboard and the admin page say a node's memory, GPUs,
disks and engines, a size, an age, a download, a failed engine's last lines
and a log's lines with these same functions, so the three never disagree;
what only one of them lays out (ctl's tables, ``llmgw.ctl.tables``) is its own.

What a node did not report shows as ``-``, never as 0: an old agent is not a
small machine, and an unmounted filer is not a full disk.  Every word a node
or an engine wrote goes through :func:`said` (``llmgw.text.printable``) as
it is placed: an escape sequence shows as ``\\x1b[2J``, not a cleared
screen, and a newline in a reason as ``\\n``, not a line of its own.
"""

from __future__ import annotations

import datetime
from typing import Any

from llmgw.answers import CordonAnswer, DrainAnswer
from llmgw.records import EngineInfo, Progress
from llmgw.states import EngineState, ShardState
from llmgw.text import printable
from llmgw.views import NodeBrief, NodeView, ReplicaView, Space

DASH = "-"


def said(value: Any) -> str:
    """A value a node (or an engine, or a newer server) sent, as one line of text: ``-`` when not sent."""
    return DASH if value is None else printable(str(value))


def size(n: int | float | None) -> str:
    """Bytes as a person reads them, in the unit that suits: ``253 MB``, ``1.5 GB``, ``640 GB``; ``-`` when not known.

    The one size formatter of ctl, the dashboard and the admin page: a
    tenth below 100 of a unit, whole from there.
    """
    if n is None:
        return DASH
    for unit, scale in _UNITS:
        value = n / scale
        figure = f"{value:.1f}" if abs(value) < 100 and unit != "B" else f"{value:.0f}"
        if abs(float(figure)) < 1000:  # 999.97 MB is "1.0 GB", not "1000 MB"
            return f"{figure} {unit}"
    return f"{n / 1e12:.0f} TB"


_UNITS = (("B", 1), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12))  # past 999 TB: whole TB


def download_words(progress: Progress | None) -> str | None:
    """A download as words: ``model.safetensors: 120 MB of 253 MB at 5.0 MB/s``; None when there is none."""
    if progress is None:
        return None
    rate = f" at {size(progress.rate_bps)}/s" if progress.rate_bps else ""
    return f"{said(progress.file_name)}: {size(progress.bytes_done)} of {size(progress.bytes_total)}{rate}"


def not_started(replica: ReplicaView | None, shard_id: str | None) -> str | None:
    """What *replica*'s shard *shard_id* does instead of writing a log (fetching, waiting); None once it has started.

    Its node has no log for it yet: the dashboard and the admin page show
    this instead of asking it (which would only be refused, every poll).
    """
    if replica is None or shard_id is None:
        return None
    shard = next((s for s in replica.shards if s.shard == shard_id), None)
    if shard is None or (shard.state not in (ShardState.FETCHING, None) and shard.started is not False):
        return None
    if shard.started is False:
        doing = said(shard.waiting or "waiting to be started")
    else:
        doing = "fetching its weights"
        if replica.progress is not None:
            doing += ": " + download_words(replica.progress)
    return f"{said(shard_id)} has not started, so it has no log yet: {doing}"


def ago(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.1f}d ago"


def cpu(node: NodeView | NodeBrief) -> str:
    c = node.cpu
    if not c:
        return DASH
    model = said(c.model or None)
    cores = c.logical_cores
    text = f"{model} ({cores})" if cores else model
    if c.avx2 is False:
        text += " NO AVX2!"
    return text


def memory(node: NodeView | NodeBrief) -> str:
    total = node.memory_total_bytes
    available = node.memory_available_bytes
    if total is None:
        return DASH
    if available is None:
        return size(total)
    return f"{size(available)} free / {size(total)}"


def gpus(node: NodeView | NodeBrief) -> str:
    summary = node.gpu_summary
    if summary is None:
        return DASH
    if not summary.kinds:
        return "none"
    names: dict[str, int] = {}
    for name, n in summary.kinds.items():
        short = said(name.replace("NVIDIA ", ""))
        names[short] = names.get(short, 0) + n
    kinds = ", ".join(f"{n}x {name}" for name, n in names.items())
    if summary.memory_used_bytes is None or summary.memory_total_bytes is None:
        return kinds
    return f"{kinds} ({size(summary.memory_used_bytes)} / {size(summary.memory_total_bytes)} used)"


def _space(space: Space | None) -> str | None:
    return None if space is None else f"{size(space.free_bytes)} free / {size(space.total_bytes)}"


def disk(node: NodeView | NodeBrief) -> str:
    """Local space, with shared filesystems apart: a filer's space is everyone's."""
    summary = node.disk_summary
    if summary is None:
        return DASH
    parts = [_space(summary.local) or DASH]
    shared = _space(summary.shared)
    if shared:
        parts.append(f"shared {shared}")
    return ", ".join(parts)


#: What an engine entry that cannot run (yet) adds to its build in the ENGINES column.
ENGINE_MARKS = {EngineState.INSTALLING: "installing", EngineState.BROKEN: "broken"}


def build(engine: EngineInfo) -> str:
    """"llama.cpp b6000", or the name alone when the node gave no version."""
    name = said(engine.name or "?")
    return f"{name} {said(engine.version)}" if engine.version else name


def engine_cell(engine: EngineInfo) -> str:
    """One entry, compact: "llama.cpp b6000", "llama.cpp b6000 (installing)", "llama.cpp b6000 (broken)"."""
    mark = ENGINE_MARKS.get(engine.state)
    return f"{build(engine)} ({mark})" if mark else build(engine)


def listed_engines(node: NodeView | NodeBrief) -> list[EngineInfo]:
    """The entries worth a column: an absent engine is every node's, and is said only when asked."""
    return [e for e in node.engines or () if e.state != EngineState.ABSENT]


def engines(node: NodeView | NodeBrief) -> str:
    """ENGINES: every build the node has or is getting; "none" when it has looked and has none, "-" unreported."""
    if node.engines is None:
        return DASH
    return ", ".join(engine_cell(e) for e in listed_engines(node)) or "none"


def engine_notes(node: NodeView | NodeBrief) -> list[str]:
    """A line for each build that cannot run yet, in the node's words: what it is doing, or what to do."""
    return [
        f"{build(e)} {said(e.state)}: {said(e.reason)}" if e.reason else f"{build(e)} {said(e.state)}"
        for e in node.engines or () if e.state in ENGINE_MARKS
    ]


# A node certificate this close to its end is worth a line under the table.
EXPIRY_WARNING_S = 30 * 86400


def certificate_note(node: NodeView | NodeBrief, now: float) -> str | None:
    """"its certificate expires in 12 days (2027-01-05)…", or None while it is far off or not known."""
    expires = node.certificate_not_after
    if expires is None or expires - now > EXPIRY_WARNING_S:
        return None
    day = datetime.datetime.fromtimestamp(expires, datetime.timezone.utc).strftime("%Y-%m-%d")
    left = expires - now
    when = f"expired on {day}" if left <= 0 else f"expires in {left / 86400:.0f} days ({day})"
    return (f"its certificate {when}: issue a new one with `llmgw pki issue DIR {node.id} --role node --force` "
            "where the CA is, and restart its agent")


#: How many of a failed engine's last lines ``ctl replicas`` shows; ``--json`` has all it sent.
TAIL_LINES = 10


def failed_tail(replica: ReplicaView) -> list[str]:
    """The last lines of each failed shard of *replica* that sent any, each shard's under its id."""
    out = []
    for shard in replica.shards:
        if shard.state == ShardState.FAILED and shard.output_tail:
            out.append(f"last lines of {said(shard.shard)} on {said(shard.node)}:")
            out.extend(said(line) for line in shard.output_tail[-TAIL_LINES:])
    return out


def age(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def node_verb_text(answer: CordonAnswer | DrainAnswer) -> str:
    """What a cordon, an uncordon or a drain did: "node01: cordoned; asked to stop 1 shard(s): echo/0/0"."""
    text = f"{said(answer.node)}: {'cordoned' if answer.cordoned else 'uncordoned'}"
    stopped = answer.stopped if isinstance(answer, DrainAnswer) else None
    if stopped is not None:
        text += f"; asked to stop {len(stopped)} shard(s)" + (f": {', '.join(map(said, stopped))}" if stopped else "")
    return text


def log_lines(lines: list[str]) -> list[str]:
    """Each log line as a line of text: its escape sequences, carriage returns and newlines shown, not obeyed."""
    return [said(line) for line in lines]


def new_lines_start(before: list[str], after: list[str]) -> int | None:
    """Where in *after* the lines that *before* had not shown start; None when the two share no line.

    Both are windows on one growing log, and *after* was read later: it
    may start earlier than *before* (a longer window) or later (the log
    moved on).  *before*'s longest tail found in *after* is the seam; where
    lines repeat and several seams fit, the earliest is taken.
    """
    if not before:
        return 0
    best, start = 0, None
    for end in range(1, len(after) + 1):
        k = 0
        while k < min(len(before), end) and before[-1 - k] == after[end - 1 - k]:
            k += 1
        if k > best:
            best, start = k, end
            if k == len(before):
                break
    return start


def new_lines(before: list[str], after: list[str]) -> list[str]:
    """The lines of *after* that *before* had not shown (all of *after* when they share none)."""
    return after[new_lines_start(before, after) or 0:]
