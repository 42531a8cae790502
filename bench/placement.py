"""How long one placement decision takes at fleet size, this tree against an earlier revision.

    .venv/bin/python bench/placement.py [--nodes 1000,5000,10000] [--models 500] [--against main]

For each N it runs bench/fleet.py's ``placement_ms`` (500 single-rank models,
llama.cpp and vLLM, one or two GPUs, placed one after another over N
snapshots of the recorded inventories, each placement applied) once with this
tree's ``src`` and once with ``--against``'s, taken with ``git archive`` into
a temporary directory.  Each run is its own process, the two interleaved, so
load on the machine falls on both alike; ``uptime``'s load is printed with
each N.  Also printed: the first decision on a fresh fleet, which is what
the reconciler's first launch of each kind of request costs every tick.

Not a test: it prints figures and asserts nothing.  ``--against ''`` skips
the earlier revision.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def measure(src: str, n: int, models: int) -> dict:
    """In this process: *src*'s llmgw, placement_ms at *n*, and one first decision on a fresh fleet."""
    sys.path.insert(0, str(BENCH))
    import fleet  # puts this tree's src first; *src* goes before it

    sys.path.insert(0, src)
    from llmgw.control.placement import NodeSnapshot, PlacementRequest, place
    from llmgw.records import Inventory
    from llmgw.wire import from_wire

    nodes = []
    for i in range(n):
        machine = fleet.MACHINES[i % len(fleet.MACHINES)]
        inv = from_wire(Inventory, fleet.inventory_payload(machine, fleet.node_name("sim", i)))
        nodes.append(NodeSnapshot.from_inventory(inv.node_id, "ready", False, inv))
    started = time.perf_counter()
    place(PlacementRequest(model="model-0", engine="llama.cpp", gpus=1), nodes)
    first = (time.perf_counter() - started) * 1000
    import llmgw

    return {"src": str(Path(llmgw.__file__).parents[1]), "nodes": n, "models": models,
            "ms_per_decision": round(fleet.placement_ms(n, models), 3), "first_decision_ms": round(first, 2)}


def run_one(src: str, n: int, models: int, timeout: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "measure", src, str(n), str(models)], capture_output=True,
                         text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def archive(rev: str, into: str) -> str:
    """*rev*'s src/ unpacked under *into*; its path."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True,
                         timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", into], input=tar, check=True, timeout=60)
    return os.path.join(into, "src")


def main(argv: list[str]) -> int:
    if argv[:1] == ["measure"]:
        src, n, models = argv[1], int(argv[2]), int(argv[3])
        sys.dont_write_bytecode = True
        print(json.dumps(measure(src, n, models)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000,10000")
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--against", default="main", help="the revision to compare with; '' for none")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for one run")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",")]
    with tempfile.TemporaryDirectory(prefix="llmgw-placement-") as tmp:
        trees = [("this tree", str(ROOT / "src"))]
        if args.against:
            trees.append((args.against, archive(args.against, tmp)))
        print(f"{'nodes':>6}  {'tree':<12} {'ms/decision':>11} {'first ms':>9}  load")
        for n in sizes:
            for name, src in reversed(trees):
                row = run_one(src, n, args.models, args.timeout)
                load = os.getloadavg()[0]
                print(f"{n:>6}  {name:<12} {row['ms_per_decision']:>11.3f} {row['first_decision_ms']:>9.1f}  {load:.2f}",
                      flush=True)
                print(json.dumps({"tree": name, "load": round(load, 2), **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
