"""What ``llmgw.cp.nodes`` costs at N nodes, part by part, in one process: no sockets, no other load.

    python bench/listing.py [--nodes 10000] [--page 1000] [--repeat 5]

A ``Fleet`` holds N nodes registered with the recorded inventories
bench/fleet.py's agents send (``inventory_payload``, ``MACHINES``).  Each
figure is this process's CPU time in milliseconds, the best of --repeat:

- each query form's answer as the control plane makes it, the JSON text
  the hub sends (``json_listing``), quiet (no heartbeat since the last
  listing) and live (every node heartbeated, its GPU figures moved, before
  each listing);
- the whole list's pages as the hub's serializer writes them (the text put
  in its RESULT as it is), and for comparison as autobahn's serializer
  wrote the same wire form, made anew, before the text was kept;
- the pages read by ctl's and the dashboard's JSON, and decoded into views
  as ctl does (``from_wire``).

bench/fleet.py measures the same call end to end through a real hub, on a
machine shared with its agents; this says where that time goes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import txaio  # noqa: E402

txaio.use_twisted()  # before autobahn's serializer binds txaio's time_ns

from autobahn.wamp import message  # noqa: E402
from autobahn.wamp.serializer import JsonObjectSerializer  # noqa: E402
from twisted.internet.task import Clock  # noqa: E402

from fleet import MACHINES, inventory_payload, node_name  # noqa: E402
from llmgw.control.fleet import Fleet  # noqa: E402
from llmgw.control.nodelisting import NodeQuery  # noqa: E402
from llmgw.ctl.main import fewer_collections  # noqa: E402
from llmgw.link.session import LinkJsonSerializer  # noqa: E402
from llmgw.records import Heartbeat, Inventory  # noqa: E402
from llmgw.states import NodeState  # noqa: E402
from llmgw.views import NodeBrief, NodeView  # noqa: E402
from llmgw.wire import from_wire  # noqa: E402


def fleet_of(n: int) -> tuple[Fleet, Clock, dict]:
    clock = Clock()
    clock.advance(1_000)
    fleet = Fleet(clock, lambda *event: None)
    beats = {}
    for i in range(n):
        payload = inventory_payload(MACHINES[i % len(MACHINES)], node_name("sim", i))
        fleet.register(payload["node_id"], i, from_wire(Inventory, payload))
        beats[payload["node_id"]] = (i, {k: payload.get(k) for k in ("memory_available_bytes", "gpus")})
    return fleet, clock, beats


def heartbeat_all(fleet: Fleet, beats: dict, round_: int) -> None:
    for node_id, (session, beat) in beats.items():
        gpus = [dict(g, utilization_pct=round_ % 100) for g in beat["gpus"] or []] or None
        free = beat["memory_available_bytes"]
        fleet.heartbeat(node_id, session, from_wire(Heartbeat, {
            "gpus": gpus, "memory_available_bytes": None if free is None else free - round_}))


def best(repeat: int, work, before=None) -> tuple[float, object]:
    times, out = [], None
    for r in range(repeat):
        if before is not None:
            before(r)
        gc.collect()
        start = time.process_time()
        out = work()
        times.append(time.process_time() - start)
    return min(times) * 1000, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--page", type=int, default=1000, help="nodes per page of the whole list (default 1000)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    fleet, clock, beats = fleet_of(args.nodes)

    ids = sorted(fleet.nodes)
    cursors = [None, *ids[args.page - 1::args.page]]  # each page starts after the last id of the one before

    def pages(brief: bool = False):
        return [fleet.json_listing(NodeQuery(after=after, limit=args.page), brief=brief) for after in cursors]

    forms = [
        (f"whole list, pages of {args.page}", pages),
        (f"whole list as briefs (ctl nodes), pages of {args.page}", lambda: pages(brief=True)),
        ("--label gpu=h100 --limit 1000", lambda: fleet.json_listing(NodeQuery.parse(label="gpu=h100", limit=1000))),
        ("--label gpu=b200 (none have it)", lambda: fleet.json_listing(NodeQuery.parse(label="gpu=b200"))),
        ("--limit 50", lambda: fleet.json_listing(NodeQuery.parse(limit=50))),
        ("--state unreachable (none are)", lambda: fleet.json_listing(NodeQuery(state=NodeState.UNREACHABLE))),
    ]
    print(f"{args.nodes} nodes of {', '.join(MACHINES)} in turn; CPU ms, best of {args.repeat}")
    rows = []
    pages()  # the first listing converts every inventory; later ones only what changed
    for name, work in forms:
        quiet, answer = best(args.repeat, work)
        live, _ = best(args.repeat, work, before=lambda r: (heartbeat_all(fleet, beats, r), clock.advance(1)))
        count = sum(len(p.value()) for p in answer) if name.startswith("whole") else len(answer.value())
        rows.append((f"cp.nodes {name}", quiet, live, f"{count} nodes"))
    hub, link = LinkJsonSerializer(), JsonObjectSerializer()
    answer = pages()
    sent, wire = best(args.repeat, lambda: [hub.serialize(message.Result(7, args=[page]))[0] for page in answer])
    size = sum(len(t) for t in wire)
    rows.append(("  the hub's RESULT messages of those pages", sent, None, f"{size / 1e6:.1f} MB: the text put in"))
    answer = [page.value() for page in answer]
    made, text = best(args.repeat, lambda: [link.serialize(page) for page in answer])
    rows.append(("  ... autobahn writing the same wire form", made, None, "what the hub did before the text was kept"))
    read, _ = best(args.repeat, lambda: [link.unserialize(t) for t in text])
    rows.append(("  ... read by autobahn's own JSON", read, None, "its pure-Python scanner"))
    ours = LinkJsonSerializer()._serializer
    read, _ = best(args.repeat, lambda: [ours.unserialize(t) for t in text])
    rows.append(("  ctl's and the dashboard's JSON read", read, None, "the link's (LinkJsonSerializer: the C scanner)"))
    fewer_collections()
    decoded, _ = best(args.repeat, lambda: [from_wire(list[NodeView], page) for page in answer])
    rows.append(("  decoded into views (from_wire)", decoded, None, "as ctl and llmgw-tui collect"))
    brief_pages = pages(brief=True)
    sent, wire = best(args.repeat, lambda: [hub.serialize(message.Result(7, args=[page]))[0] for page in brief_pages])
    size = sum(len(t) for t in wire)
    rows.append(("  the hub's RESULT messages of the briefs", sent, None, f"{size / 1e6:.1f} MB"))
    read, _ = best(args.repeat, lambda: [ours.unserialize(t) for t in wire])
    rows.append(("  ctl's JSON read of the briefs", read, None, ""))
    brief_pages = [page.value() for page in brief_pages]
    decoded, _ = best(args.repeat, lambda: [from_wire(list[NodeBrief], page) for page in brief_pages])
    rows.append(("  decoded into briefs (from_wire)", decoded, None, "as ctl nodes does"))
    width = max(len(r[0]) for r in rows)
    print(f"{'':<{width}}  {'quiet ms':>9}  {'live ms':>8}")
    for name, quiet, live, note in rows:
        print(f"{name:<{width}}  {quiet:9.1f}  {'' if live is None else f'{live:8.1f}':>8}  {note}")


if __name__ == "__main__":
    main()
