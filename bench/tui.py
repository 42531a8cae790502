"""How the dashboard copes with a big fleet: 1,000 nodes and 2,000 replicas, simulated.

    python bench/tui.py [--nodes 1000] [--replicas 2000] [--size 200x50] [--repeat 50] [--cpu] [--default-gc]

The app runs headless on a FakeBackend.  Each figure is the median (and the
worst) of --repeat runs, in milliseconds:

- decode a snapshot: the node list's wire form (as ``llmgw.cp.nodes`` pages
  send it) read back into views, which WampBackend does before the app
  sees it;
- the link's JSON: those pages' text read by autobahn's JSON serializer,
  as the link does before the dashboard sees anything (not the dashboard's
  own work, and not in the snapshot's figure);
- first snapshot: both tables filled from empty (the first connect);
- until drawn: the first snapshot and the idle pass in which the tables
  measure their new rows, then the screen drawn; the snapshot's figure,
  the last line, is this plus the decode;
- 1 update applied: one node event decoded from its wire form, queued and
  applied to its row by the next flush;
- reconnect snapshot: every node's figures changed while away;
- apply 1 state change: one node cordoned, applied to its row by the next
  flush (store + update_cell);
- heartbeat pass: every node heartbeated once since the last pass; their
  figures applied and "last seen" aged, as the 2 s tick does;
- replicas refetch: 2,000 views reconciled, 20 of them changed;
- filter: one keystroke narrowing the nodes table;
- last-seen tick alone: the 2 s pass with no heartbeats queued;
- render: the whole screen drawn after each of the above (the compositor's
  full update), which is what a terminal is sent at most once per frame.

The process collects garbage as llmgw-tui's does (``fewer_collections``);
--default-gc keeps Python's thresholds, to see what that saves.  --cpu
counts this process's CPU time instead of the clock's, for a machine that
others are using.

Numbers are for comparison between versions on one machine, not budgets; the
design aims to keep a state change well under a millisecond to apply, and
the heartbeat pass — the one heavy thing, every 2 s — under the 100 ms flush
interval.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import attrs
from autobahn.wamp.serializer import JsonObjectSerializer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llmgw.ctl.main import fewer_collections  # noqa: E402
from llmgw.states import ReplicaState  # noqa: E402
from llmgw.views import NODES_PAGE, NodeChange, NodeEvent, NodeView  # noqa: E402
from llmgw.wire import from_wire, to_wire  # noqa: E402
from llmgw.tui.app import DashboardApp  # noqa: E402
from llmgw.tui.fake import FakeBackend, simulated_fleet  # noqa: E402
from llmgw.tui.nodes import NodesPane  # noqa: E402
from llmgw.tui.replicas import ReplicasPane  # noqa: E402


# What the figures count: wall-clock time, or with --cpu this process's CPU time (on a shared machine).
now = time.perf_counter


def ms(seconds: float) -> float:
    return seconds * 1000


class Timings:
    def __init__(self):
        self.figures: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self.figures.setdefault(name, []).append(ms(seconds))

    def report(self) -> None:
        width = max(len(n) for n in self.figures)
        print(f"{'':<{width}}  {'median ms':>10}  {'worst ms':>9}  runs")
        for name, values in self.figures.items():
            print(f"{name:<{width}}  {statistics.median(values):10.2f}  {max(values):9.2f}  {len(values)}")


def render(app) -> float:
    start = now()
    app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    return now() - start


async def bench(n_nodes: int, n_replicas: int, size: tuple[int, int], repeat: int) -> None:
    nodes, replicas = simulated_fleet(n_nodes, n_replicas)
    fake = FakeBackend(nodes, replicas)
    clock = [1000.0]
    # Timers far apart: the benchmark drives flushes and ticks itself.
    app = DashboardApp(fake, clock=lambda: clock[0], flush_s=3600, seen_tick_s=3600)
    t = Timings()
    async with app.run_test(size=size) as pilot:
        while not (app.store.loaded and app.link_problem is None):
            await pilot.pause(0.01)
        await pilot.pause(0.2)
        screen = app.screen
        pane = screen.query_one(NodesPane)

        replicas_pane = screen.query_one(ReplicasPane)
        wire = to_wire(list(fake.nodes.values()))
        link = JsonObjectSerializer()
        pages = [link.serialize(wire[i:i + NODES_PAGE]) for i in range(0, len(wire), NODES_PAGE)]
        snapshots = []
        for i in range(max(3, repeat // 10)):
            start = now()
            for page in pages:
                link.unserialize(page)
            t.add(f"the link's JSON of {len(pages)} pages (autobahn)", now() - start)
            start = now()
            from_wire(list[NodeView], wire)
            decoded = now() - start
            t.add(f"decode a snapshot ({n_nodes} nodes' wire form)", decoded)
            pane.table.replace({})
            replicas_pane.table.replace({})
            await pilot.pause()
            start = now()
            app.store.load(*(await fake.snapshot()))
            for view in app.fleet_views():
                view.fleet_loaded(app.store)
            t.add("first snapshot, into empty tables", now() - start)
            await pilot.pause()
            drawn = now() - start + render(app)
            t.add("  until drawn (rows measured, screen drawn)", drawn)
            snapshots.append(ms(decoded + drawn))
            await pilot.pause()
            fake.nodes = {node_id: attrs.evolve(node, memory_available_bytes=(i + 3) * 10**9)
                          for node_id, node in fake.nodes.items()}
            start = now()
            app.store.load(*(await fake.snapshot()))
            for view in app.fleet_views():
                view.fleet_loaded(app.store)
            t.add("reconnect snapshot, every node changed", now() - start)
            t.add("  render after the reconnect snapshot", render(app))
            await pilot.pause()

        for i in range(repeat):
            node = app.store.nodes[nodes[i % n_nodes].id]
            fake.emit_node(attrs.evolve(node, cordoned=not node.cordoned))
            start = now()
            app.flush()
            t.add("apply 1 state change", now() - start)
            t.add("  render after the state change", render(app))
            await pilot.pause()

        for i in range(repeat):
            node = app.store.nodes[nodes[i % n_nodes].id]
            event = to_wire(NodeEvent(NodeChange.CORDON, attrs.evolve(node, cordoned=not node.cordoned)))
            start = now()
            app.node_changed(from_wire(NodeEvent, event).node)
            app.flush()
            t.add("1 update applied (decoded, queued, flushed)", now() - start)
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            for node in nodes:
                fake.emit_node(attrs.evolve(app.store.nodes[node.id], memory_available_bytes=(i + 7) * 10**9,
                                            seen_ago_s=0.0))
            clock[0] += 3
            start = now()
            app._tick()
            t.add(f"heartbeat pass ({n_nodes} heartbeats, last seen)", now() - start)
            t.add("  render after the heartbeat pass", render(app))
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            changed = [attrs.evolve(r, state=ReplicaState.STARTING if (i + j) % 2 else ReplicaState.READY)
                       if j < 20 else r for j, r in enumerate(replicas)]
            start = now()
            app.store.set_replicas(changed)
            for view in app.fleet_views():
                view.replicas_changed(app.store)
            t.add(f"replicas refetch ({n_replicas}, 20 changed)", now() - start)
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            clock[0] += 7
            start = now()
            app._tick()
            t.add("last-seen tick alone (every node ages)", now() - start)
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            start = now()
            pane.table.set_filter("gpu00")
            t.add("filter keystroke (1000 -> ~100 rows)", now() - start)
            start = now()
            pane.table.set_filter("")
            t.add("clear filter (back to all rows)", now() - start)
            await pilot.pause()
    print(f"{n_nodes} nodes, {n_replicas} replicas, {size[0]}x{size[1]} terminal, Textual headless, Python "
          f"{sys.version.split()[0]}, {'CPU' if now is time.process_time else 'wall'} ms, collector thresholds "
          f"{gc.get_threshold()}, load {os.getloadavg()[0]:.1f}")
    t.report()
    print(f"snapshot at {n_nodes} nodes (decode + until drawn): median {statistics.median(snapshots):.0f} ms, "
          f"worst {max(snapshots):.0f} ms; the link's JSON is apart, above")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=2000)
    parser.add_argument("--size", default="200x50", help="terminal COLUMNSxROWS (default 200x50)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--cpu", action="store_true", help="count this process's CPU time, not the clock's")
    parser.add_argument("--default-gc", action="store_true", help="keep Python's collector thresholds")
    args = parser.parse_args()
    global now
    if args.cpu:
        now = time.process_time
    if not args.default_gc:
        fewer_collections()
    width, height = (int(v) for v in args.size.split("x"))
    asyncio.run(bench(args.nodes, args.replicas, (width, height), args.repeat))


if __name__ == "__main__":
    main()
