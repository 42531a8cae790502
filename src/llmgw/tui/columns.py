"""The cells of the nodes and replicas tables, made from the control plane's views.

The words and figures are ``llmgw ctl``'s (``llmgw.render``), so the two
never disagree about what a node reported; this module adds only colour, the
GPU utilisation, engines and a download's progress.  A value a node did not
report is ``-``.  A node's words are placed through ``render.said``, as
ctl places them, and the table takes no cell as markup (``table.shown``).
"""

from __future__ import annotations

from rich.text import Text

from llmgw import render
from llmgw.records import Progress
from llmgw.render import DASH, said
from llmgw.states import EngineState, NodeState, ReplicaState, ShardState
from llmgw.views import NodeView, ReplicaView

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

NODE_STATE_STYLES = {NodeState.READY: "green", NodeState.UNREACHABLE: "yellow", NodeState.LOST: "bold red"}
REPLICA_STATE_STYLES = {
    ReplicaState.READY: "green",
    ReplicaState.PENDING: "yellow",
    ReplicaState.FAILED: "bold red",
    ReplicaState.DRAINING: "magenta",
    # On its way: its weights coming, then its engine.
    ReplicaState.FETCHING: "cyan",
    ReplicaState.STARTING: "cyan",
    # Scaled to zero while idle: not a fault; the first request wakes it.
    ReplicaState.SLEEPING: "blue",
}
# A shard reads as the replica it belongs to would in the same state.
SHARD_STATE_STYLES = {
    ShardState.READY: "green",
    ShardState.FAILED: "bold red",
    ShardState.DRAINING: "magenta",
    ShardState.FETCHING: "cyan",
    ShardState.STARTING: "cyan",
}

# The longest reason a table cell shows; the details screen has the rest.
NOTE_WIDTH = 60
BAR_WIDTH = 12


def needs_attention(node: NodeView) -> bool:
    """The node has something to say: warnings, or a CPU known to lack AVX2."""
    return bool(node.warnings) or (node.cpu is not None and node.cpu.avx2 is False)


def node_state(node: NodeView) -> Text:
    state = node.state or DASH
    text = Text(said(state), style=NODE_STATE_STYLES.get(state, ""))
    if node.cordoned:
        text.append(",cordoned", style="magenta")
    if needs_attention(node):
        text.append(" !", style="bold yellow")
    return text


def cpu(node: NodeView) -> Text:
    text = render.cpu(node)
    return Text(text, style="bold red" if node.cpu is not None and node.cpu.avx2 is False else "")


def gpus(node: NodeView) -> str:
    """ctl's summary, with the cards' mean utilisation when every card reported it."""
    text = render.gpus(node)
    cards = node.gpus or []
    utilisation = [c.utilization_pct for c in cards]
    if cards and None not in utilisation:
        text += f" {sum(utilisation) / len(utilisation):.0f}%"
    return text


ENGINE_STATE_STYLES = {EngineState.INSTALLING: "cyan", EngineState.BROKEN: "bold red"}


def engines(node: NodeView) -> Text:
    """ctl's ENGINES, each build that cannot run yet in its state's colour."""
    listed = render.listed_engines(node)
    if not listed:
        return Text(render.engines(node))
    text = Text()
    for index, engine in enumerate(listed):
        if index:
            text.append(", ")
        text.append(render.engine_cell(engine), style=ENGINE_STATE_STYLES.get(engine.state, ""))
    return text


def node_cells(node: NodeView, seen_ago_s: float | None) -> tuple:
    """One row of the nodes table, in ``NODE_COLUMNS`` order."""
    return (
        said(node.id),
        node_state(node),
        render.ago(seen_ago_s),
        render.memory(node),
        gpus(node),
        render.disk(node),
        engines(node),
        cpu(node),
        said(node.address or None),
    )


def rate(bps: float | None) -> str:
    if bps is None:
        return DASH
    return f"{render.size(bps)}/s"


def progress(p: Progress, width: int = BAR_WIDTH) -> Text:
    """A download's progress: a bar when the total is known, the bytes so far when not."""
    done = p.bytes_done
    total = p.bytes_total
    text = Text()
    if total and done is not None:
        fraction = min(1.0, max(0.0, done / total))
        filled = round(fraction * width)
        text.append("━" * filled, style="bold cyan")
        text.append("━" * (width - filled), style="grey37")
        text.append(f" {fraction * 100:3.0f}% {render.size(done)} / {render.size(total)}")
    else:
        text.append(f"{render.size(done)} so far")
    if p.rate_bps is not None:
        text.append(f" {rate(p.rate_bps)}")
    return text


def stale(replica: ReplicaView) -> Text:
    # As ctl: unknown is "?" only where there is something to be stale.
    if replica.stale is True:
        return Text("stale", style="bold yellow")
    if replica.stale is None and replica.nodes:
        return Text("?")
    return Text("")


def note(replica: ReplicaView) -> Text:
    if replica.progress is not None:
        return progress(replica.progress)
    if not replica.reason:
        return Text("")
    reason = said(replica.reason)
    if len(reason) > NOTE_WIDTH:
        reason = reason[: NOTE_WIDTH - 1] + "…"
    return Text(reason, style="red" if replica.state == ReplicaState.FAILED else "")


def replica_index(replica: ReplicaView) -> str:
    return said(replica.replica.rpartition("/")[2])


def replica_state(replica: ReplicaView) -> Text:
    state = replica.state or DASH
    return Text(said(state), style=REPLICA_STATE_STYLES.get(state, ""))


def replica_cells(replica: ReplicaView, age_s: float | None) -> tuple:
    """One row of the replicas table, in ``REPLICA_COLUMNS`` order; *age_s* as of now (the store's)."""
    return (
        said(replica.model or None),
        replica_index(replica),
        replica_state(replica),
        said(",".join(replica.nodes or []) or None),
        stale(replica),
        render.age(age_s),
        note(replica),
        said(replica.endpoint or None),
    )
