"""The cells of the nodes and replicas tables, made from the control plane's views.

The words and figures are ``llmgw ctl``'s (``llmgw.ctl.render``), so the two
never disagree about what a node reported; this module adds only colour, the
GPU utilisation, engines and a download's progress.  A value a node did not
report is ``-``.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from llmgw.ctl import render
from llmgw.ctl.render import DASH

NODE_COLUMNS = (
    ("node", "NODE"),
    ("state", "STATE"),
    ("seen", "SEEN"),
    ("memory", "MEMORY"),
    ("gpus", "GPUS"),
    ("disk", "DISK"),
    ("engines", "ENGINES"),
    ("cpu", "CPU"),
    ("address", "ADDRESS"),
)

REPLICA_COLUMNS = (
    ("model", "MODEL"),
    ("index", "#"),
    ("state", "STATE"),
    ("nodes", "NODES"),
    ("stale", "STALE"),
    ("age", "AGE"),
    ("note", "PROGRESS / REASON"),
    # Last: the one column an operator copies rather than reads.
    ("endpoint", "ENDPOINT"),
)

NODE_STATE_STYLES = {"ready": "green", "unreachable": "yellow", "lost": "bold red"}
REPLICA_STATE_STYLES = {
    "ready": "green",
    "pending": "yellow",
    "failed": "bold red",
    "draining": "magenta",
    "starting": "cyan",
    "downloading": "cyan",
    "installing": "cyan",
}

# The longest reason a table cell shows; the details screen has the rest.
NOTE_WIDTH = 60
BAR_WIDTH = 12


def needs_attention(node: dict[str, Any]) -> bool:
    """The node has something to say: warnings, or a CPU known to lack AVX2."""
    cpu = node.get("cpu") or {}
    return bool(node.get("warnings")) or cpu.get("avx2") is False


def node_state(node: dict[str, Any]) -> Text:
    state = node.get("state") or DASH
    text = Text(state, style=NODE_STATE_STYLES.get(state, ""))
    if node.get("cordoned"):
        text.append(",cordoned", style="magenta")
    if needs_attention(node):
        text.append(" !", style="bold yellow")
    return text


def cpu(node: dict[str, Any]) -> Text:
    text = render.cpu(node)
    cpu = node.get("cpu") or {}
    return Text(text, style="bold red" if cpu.get("avx2") is False else "")


def gpus(node: dict[str, Any]) -> str:
    """ctl's summary, with the cards' mean utilisation when every card reported it."""
    text = render.gpus(node)
    cards = node.get("gpus") or []
    utilisation = [c.get("utilization_pct") for c in cards]
    if cards and None not in utilisation:
        text += f" {sum(utilisation) / len(utilisation):.0f}%"
    return text


def engines(node: dict[str, Any]) -> str:
    found = node.get("engines")
    if found is None:
        return DASH
    if not found:
        return "none"
    return ", ".join(f"{e.get('name') or '?'} {e['version']}" if e.get("version") else e.get("name") or "?" for e in found)


def node_cells(node: dict[str, Any], seen_ago_s: float | None) -> tuple:
    """One row of the nodes table, in ``NODE_COLUMNS`` order."""
    return (
        node["id"],
        node_state(node),
        render.ago(seen_ago_s),
        render.memory(node),
        gpus(node),
        render.disk(node),
        engines(node),
        cpu(node),
        node.get("address") or DASH,
    )


def rate(bps: float | None) -> str:
    if bps is None:
        return DASH
    if bps >= 1e9:
        return f"{bps / 1e9:.1f} GB/s"
    return f"{bps / 1e6:.0f} MB/s"


def progress(p: dict[str, Any], width: int = BAR_WIDTH) -> Text:
    """A download's progress: a bar when the total is known, the bytes so far when not."""
    done = p.get("bytes_done")
    total = p.get("bytes_total")
    text = Text()
    if total and done is not None:
        fraction = min(1.0, max(0.0, done / total))
        filled = round(fraction * width)
        text.append("━" * filled, style="bold cyan")
        text.append("━" * (width - filled), style="grey37")
        text.append(f" {fraction * 100:3.0f}% {render.gb(done)} / {render.gb(total)}")
    else:
        text.append(f"{render.gb(done)} so far")
    if p.get("rate_bps") is not None:
        text.append(f" {rate(p['rate_bps'])}")
    return text


def stale(replica: dict[str, Any]) -> Text:
    # As ctl: unknown is "?" only where there is something to be stale.
    flag = replica.get("stale")
    if flag is True:
        return Text("stale", style="bold yellow")
    if flag is None and replica.get("nodes"):
        return Text("?")
    return Text("")


def note(replica: dict[str, Any]) -> Text:
    if replica.get("progress"):
        return progress(replica["progress"])
    reason = replica.get("reason")
    if not reason:
        return Text("")
    if len(reason) > NOTE_WIDTH:
        reason = reason[: NOTE_WIDTH - 1] + "…"
    return Text(reason, style="red" if replica.get("state") == "failed" else "")


def replica_index(replica: dict[str, Any]) -> str:
    return replica["replica"].rpartition("/")[2]


def replica_cells(replica: dict[str, Any]) -> tuple:
    """One row of the replicas table, in ``REPLICA_COLUMNS`` order."""
    state = replica.get("state") or DASH
    return (
        replica.get("model") or DASH,
        replica_index(replica),
        Text(state, style=REPLICA_STATE_STYLES.get(state, "")),
        ",".join(replica.get("nodes") or []) or DASH,
        stale(replica),
        render.age(replica.get("age_s")),
        note(replica),
        replica.get("endpoint") or DASH,
    )
