"""How the dashboard copes with a big fleet: 1,000 nodes and 2,000 replicas, simulated.

    python bench/tui.py [--nodes 1000] [--replicas 2000] [--size 200x50] [--repeat 50]

The app runs headless on a FakeBackend.  Each figure is the median (and the
worst) of --repeat runs, in milliseconds:

- decode a snapshot: the node list's wire form (as ``llmgw.cp.nodes`` pages
  send it) read back into views, which WampBackend does before the app
  sees it; a snapshot at ten thousand nodes is this plus the first snapshot;
- first snapshot: both tables filled from empty (the first connect);
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

Numbers are for comparison between versions on one machine, not budgets; the
design aims to keep a state change well under a millisecond to apply, and
the heartbeat pass — the one heavy thing, every 2 s — under the 100 ms flush
interval.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llmgw.states import ReplicaState  # noqa: E402
from llmgw.views import NodeView  # noqa: E402
from llmgw.wire import from_wire, to_wire  # noqa: E402
from llmgw.tui.app import DashboardApp  # noqa: E402
from llmgw.tui.fake import FakeBackend, simulated_fleet  # noqa: E402
from llmgw.tui.nodes import NodesPane  # noqa: E402
from llmgw.tui.replicas import ReplicasPane  # noqa: E402


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
    start = time.perf_counter()
    app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    return time.perf_counter() - start


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
        for i in range(max(3, repeat // 10)):
            start = time.perf_counter()
            from_wire(list[NodeView], wire)
            t.add(f"decode a snapshot ({n_nodes} nodes' wire form)", time.perf_counter() - start)
            pane.table.replace({})
            replicas_pane.table.replace({})
            await pilot.pause()
            start = time.perf_counter()
            app.store.load(*(await fake.snapshot()))
            for view in app.fleet_views():
                view.fleet_loaded(app.store)
            t.add("first snapshot, into empty tables", time.perf_counter() - start)
            t.add("  render after the first snapshot", render(app))
            await pilot.pause()
            fake.nodes = {node_id: attrs.evolve(node, memory_available_bytes=(i + 3) * 10**9)
                          for node_id, node in fake.nodes.items()}
            start = time.perf_counter()
            app.store.load(*(await fake.snapshot()))
            for view in app.fleet_views():
                view.fleet_loaded(app.store)
            t.add("reconnect snapshot, every node changed", time.perf_counter() - start)
            t.add("  render after the reconnect snapshot", render(app))
            await pilot.pause()

        for i in range(repeat):
            node = app.store.nodes[nodes[i % n_nodes].id]
            fake.emit_node(attrs.evolve(node, cordoned=not node.cordoned))
            start = time.perf_counter()
            app.flush()
            t.add("apply 1 state change", time.perf_counter() - start)
            t.add("  render after the state change", render(app))
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            for node in nodes:
                fake.emit_node(attrs.evolve(app.store.nodes[node.id], memory_available_bytes=(i + 7) * 10**9,
                                            seen_ago_s=0.0))
            clock[0] += 3
            start = time.perf_counter()
            app._tick()
            t.add(f"heartbeat pass ({n_nodes} heartbeats, last seen)", time.perf_counter() - start)
            t.add("  render after the heartbeat pass", render(app))
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            changed = [attrs.evolve(r, state=ReplicaState.STARTING if (i + j) % 2 else ReplicaState.READY)
                       if j < 20 else r for j, r in enumerate(replicas)]
            start = time.perf_counter()
            app.store.set_replicas(changed)
            for view in app.fleet_views():
                view.replicas_changed(app.store)
            t.add(f"replicas refetch ({n_replicas}, 20 changed)", time.perf_counter() - start)
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            clock[0] += 7
            start = time.perf_counter()
            app._tick()
            t.add("last-seen tick alone (every node ages)", time.perf_counter() - start)
            await pilot.pause()

        for i in range(max(3, repeat // 10)):
            start = time.perf_counter()
            pane.table.set_filter("gpu00")
            t.add("filter keystroke (1000 -> ~100 rows)", time.perf_counter() - start)
            start = time.perf_counter()
            pane.table.set_filter("")
            t.add("clear filter (back to all rows)", time.perf_counter() - start)
            await pilot.pause()
    print(f"{n_nodes} nodes, {n_replicas} replicas, {size[0]}x{size[1]} terminal, Textual headless, Python "
          f"{sys.version.split()[0]}")
    t.report()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=2000)
    parser.add_argument("--size", default="200x50", help="terminal COLUMNSxROWS (default 200x50)")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    asyncio.run(bench(args.nodes, args.replicas, (width, height), args.repeat))


if __name__ == "__main__":
    main()
