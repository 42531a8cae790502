"""Everything about one node or replica, with its last hour and its log under it; Escape goes back.

The last hour (``llmgw.tui.sparks.HistoryPanel``) is a node's own figures
and events, or a replica's model's figures and the replica's own events;
it shows nothing for a subject the control plane has neither of.

What a node or an engine said is placed through ``render.said`` (a value)
or ``_value``: escaped, one line each, and never markup (the facts are a
``Text``).  :func:`shown` checks the whole once more before it is shown.
"""

from __future__ import annotations

from typing import Any, Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from llmgw import render
from llmgw.records import EngineInfo
from llmgw.render import DASH, said
from llmgw.states import EngineState, ReplicaState
from llmgw.text import printable
from llmgw.tui import columns
from llmgw.history import Scope
from llmgw.tui.common import FleetView, LinkBanner
from llmgw.tui.logs import LogPane, LogTarget, replica_log_target
from llmgw.tui.sparks import HistoryPanel
from llmgw.tui.store import FleetStore
from llmgw.views import NodeView, ReplicaView

LABEL = 12


def _value(v: Any) -> str:
    return DASH if v is None or v == "" else said(v)


def shown(text: Text) -> Text:
    """*text*, or its words escaped (unstyled) should a line of it hold a character a terminal would act on."""
    if all(line.isprintable() for line in text.plain.split("\n")):
        return text
    return Text(printable(text.plain, keep="\n"))


def _line(text: Text, label: str, value: str | Text) -> None:
    text.append(f"{label:<{LABEL}}", style="bold")
    text.append(value if isinstance(value, Text) else Text(value))
    text.append("\n")


def engine_line(engine: EngineInfo) -> Text:
    """Everything a node said of one build: "llama.cpp b6000 broken (server.yaml): needs libgomp.so.1 …"."""
    line = Text(render.build(engine))
    if engine.state is not None:
        line.append(f" {said(engine.state)}", style=columns.ENGINE_STATE_STYLES.get(engine.state, ""))
    if engine.origin:
        line.append(f" ({said(engine.origin)})", style="dim")
    if engine.reason:
        line.append(f": {said(engine.reason)}")
    if engine.path and engine.state != EngineState.ABSENT:
        line.append(f"  {said(engine.path)}", style="dim")
    return line


def node_facts(node: NodeView, seen_ago_s: float | None, replicas: list[ReplicaView]) -> Text:
    text = Text()
    text.append(said(node.id), style="bold")
    text.append("  ")
    text.append(columns.node_state(node))
    text.append("\n")
    if node.reason:
        _line(text, "reason", said(node.reason))
    _line(text, "last seen", render.ago(seen_ago_s))
    _line(text, "address", f"{_value(node.address)}  (host {_value(node.hostname)})")
    _line(text, "system", " · ".join(_value(v) for v in (node.os, node.kernel, node.arch)))
    _line(text, "agent", f"{_value(node.agent_version)} (protocol {_value(node.protocol)})")
    _line(text, "cpu", columns.cpu(node))
    _line(text, "memory", render.memory(node))
    _line(text, "gpus", f"{columns.gpus(node)}  (driver {_value(node.nvidia_driver)})")
    for card in node.gpus or []:
        utilisation = card.utilization_pct
        _line(text, "", f"  {card.index}  {_value(card.name)}  "
                        f"{render.size(card.memory_used_bytes)} / {render.size(card.memory_total_bytes)} used  "
                        f"{DASH if utilisation is None else f'{utilisation}%'} busy")
    _line(text, "disk", render.disk(node))
    for fs in node.filesystems or []:
        shared = " shared" if fs.shared else ""
        _line(text, "", f"  {said(fs.mountpoint)}  {_value(fs.fstype)}{shared}  "
                        f"{render.size(fs.free_bytes)} free / {render.size(fs.total_bytes)}  "
                        f"weights: {', '.join(map(said, fs.weights_dirs)) or DASH}")
    adapters = node.infiniband
    if adapters is None:
        _line(text, "infiniband", DASH)
    elif not adapters:
        _line(text, "infiniband", "none")
    for adapter in adapters or []:
        ports = ", ".join(f"port {p.port} {_value(p.state)} {_value(p.rate_gbps)} Gb/s" for p in adapter.ports)
        _line(text, "infiniband", f"{said(adapter.name)} fabric {_value(adapter.fabric)}: {ports or DASH}")
    if not node.engines:
        _line(text, "engines", columns.engines(node))
    for index, engine in enumerate(node.engines or ()):
        _line(text, "" if index else "engines", engine_line(engine))
    _line(text, "labels", ", ".join(f"{said(k)}={said(v)}" for k, v in sorted(node.labels.items())) or "none")
    warnings = [said(w) for w in node.warnings]
    if node.cpu is not None and node.cpu.avx2 is False and not any("AVX2" in w for w in warnings):
        warnings.append("CPU has no AVX2: llama.cpp runs several times slower here")
    for warning in warnings:
        _line(text, "warning", Text(f"! {warning}", style="bold yellow"))
    if replicas:
        _line(text, "replicas", ", ".join(f"{said(r.replica)} {_value(r.state)}" for r in replicas))
    else:
        _line(text, "replicas", "none")
    text.rstrip()
    return text


def replica_facts(replica: ReplicaView, age_s: float | None) -> Text:
    """*replica*'s details; *age_s* as of now (the store's, which counts on between fetches)."""
    text = Text()
    text.append(said(replica.replica), style="bold")
    text.append("  ")
    text.append(columns.replica_state(replica))
    text.append("\n")
    if replica.reason:
        _line(text, "reason", Text(said(replica.reason), style="red" if replica.state == ReplicaState.FAILED else ""))
    progress = replica.progress
    if progress is not None:
        bar = columns.progress(progress, width=30)
        if progress.file_name:
            bar.append(f"  {said(progress.file_name)}")
        _line(text, "progress", bar)
    _line(text, "model", _value(replica.model))
    _line(text, "nodes", ", ".join(map(said, replica.nodes)) or DASH)
    _line(text, "endpoint", _value(replica.endpoint))
    _line(text, "stale", {True: "stale: the catalog changed since it started", False: "no",
                          None: "unknown"}[replica.stale])
    _line(text, "age", render.age(age_s))
    _line(text, "fingerprint", _value(replica.fingerprint))
    for shard in replica.shards:
        line = Text(f"{said(shard.shard)} on {_value(shard.node)}: ")
        line.append(_value(shard.state), style=columns.SHARD_STATE_STYLES.get(shard.state, ""))
        line.append(f"  pid {_value(shard.pid)}  {_value(shard.endpoint)}" + (f"  {said(shard.reason)}" if shard.reason else ""))
        _line(text, "shard", line)
    tail = render.failed_tail(replica)
    for index, tail_line in enumerate(tail):
        _line(text, "output" if index == 0 else "", Text(tail_line, style="" if index == 0 else "dim"))
    if not replica.shards:
        _line(text, "shards", "none")
    text.rstrip()
    return text


class DetailsScreen(FleetView, Screen):
    CSS_PATH = "details.tcss"
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("backspace", "back", "Back", show=False),
        Binding("d", "node_verb('drain')", "Drain"),
        Binding("c", "node_verb('cordon')", "Cordon"),
        Binding("u", "node_verb('uncordon')", "Uncordon"),
        Binding("s", "next_source", "Log source"),
    ]

    def __init__(self, kind: str, key: str) -> None:
        super().__init__()
        self.kind = kind
        self.key = key

    def compose(self) -> ComposeResult:
        yield LinkBanner(id="banner")
        with VerticalScroll(id="facts-scroll"):
            yield Static(id="facts")
            yield self._history()
        yield LogPane(id="details-log")
        yield Footer(compact=True, show_command_palette=False)

    def _history(self) -> HistoryPanel:
        if self.kind == "node":
            return HistoryPanel(Scope.NODE, self.key, id="history")
        view = self.app.store.replicas.get(self.key)
        model = view.model if view is not None else self.key.rpartition("/")[0]
        return HistoryPanel(Scope.MODEL, model, replica=self.key, id="history")

    def on_mount(self) -> None:
        self.query_one(LinkBanner).show_link(self.app.link_problem)
        store: FleetStore = self.app.store
        self._show(store)
        target = None
        if self.kind == "node":
            target = LogTarget(self.key)
        elif self.key in store.replicas:
            target = replica_log_target(store.replicas[self.key])
        self.query_one(LogPane).follow(target)
        self.query_one("#facts-scroll").focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "node_verb":
            return self.kind == "node"
        return True

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_next_source(self) -> None:
        self.query_one(LogPane).action_next_source()

    def action_node_verb(self, verb: str) -> None:
        if self.kind == "node":
            self.app.ask_node_verb(verb, self.key)

    # -- the fleet changed --

    def _show(self, store: FleetStore) -> None:
        found = self.query("#facts")
        if not found:
            return  # pushed, not yet composed: on_mount shows it
        facts = found.first(Static)
        if self.kind == "node":
            view = store.nodes.get(self.key)
            text = node_facts(view, store.seen_ago(self.key), store.replicas_on(self.key)) if view else None
        else:
            view = store.replicas.get(self.key)
            text = replica_facts(view, store.replica_age(self.key)) if view else None
        gone = Text(f"{said(self.key)} is no longer in the fleet", style="yellow")
        facts.update(shown(text) if text is not None else gone)

    def fleet_loaded(self, store: FleetStore) -> None:
        self._show(store)

    def nodes_changed(self, store: FleetStore, node_ids: Iterable[str]) -> None:
        if self.kind == "node" and self.key in node_ids:
            self._show(store)

    def replicas_changed(self, store: FleetStore) -> None:
        self._show(store)

    def tick(self, store: FleetStore) -> None:
        """A node's "last seen" and a replica's age count on between events."""
        self._show(store)

    def show_link(self, problem: str | None) -> None:
        self.query_one(LinkBanner).show_link(problem)

    def link_back(self) -> None:
        self.query_one(HistoryPanel).fetch()

    def journal_entry(self, entry) -> None:
        self.query_one(HistoryPanel).add(entry)
