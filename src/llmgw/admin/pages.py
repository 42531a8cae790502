"""The admin page's HTML: the control plane's views (``llmgw.views``) as ``twisted.web.template`` tags.

Everything a node sent goes into the tree as a string, which the flattener
escapes: a log line ``<script>`` is text, a label is text, a node name in a
link is a quoted, URL-encoded query value, and no href is a node's (each is
the page's own path with the node's words as query values).  A character
the browser would act on rather than show (a bidi override turning a name
around, a control character) is written as its escape, as ctl writes it:
:func:`page` passes every text of the tree through ``llmgw.text.printable``
(newlines kept, for a log's ``<pre>``, whose lines are escaped one by one).
Cells say ``-`` for what was not reported, with the same words ``llmgw ctl``
uses (``llmgw.render``).
Nothing here is asynchronous or reads the fleet: ``llmgw.admin.site`` hands
each function what it fetched.
"""

from __future__ import annotations

import time
from typing import Iterable
from urllib.parse import urlencode

from twisted.web.template import Tag, tags

from llmgw import render
from llmgw.answers import LogsAnswer
from llmgw.records import Progress
from llmgw.states import EngineState, NodeState, ReplicaState, ShardState
from llmgw.text import printable
from llmgw.views import NodeView, ReplicaView

DASH = render.DASH
#: Node verbs the page offers, and what the confirmation says each does.
VERBS = {
    "drain": "cordon {node} and stop its shards; the control plane places them on other nodes",
    "cordon": "place nothing new on {node}; what runs there keeps running",
    "uncordon": "let the control plane place replicas on {node} again",
}
#: What the node page says after a verb succeeded, by the ``done=`` token the redirect carries.
DONE = {
    "drain": "drain: done; its shards were stopped, and the control plane places them on other nodes",
    "cordon": "cordon: done; nothing new is placed here until it is uncordoned",
    "uncordon": "uncordon: done; the control plane may place replicas here again",
}
STATE_CLASS = {NodeState.READY: "ok", ReplicaState.READY: "ok", ShardState.READY: "ok",
               ReplicaState.FAILED: "bad", ShardState.FAILED: "bad", NodeState.LOST: "bad",
               ReplicaState.SLEEPING: "sleeping"}


def link(base: str, page: str, text, **query) -> Tag:
    return tags.a(text, href=url(base, page, **query))


def url(base: str, page: str, **query) -> str:
    q = urlencode({k: v for k, v in query.items() if v is not None})
    return f"{base}/{page}" + (f"?{q}" if q else "")


def text(value) -> str:
    return DASH if value is None or value == "" else str(value)


def state_cell(state, extra: str = "") -> Tag:
    return tags.td(tags.span(text(state) + extra, class_="state " + STATE_CLASS.get(state, "")), **{"data-label": "state"})


def cell(label: str, value) -> Tag:
    return tags.td(value if isinstance(value, Tag) else text(value), **{"data-label": label})


def table(header: Iterable[str], rows: list[Tag], empty: str, class_: str = "") -> Tag:
    if not rows:
        return tags.p(empty, class_="empty")
    return tags.table(tags.thead(tags.tr([tags.th(h) for h in header])), tags.tbody(rows), class_="rows " + class_)


def page(base: str, title: str, operator, body: list, scripts: bool = False) -> Tag:
    who = []
    if operator is not None:
        who.append(tags.span(("local: " if operator.local else "operator: ") + operator.name, class_="who"))
        if not operator.local and operator.csrf is not None:
            who.append(tags.form(tags.input(type="hidden", name="csrf", value=operator.csrf),
                                 tags.button("log out", type="submit"), method="post", action=f"{base}/logout",
                                 class_="inline"))
    head = tags.head(
        tags.meta(charset="utf-8"),
        tags.meta(name="viewport", content="width=device-width, initial-scale=1"),
        tags.title(f"{title} · llmgw admin"),
        tags.link(rel="stylesheet", href=f"{base}/static/admin.css"),
        tags.link(rel="icon", href=f"{base}/static/favicon.svg", type="image/svg+xml"),
        tags.script(src=f"{base}/static/admin.js", defer="defer") if scripts else "",
    )
    nav = tags.header(tags.nav(tags.a("llmgw", href=f"{base}/", class_="brand"), " ", tags.a("cluster", href=f"{base}/"),
                               " ", tags.a("metrics", href="/metrics") if not base else ""), who)
    return shown(tags.html(head, tags.body(nav, Tag("main")(tags.h1(title), body)), lang="en"))


def shown(node):
    """*node* with every text in it escaped as ``printable`` escapes it (newlines kept); attributes are the flattener's."""
    if isinstance(node, str):
        return printable(node, keep="\n")
    if isinstance(node, Tag):
        node.children[:] = [shown(child) for child in node.children]
    elif isinstance(node, (list, tuple)):
        return [shown(child) for child in node]
    return node


def warnings_list(items: list[Tag]) -> Tag | str:
    if not items:
        return ""
    return tags.section(tags.h2("Warnings"), tags.ul([tags.li(i) for i in items]), class_="warnings")


def progress_bar(key: str, progress: Progress | None, words: str | None) -> Tag:
    """A bar that says how far a download has come; one without a value (no length sent) still moves."""
    attrs_ = {"data-progress": key}
    if progress is not None and progress.bytes_total:
        attrs_.update(value=str(progress.bytes_done), max=str(progress.bytes_total))
    return tags.span(tags.progress(**attrs_), " ", tags.span(text(words), **{"data-progress-words": key}), class_="bar")


#: Also progress.json's words, which the page's script sets as they come: escaped by ``said``, not by page().
download_words = render.download_words


def in_progress(replica: ReplicaView) -> bool:
    return replica.state in (ReplicaState.FETCHING, ReplicaState.STARTING) and replica.progress is not None \
        or replica.state == ReplicaState.FETCHING


def installing(node: NodeView) -> list:
    return [e for e in node.engines or () if e.state == EngineState.INSTALLING]


def engine_key(node: NodeView, engine) -> str:
    return f"engine:{node.id}:{engine.name}:{engine.version}"


# -- the cluster --


def node_warnings(base: str, nodes: list[NodeView], now: float) -> list[Tag]:
    out = []
    for n in nodes:
        name = link(base, "node", n.id, id=n.id)
        notes = [*(n.warnings or []), *(n.link_warnings or [])]
        if n.cpu is not None and n.cpu.avx2 is False:
            notes.append("its CPU has no AVX2: llama.cpp's release builds do not run there")
        expiry = render.certificate_note(n, now)
        if expiry:
            notes.append(expiry)
        notes += [line for line in render.engine_notes(n) if "installing" not in line]
        if n.cordoned:
            notes.append("cordoned: nothing new is placed here until it is uncordoned")
        if n.state not in (NodeState.READY, None) or n.reason and n.state != NodeState.READY:
            notes.append(f"{text(n.state)}: {n.reason}" if n.reason else text(n.state))
        out += [tags.span(name, ": ", note) for note in notes]
    return out


def replica_warnings(base: str, replicas: list[ReplicaView]) -> list[Tag]:
    return [tags.span(link(base, "replica", r.replica, id=r.replica), ": ", f"{r.state}: {text(r.reason)}")
            for r in replicas if r.state == ReplicaState.FAILED]


def node_row(base: str, n: NodeView) -> Tag:
    cpu = render.cpu(n)
    engines = [tags.span(render.engine_cell(e), " ", progress_bar(engine_key(n, e), None, "installing")
                         if e.state == EngineState.INSTALLING else "", class_="engine")
               for e in render.listed_engines(n)]
    return tags.tr(
        cell("node", link(base, "node", n.id, id=n.id)),
        state_cell(n.state, ", cordoned" if n.cordoned else ""),
        cell("address", n.address),
        tags.td(cpu, class_="bad" if n.cpu is not None and n.cpu.avx2 is False else "", **{"data-label": "cpu"}),
        cell("memory", render.memory(n)),
        cell("gpus", gpu_words(n)),
        cell("disk", render.disk(n)),
        cell("engines", tags.span(engines) if engines else render.engines(n)),
        cell("last seen", render.ago(n.seen_ago_s)),
    )


def gpu_words(n: NodeView) -> str:
    words = render.gpus(n)
    utils = [g.utilization_pct for g in n.gpus or ()]
    if any(u is not None for u in utils):
        words += "; busy " + ", ".join(DASH if u is None else f"{u}%" for u in utils)
    return words


def replica_row(base: str, r: ReplicaView) -> Tag:
    stale = {True: "stale", False: "no", None: DASH}[r.stale]
    nodes = [link(base, "node", n, id=n) for n in r.nodes]
    reason = [text(r.reason)]
    if in_progress(r):
        reason = [progress_bar(f"replica:{r.replica}", r.progress, download_words(r.progress) or r.reason)]
    return tags.tr(
        cell("replica", link(base, "replica", r.replica, id=r.replica)),
        cell("model", r.model),
        state_cell(r.state),
        cell("nodes", tags.span(_join(nodes)) if nodes else DASH),
        cell("endpoint", r.endpoint),
        cell("age", render.age(r.age_s)),
        cell("stale", stale),
        cell("reason", tags.span(reason)),
    )


def _join(items: list) -> list:
    out = []
    for i, item in enumerate(items):
        out += [", "] if i else []
        out.append(item)
    return out


def clipped(items: list, limit: int, noun: str) -> tuple[list, Tag | str]:
    if len(items) <= limit:
        return items, ""
    return items[:limit], tags.p(f"and {len(items) - limit} more {noun} (admin.max_rows is {limit})", class_="empty")


def cluster(base: str, operator, nodes: list[NodeView], replicas: list[ReplicaView], max_rows: int,
            now: float | None = None, history: list = (), servers: list = ()) -> Tag:
    """The fleet; *servers* (``llmgw.admin.servers``) over it, *history* (events, figures) under it."""
    now = time.time() if now is None else now
    warnings = node_warnings(base, nodes, now) + replica_warnings(base, replicas)
    warnings, more_warnings = clipped(warnings, max_rows, "warnings")
    shown_nodes, more_nodes = clipped(nodes, max_rows, "nodes")
    shown_replicas, more_replicas = clipped(replicas, max_rows, "replicas")
    counts = {}
    for n in nodes:
        counts[text(n.state)] = counts.get(text(n.state), 0) + 1
    summary = ", ".join(f"{c} {s}" for s, c in sorted(counts.items())) or "none"
    body = [
        *servers, warnings_list(warnings), more_warnings,
        tags.section(tags.h2(f"Nodes ({summary})"),
                     table(("node", "state", "address", "cpu", "memory", "gpus", "disk", "engines", "last seen"),
                           [node_row(base, n) for n in shown_nodes], "no nodes have registered yet"), more_nodes),
        tags.section(tags.h2(f"Replicas ({len(replicas)})"),
                     table(("replica", "model", "state", "nodes", "endpoint", "age", "stale", "reason"),
                           [replica_row(base, r) for r in shown_replicas], "the catalog asks for no replicas"),
                     more_replicas),
        *history,
    ]
    return page(base, "Cluster", operator, body, scripts=True)


# -- a node --


def facts(rows: list[tuple[str, object]]) -> Tag:
    return tags.table(tags.tbody([tags.tr(tags.th(k), tags.td(v if isinstance(v, Tag) else text(v))) for k, v in rows]),
                      class_="facts")


def when(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def node_page(base: str, operator, node: NodeView, replicas: list[ReplicaView], logs, notice: str | None,
              max_rows: int, now: float | None = None, history: list = ()) -> Tag:
    now = time.time() if now is None else now
    c = node.cpu
    rows = [
        ("state", tags.span(text(node.state) + (", cordoned" if node.cordoned else ""),
                            class_="state " + STATE_CLASS.get(node.state, ""))),
        ("reason", node.reason),
        ("last seen", render.ago(node.seen_ago_s)),
        ("registered", when(node.registered_at)),
        ("address", node.address), ("hostname", node.hostname), ("os", node.os), ("kernel", node.kernel),
        ("arch", node.arch), ("agent", node.agent_version), ("protocol", node.protocol),
        ("cpu", render.cpu(node)),
        ("avx2", DASH if c is None or c.avx2 is None else ("yes" if c.avx2 else "NO")),
        ("vector flags", DASH if c is None or c.vector_flags is None else " ".join(c.vector_flags) or "none"),
        ("memory", render.memory(node)),
        ("nvidia driver", node.nvidia_driver),
        ("certificate expires", when(node.certificate_not_after)),
        ("weights held", DASH if node.weights is None else f"{len(node.weights.files)} file(s), "
         f"{render.size(sum(f.size_bytes or 0 for f in node.weights.files))}"),
    ]
    gpus = table(("gpu", "name", "uuid", "memory used", "memory total", "busy"), [
        tags.tr(cell("gpu", g.index), cell("name", g.name), cell("uuid", g.uuid), cell("memory used", render.size(g.memory_used_bytes)),
                cell("memory total", render.size(g.memory_total_bytes)),
                cell("busy", None if g.utilization_pct is None else f"{g.utilization_pct}%"))
        for g in (node.gpus or [])[:max_rows]], "none" if node.gpus is not None else DASH)
    disks = table(("mount", "type", "shared", "free", "total", "weights dirs"), [
        tags.tr(cell("mount", f.mountpoint), cell("type", f.fstype),
                cell("shared", DASH if f.shared is None else ("yes" if f.shared else "no")),
                cell("free", render.size(f.free_bytes)), cell("total", render.size(f.total_bytes)),
                cell("weights dirs", ", ".join(f.weights_dirs) or DASH))
        for f in (node.filesystems or [])[:max_rows]], "none" if node.filesystems is not None else DASH)
    engines = table(("engine", "version", "state", "reason"), [
        tags.tr(cell("engine", e.name), cell("version", e.version),
                cell("state", tags.span(text(e.state), " ", progress_bar(engine_key(node, e), None, "installing"))
                     if e.state == EngineState.INSTALLING else e.state), cell("reason", e.reason))
        for e in (node.engines or [])[:max_rows]], "none" if node.engines is not None else DASH)
    ib = table(("adapter", "fabric", "firmware", "ports"), [
        tags.tr(cell("adapter", a.name), cell("fabric", a.fabric), cell("firmware", a.fw_version),
                cell("ports", "; ".join(f"{p.port} {text(p.state)} {text(p.rate_gbps)} Gb/s" for p in a.ports) or DASH))
        for a in (node.infiniband or [])[:max_rows]], "none" if node.infiniband is not None else DASH)
    labels = table(("label", "value"), [tags.tr(cell("label", k), cell("value", v))
                                        for k, v in sorted(node.labels.items())[:max_rows]], "none")
    mine = [r for r in replicas if node.id in r.nodes or any(s.node == node.id for s in r.shards)]
    warnings = node_warnings(base, [node], now)
    body = [
        tags.p(notice, class_="notice") if notice else "",
        warnings_list(warnings),
        tags.section(tags.h2("Actions"), tags.p(
            [tags.a(verb, href=url(base, "confirm", node=node.id, action=verb), class_="button")
             for verb in VERBS if verb != ("cordon" if node.cordoned else "uncordon")],
            class_="actions")),
        # What the node is, then what runs on it, then its log: a log is as long as it likes.
        tags.section(tags.h2("Reported"), facts(rows)),
        tags.section(tags.h2("GPUs"), gpus),
        tags.section(tags.h2("Filesystems"), disks),
        tags.section(tags.h2("Engines"), engines),
        tags.section(tags.h2("InfiniBand"), ib),
        tags.section(tags.h2("Labels"), labels),
        tags.section(tags.h2("Replicas"), table(
            ("replica", "model", "state", "nodes", "endpoint", "age", "stale", "reason"),
            [replica_row(base, r) for r in mine[:max_rows]], "none here")),
        *history,
        logs,
    ]
    return page(base, f"Node {node.id}", operator, body, scripts=True)


def logs_section(base: str, node_id: str, source: str | None, answer: LogsAnswer | None, error: str | None,
                 follow: bool, n: int, page_name: str = "node", page_id: str | None = None) -> Tag:
    """The log of *source* on *node_id*: the sources the node listed, the lines, and follow mode."""
    page_id = page_id if page_id is not None else node_id
    sources = answer.sources if answer is not None else []
    shown = (answer.source if answer is not None else None) or source
    picks = [tags.a(s, href=url(base, page_name, id=page_id, source=s, n=n), class_="button current" if s == shown else "button")
             for s in sources]
    lines = render.log_lines(answer.lines if answer is not None else [])
    attrs_ = {}
    if follow:
        attrs_["data-follow"] = url(base, "logs.json", node=node_id, source=shown, n=n)
    toggle = link(base, page_name, "stop following", id=page_id, source=shown, n=n) if follow else \
        link(base, page_name, "follow (refreshes every 5 s)", id=page_id, source=shown, n=n, follow=1)
    return tags.section(
        tags.h2(f"Log: {text(shown)}"),
        tags.p(picks, class_="sources") if len(picks) > 1 else "",
        tags.p(toggle, " ", tags.span("", class_="follow-state", **{"data-follow-state": ""}),
               tags.noscript(" (following needs JavaScript; reload the page instead)") if follow else ""),
        tags.p(error, class_="bad") if error else "",
        tags.pre("\n".join(lines) if lines else ("" if error else "(no lines)"), class_="log", **attrs_),
    )


# -- a replica --


def replica_page(base: str, operator, replica: ReplicaView, logs, max_rows: int, history: list = ()) -> Tag:
    r = replica
    rows = [
        ("model", r.model), ("state", tags.span(text(r.state), class_="state " + STATE_CLASS.get(r.state, ""))),
        ("reason", r.reason),
        ("nodes", tags.span(_join([link(base, "node", n, id=n) for n in r.nodes])) if r.nodes else DASH),
        ("endpoint", r.endpoint), ("age", render.age(r.age_s)),
        ("stale", {True: "yes: it runs an older configuration", False: "no", None: DASH}[r.stale]),
        ("fingerprint", r.fingerprint),
    ]
    if in_progress(r):
        rows.append(("download", progress_bar(f"replica:{r.replica}", r.progress, download_words(r.progress) or r.reason)))
    shards = table(("rank", "shard", "node", "state", "pid", "endpoint", "age", "reason"), [
        tags.tr(cell("rank", s.rank), cell("shard", s.shard),
                cell("node", link(base, "node", s.node, id=s.node) if s.node else None),
                cell("state", "not started") if s.started is False else state_cell(s.state),
                cell("pid", s.pid), cell("endpoint", s.endpoint), cell("age", render.age(s.age_s)),
                cell("reason", s.waiting or s.reason))
        for s in sorted(r.shards, key=lambda s: (s.rank is None, s.rank or 0))[:max_rows]], "no shards placed")
    tails = [tags.section(tags.h3(f"last lines of {s.shard} on {text(s.node)}"),
                          tags.pre("\n".join(render.log_lines(s.output_tail)), class_="log"))
             for s in r.shards if s.state == ShardState.FAILED and s.output_tail]
    leader = next((s for s in sorted(r.shards, key=lambda s: s.rank or 0) if s.node), None)
    waiting = render.not_started(r, leader.shard if leader else None)
    if waiting is not None:
        # Its node has no log for it yet; the download is above.
        logs = tags.section(tags.h2(f"Log: {text(leader.shard)}"), tags.p(waiting, class_="waiting"))
    body = [tags.section(tags.h2("Replica"), facts(rows)), tags.section(tags.h2("Ranks"), shards), tails, *history, logs]
    return page(base, f"Replica {r.replica}", operator, body, scripts=True)


# -- forms --


def confirm_page(base: str, operator, node: NodeView, verb: str, replicas: list[ReplicaView], token: str) -> Tag:
    here = sorted({s.shard for r in replicas for s in r.shards if s.node == node.id})
    what = VERBS[verb].format(node=node.id)
    body = [
        tags.p(f"{verb.capitalize()} {node.id}: {what}."),
        tags.p(f"Shards on it now: {', '.join(here)}." if here and verb == "drain" else ""),
        tags.form(
            tags.input(type="hidden", name="csrf", value=token),
            tags.input(type="hidden", name="node", value=node.id),
            tags.input(type="hidden", name="action", value=verb),
            tags.button(f"{verb} {node.id}", type="submit", class_="danger" if verb == "drain" else ""),
            " ", link(base, "node", "cancel", id=node.id),
            method="post", action=f"{base}/action"),
    ]
    return page(base, f"{verb.capitalize()} {node.id}?", operator, body)


def login_page(base: str, token: str, error: str | None, why: str = "this address is not on admin.local") -> Tag:
    body = [
        tags.p(f"{why[:1].upper()}{why[1:]}: sign in with an operator key from admin.keys."),
        tags.p(error, class_="bad") if error else "",
        tags.form(
            tags.input(type="hidden", name="csrf", value=token),
            tags.label("operator key ", tags.input(type="password", name="key", autocomplete="current-password",
                                                   required="required", maxlength="512")),
            " ", tags.button("sign in", type="submit"),
            method="post", action=f"{base}/login"),
    ]
    return page(base, "Sign in", None, body)


def message_page(base: str, operator, title: str, words: str, back: str | None = None) -> Tag:
    return page(base, title, operator, [tags.p(words), tags.p(tags.a("back", href=back)) if back else ""])
