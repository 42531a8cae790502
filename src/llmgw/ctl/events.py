"""`llmgw ctl events`: what happened in the fleet, from the control plane's journal, oldest first.

``--node``, ``--model`` and ``--since`` ask the server for the entries about
one node, one model, or the last while.  ``-f`` subscribes to
``llmgw.event.journal`` first, then reads the page, so nothing recorded in
between is missed; an entry both bring is printed once (by ``seq``).
``--json`` prints a JSON list of entries, or with ``-f`` one JSON object a
line.  Every word a node sent is escaped (``llmgw.text.printable``).
"""

from __future__ import annotations

import json
import re
import sys
import time

from llmgw.errors import LlmgwError
from llmgw.history import PAGE_MOST, JournalEntry, JournalPage
from llmgw.link import uris
from llmgw.render import said
from llmgw.text import printable
from llmgw.wire import WireError, from_wire, to_wire

#: Entries one call asks for unless --limit says otherwise.
LIMIT = 1000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def add_parser(sub, run) -> None:
    events = sub.add_parser("events", help="what happened: nodes, replicas, engines and reloads, with the reasons")
    events.add_argument("--node", metavar="NODE", help="only entries about this node")
    events.add_argument("--model", metavar="MODEL", help="only entries about this model")
    events.add_argument("--since", metavar="AGE", help="only the last AGE: 90s, 30m, 2h, 1d")
    events.add_argument("--limit", type=int, default=LIMIT,
                        help=f"the newest this many entries (default {LIMIT}, at most {PAGE_MOST})")
    events.add_argument("-f", "--follow", action="store_true", help="keep printing new entries (Ctrl-C stops)")
    events.add_argument("--json", action="store_true", help="print a JSON list of entries (with -f: one a line)")
    events.set_defaults(func=run(cmd_events))


def seconds(text: str) -> float:
    """``--since``'s age in seconds: a number with s, m, h or d after it (s when none)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise LlmgwError(f"--since {printable(text)!r} is not an age; write it like 90s, 30m, 2h or 1d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def line(entry: JournalEntry) -> str:
    """One entry as one line: local time, kind, subject (and its node), and the reason in the node's words."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.at))
    where = f" on {said(entry.node)}" if entry.node is not None and entry.node != entry.subject else ""
    reason = f": {said(entry.reason)}" if entry.reason else ""
    return f"{when}  {said(entry.kind)}  {said(entry.subject)}{where}{reason}"


def _decode(kind, payload):
    try:
        return from_wire(kind, payload)
    except WireError as e:
        raise LlmgwError(f"{uris.CP_EVENTS} answered something this ctl cannot read ({printable(str(e))}); is the "
                         "server a much older or newer llmgw?") from None


def _show(entries: list[JournalEntry], as_json: bool, follow: bool) -> None:
    if as_json and not follow:
        json.dump(to_wire(entries), sys.stdout, indent=2)
        print()
        return
    for entry in entries:
        print(json.dumps(to_wire(entry)) if as_json else line(entry), flush=True)


async def cmd_events(session, args) -> int:
    if not 1 <= args.limit <= PAGE_MOST:
        raise LlmgwError(f"--limit {args.limit}: give 1 to {PAGE_MOST}")
    query = {"limit": args.limit}
    for key, value in (("node", args.node), ("model", args.model)):
        if value is not None:
            query[key] = value
    if args.since is not None:
        query["since"] = seconds(args.since)
    if not args.follow:
        page = _decode(JournalPage, await session.call(uris.CP_EVENTS, **query))
        if not page.entries and not args.json:
            print("no events" + (" match" if len(query) > 1 else " yet"), file=sys.stderr)
        _show(page.entries, args.json, follow=False)
        return 0
    return await _follow(session, args, query)


async def _follow(session, args, query: dict) -> int:
    """Subscribe, then read the page; print each entry once, in seq order, as it comes."""
    from twisted.internet import defer

    waiting: list[JournalEntry] = []
    last = {"seq": None}

    def matches(entry: JournalEntry) -> bool:
        return (args.node is None or entry.node == args.node) and (args.model is None or entry.model == args.model)

    def heard(payload) -> None:
        try:
            entry = from_wire(JournalEntry, payload)
        except (WireError, ValueError):
            return  # a newer server's kind: shown by a newer ctl
        if not matches(entry):
            return
        if last["seq"] is None:
            waiting.append(entry)
        elif entry.seq > last["seq"]:
            last["seq"] = entry.seq
            _show([entry], args.json, follow=True)

    await session.subscribe(heard, uris.EVENT_JOURNAL)
    page = _decode(JournalPage, await session.call(uris.CP_EVENTS, **query))
    _show(page.entries, args.json, follow=True)
    seen = page.entries[-1].seq if page.entries else page.newest_seq
    fresh = sorted((e for e in waiting if e.seq > seen), key=lambda e: e.seq)
    _show(fresh, args.json, follow=True)
    last["seq"] = max([seen, *(e.seq for e in fresh)])
    waiting.clear()
    await defer.Deferred()  # until Ctrl-C
    return 0
