"""The control plane's journal (``llmgw.history.JournalPage``) as the admin page's events tables.

The cluster page shows the newest events of the whole fleet; a node's page
and a replica's show their own.  Newest first, as an operator reads back
from "now".  A reason is the node's or placement's words: it goes into the
tree as a string, which ``pages.page`` escapes (``llmgw.text.printable``)
and the flattener quotes, like every word a node sends.
"""

from __future__ import annotations

import time

from twisted.web.template import Tag, tags

from llmgw.history import JournalEntry, JournalKind, JournalPage
from llmgw.render import DASH

#: Kinds drawn in the page's "bad" colour: something stopped that was not asked to.
BAD = frozenset({JournalKind.NODE_LOST, JournalKind.NODE_UNREACHABLE, JournalKind.ENGINE_BROKEN,
                 JournalKind.UNPLACEABLE, JournalKind.EXITED, JournalKind.FAILED})
#: Kinds drawn as good news.
GOOD = frozenset({JournalKind.READY, JournalKind.NODE_BACK, JournalKind.NODE_REGISTERED, JournalKind.ENGINE_INSTALLED})
#: Kinds of the elastic replicas: sleeping, waking, making room.
ELASTIC = frozenset({JournalKind.COLD_START, JournalKind.SCALED_UP, JournalKind.SCALED_DOWN, JournalKind.SLEPT,
                     JournalKind.EVICTED})


def kind_class(kind: JournalKind) -> str:
    if kind in BAD:
        return "bad"
    if kind in GOOD:
        return "ok"
    if kind in ELASTIC:
        return "sleeping"
    return ""


def stamp(at: float, now: float) -> str:
    """``03:12:07`` today (UTC), else ``2026-12-05 03:12``: what the operator's question names."""
    day = time.strftime("%Y-%m-%d", time.gmtime(at))
    if day == time.strftime("%Y-%m-%d", time.gmtime(now)):
        return time.strftime("%H:%M:%S", time.gmtime(at))
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(at))


def mine(page: JournalPage, node: str | None = None, model: str | None = None,
         replica: str | None = None) -> list[JournalEntry]:
    """The entries about *node* (or *model*, or *replica*): named as the subject or in its own field."""
    out = []
    for e in page.entries:
        if node is not None and node not in (e.node, e.subject):
            continue
        if model is not None and model not in (e.model, e.subject):
            continue
        if replica is not None and replica not in (e.replica, e.subject):
            continue
        out.append(e)
    return out


def subject_cell(base: str, entry: JournalEntry, link) -> Tag:
    """The subject, a link where it is a node or a replica the page has (never a node's href: the page's own)."""
    if entry.replica and entry.subject == entry.replica:
        value = link(base, "replica", entry.subject, id=entry.subject)
    elif entry.node and entry.subject == entry.node:
        value = link(base, "node", entry.subject, id=entry.subject)
    else:
        value = entry.subject
    return tags.td(value, **{"data-label": "subject"})


def event_row(base: str, entry: JournalEntry, now: float, link) -> Tag:
    where = entry.node if entry.node and entry.node != entry.subject else None
    return tags.tr(
        tags.td(tags.time(stamp(entry.at, now), datetime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.at))),
                **{"data-label": "when"}),
        tags.td(tags.span(str(entry.kind), class_="kind " + kind_class(entry.kind)), **{"data-label": "what"}),
        subject_cell(base, entry, link),
        tags.td(link(base, "node", where, id=where) if where else DASH, **{"data-label": "node"}),
        tags.td(entry.reason or DASH, class_="reason", **{"data-label": "why"}),
        **{"data-seq": str(entry.seq), "data-kind": str(entry.kind)},
    )


def events_section(base: str, page: JournalPage | None, error: str | None, entries: list[JournalEntry], limit: int,
                   link, now: float | None = None, heading: str = "Events", empty: str = "nothing recorded yet") -> Tag:
    """The newest *limit* of *entries*, newest first; says how many older ones it left out, and what the
    journal's bounds let go of."""
    now = time.time() if now is None else now
    if error:
        return tags.section(tags.h2(heading), tags.p(f"the events could not be read: {error}", class_="bad"),
                            id="events")
    newest = list(reversed(entries))[:limit]
    rows = [event_row(base, e, now, link) for e in newest]
    notes = []
    if len(entries) > limit:
        notes.append(f"{len(entries) - limit} older not shown; llmgw ctl events lists them all")
    if page is not None and page.dropped:
        notes.append(f"the journal has let go of {page.dropped} older events (its bounds)")
    body = tags.table(tags.thead(tags.tr([tags.th(h) for h in ("when (UTC)", "what", "subject", "node", "why")])),
                      tags.tbody(rows), class_="rows events") if rows else tags.p(empty, class_="empty")
    return tags.section(tags.h2(heading), body, [tags.p(n, class_="empty") for n in notes], id="events")
