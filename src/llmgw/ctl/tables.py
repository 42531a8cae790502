"""What each ``llmgw ctl`` command prints of its answer: the nodes, replicas and status tables, weights, logs, reload.

The words inside a cell are the ones the dashboard and the admin page use
too (``llmgw.render``); the tables and their notes are ctl's own.
"""

from __future__ import annotations

import time
from typing import Any

from llmgw.answers import LogsAnswer, ReloadAnswer, WeightsAnswer
from llmgw.render import (DASH, age, ago, certificate_note, cpu, disk, engine_notes, engines, failed_tail, gpus,
                          log_lines, memory, said, size)
from llmgw.states import NodeState
from llmgw.views import FleetStatus, NodeBrief, NodeView, ReplicaView


def nodes_table(nodes: list[NodeView] | list[NodeBrief], now: float | None = None) -> str:
    if not nodes:
        return "no nodes have registered yet"
    header = ("NODE", "STATE", "ADDRESS", "CPU", "MEMORY", "GPUS", "DISK", "ENGINES", "LAST SEEN")
    rows = []
    notes = []
    now = time.time() if now is None else now
    for n in nodes:
        state = said(n.state or None)
        if n.cordoned:
            state += ",cordoned"
        node = said(n.id)
        rows.append((node, state, said(n.address or None), cpu(n), memory(n), gpus(n), disk(n), engines(n),
                     ago(n.seen_ago_s)))
        for warning in [*(n.warnings or []), *(n.link_warnings or [])]:
            notes.append(f"  {node}: {said(warning)}")
        expiry = certificate_note(n, now)
        if expiry:
            notes.append(f"  {node}: {expiry}")
        for line in engine_notes(n):
            notes.append(f"  {node}: {line}")
        if n.reason and n.state != NodeState.READY:
            notes.append(f"  {node}: {said(n.state)}: {said(n.reason)}")
    return table(header, rows) + ("\n" + "\n".join(notes) if notes else "")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Columns two spaces apart; a cell is one line, whatever it holds (``said``)."""
    cells = [[said(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def rank_lines(replica: ReplicaView) -> list[str]:
    """A line per rank of a multi-node replica, rank 0 first: its node, state, age and what it waits for.

    "rank 1 node02 not started 12s: waiting for rank 0's rendezvous on node01";
    a single-rank replica gets none, its row says it all.
    """
    shards = replica.shards
    if len(shards) < 2 and not any(s.rank for s in shards):
        return []
    out = []
    for s in sorted(shards, key=lambda s: (s.rank is None, s.rank or 0, s.shard)):
        state = "not started" if s.started is False else said(s.state or None)
        words = s.waiting or s.reason
        line = f"rank {DASH if s.rank is None else s.rank} {said(s.node)} {state} {age(s.age_s)}"
        out.append(f"{line}: {said(words)}" if words else line)
    return out


def replicas_table(replicas: list[ReplicaView]) -> str:
    """One row per replica; the reason (or a download's progress) on a line under it, and a failed engine's last lines."""
    if not replicas:
        return "the catalog asks for no replicas"
    header = ("MODEL", "REPLICA", "STATE", "NODES", "ENDPOINT", "AGE", "STALE")
    rows, notes = [], {}
    for r in replicas:
        stale = {True: "stale", False: "", None: "?" if r.nodes else ""}[r.stale]
        rows.append((
            r.model, r.replica, r.state or DASH, ",".join(r.nodes or []) or DASH, r.endpoint or DASH, age(r.age_s), stale,
        ))
        below = [f"    {said(r.reason)}"] if r.reason else []
        below += [f"    {line}" for line in rank_lines(r)]
        below += [f"      {line}" for line in failed_tail(r)]
        if below:
            notes[len(rows) - 1] = below
    lines = table(header, rows).splitlines()
    out = [lines[0]]
    for index, line in enumerate(lines[1:]):
        out.append(line)
        out.extend(notes.get(index, ()))
    return "\n".join(out)


def _figure(value: Any) -> str:
    return DASH if value is None else str(value)


def status_text(status: FleetStatus) -> str:
    header = ("MODEL", "ENGINE", "READY", "DESIRED", "STATES", "STALE", "WEIGHTS HELD (BY FABRIC)")
    rows = [
        (m.model, m.engine or DASH, _figure(m.ready), _figure(m.desired),
         ", ".join(f"{n} {state}" for state, n in sorted(m.states.items())) or DASH,
         str(m.stale) if m.stale else "",
         ", ".join(f"{fabric}: {n}" for fabric, n in sorted((m.weights_by_fabric or {}).items())) or DASH)
        for m in status.models
    ]
    fleet = ", ".join(f"{n} {said(state)}" for state, n in sorted(status.nodes.items())) or "no nodes"
    body = table(header, rows) if rows else "the catalog has no models"
    text = f"{body}\nnodes: {fleet}"
    if status.servers:  # with ha: (docs/operations.rst, "Two servers")
        text += "\n\n" + table(("SERVER", "ROLE", "EPOCH", "HUB", "API"), [
            (said(s.name), said(getattr(s.role, "value", s.role) or DASH), _figure(s.epoch), said(s.url or DASH), said(s.api_url or DASH))
            for s in status.servers])
    return text


def logs_text(answer: LogsAnswer) -> str:
    """A header naming the node, the source and the others it has, then each line as the node wrote it, escaped."""
    others = [said(s) for s in answer.sources if s != answer.source]
    head = f"# {said(answer.node)} {said(answer.source)}: last {len(answer.lines)} lines"
    if others:
        head += f" (other sources: {', '.join(others)})"
    return "\n".join([head, *log_lines(answer.lines)])


def weights_text(answer: WeightsAnswer) -> str:
    """What llmgw fetched that no model wants, per node, and what each node did when asked."""
    lines = []
    for node, files in sorted(answer.unwanted.items()):
        for f in files:
            lines.append(f"{said(node)}  {size(f.size_bytes)}  {said(f.path)}")
    if not lines:
        lines.append("no node holds weights llmgw fetched that the catalog no longer wants")
    elif answer.collected is None:
        lines.append("(llmgw ctl weights --collect asks the nodes to remove them)")
    if answer.collected is not None:
        asked = sum(len(files) for files in answer.unwanted.values())
        removed = sum(len(r.removed) for r in answer.collected.values())
        lines.append(f"asked to remove {asked} file(s) on {len(answer.collected)} node(s): {removed} removed")
        for node, result in sorted(answer.collected.items()):
            for path, why in sorted(result.refused.items()):
                lines.append(f"  {said(node)} refused: {said(why)}")
    return "\n".join(lines)


def reload_text(answer: ReloadAnswer) -> str:
    """"reloaded: " and each change the reload applied, or that there were none."""
    return "reloaded: " + ("; ".join(answer.changes) or "no changes")
