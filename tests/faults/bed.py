"""The fault suite's bed: a server, two agents, one model on two replicas, 32 clients streaming through the router.

What each fault test measures is defined here once:

- requests failed, split by how: cut (bytes had come from the engine the
  fault hit: nothing can save those), before any byte (the router could
  have sent them elsewhere), after bytes from an engine the fault did not
  hit, and during an outage (the fault takes the whole API down by design:
  the server itself);
- engines orphaned: a process carrying an agent's marker that no replica
  describes;
- engines started twice: a slot whose engine changed though the fault did
  not touch it, or a slot with more than one live engine;
- seconds to recover: from the fault until every slot is ready, each
  replica answers a request of its own, and requests through the router
  have reached each replica's engine since the fault.  It is found by
  polling ``ctl replicas``, so it is as fine as one ctl call (about a second
  on a loaded two-core machine).
"""

from __future__ import annotations

import collections
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import attrs

from llmgw.agent.procs import marked_processes
from tests.support.load import Load, Outcome, engine_of
from tests.support.wait import wait_for

MODEL = "echo"
CLIENTS = 32
# Streams of about a second: long enough that a kill finds answers half sent.
PROFILE = '{engine: sim, args: ["--ttft-ms", "0", "--tokens-per-s", "20", "--output-tokens", "20", "--quiet"]}'
CATALOG = f"""
profiles:
  sim-stream: {PROFILE}
models:
  {MODEL}: {{profile: sim-stream, replicas: 2}}
"""
RECOVER_TIMEOUT_S = 90


@attrs.frozen
class Slot:
    """A ready replica: where its engine is and which process it is."""

    replica: str
    node: str
    pid: int
    endpoint: str


@attrs.frozen
class Figures:
    """One fault's row of the table."""

    fault: str
    requests: int
    cut: int  # failed after bytes from the engine the fault hit (allowed)
    before_bytes: int
    elsewhere: int  # failed after bytes from an engine the fault did not hit
    outage: int  # failed while the service was down by design
    orphaned: int
    started_twice: int
    recover_s: float | None
    note: str = ""


def views(cluster) -> list[dict]:
    out = cluster.ctl("replicas", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def slots(cluster, model: str = MODEL) -> dict[str, Slot]:
    """The ready replicas of *model* whose one shard reports a pid."""
    found = {}
    for view in views(cluster):
        if view["model"] != model or view["state"] != "ready" or len(view["shards"]) != 1:
            continue
        (shard,) = view["shards"]
        if shard["pid"] and view["endpoint"]:
            found[view["replica"]] = Slot(view["replica"], shard["node"], shard["pid"], view["endpoint"])
    return found


def probe(endpoint: str, model: str = MODEL) -> str | None:
    """The engine process (the sim's id prefix) that answers a request sent straight to *endpoint*; None if none."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "probe"}], "max_tokens": 1}).encode()
    request = urllib.request.Request(endpoint + "/v1/chat/completions", data=body, method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return engine_of(json.load(r)["id"])
    except (OSError, ValueError, KeyError):
        return None


def state_dirs(cluster) -> list[Path]:
    return sorted(cluster.base.glob("*/state"))


def engines_by_shard(cluster) -> dict[str, list[int]]:
    """Every live process an agent of this cluster marked, by the shard it says it serves."""
    found = collections.defaultdict(list)
    for state_dir in state_dirs(cluster):
        for proc in marked_processes(state_dir):
            found[proc.shard_id].append(proc.pid)
    return dict(found)


def orphaned(cluster) -> list[int]:
    """Marked engine processes that no replica, in any state, describes."""
    described = {shard["pid"] for view in views(cluster) for shard in view["shards"] if shard["pid"]}
    return sorted(pid for pids in engines_by_shard(cluster).values() for pid in pids if pid not in described)


def started_twice(cluster, before: dict[str, Slot], after: dict[str, Slot], hit: frozenset[str] = frozenset()) -> list[str]:
    """Slots whose engine changed though the fault did not touch them (*hit* are those it did),
    and shards with more than one live engine."""
    changed = [f"{r}: pid {before[r].pid} became {after[r].pid}" for r in before
               if r not in hit and r in after and after[r].pid != before[r].pid]
    doubled = [f"{shard}: {len(pids)} engines {pids}" for shard, pids in engines_by_shard(cluster).items() if len(pids) > 1]
    return changed + doubled


class Bed:
    """A cluster serving MODEL on two replicas on two nodes, with the load running through its router."""

    def __init__(self, cluster, catalog: str = CATALOG):
        self.cluster = cluster
        self.catalog = catalog
        self.load: Load | None = None
        # When requests through the router first reached both replicas: the
        # figures count requests begun from then on, not the warm-up's.
        self.serving_since: float | None = None

    def start(self) -> dict[str, Slot]:
        c = self.cluster
        c.write_server_config("")
        c.start_server()
        c.start_agent("node01")
        c.start_agent("node02")
        c.wait_node("node01", "ready", timeout=60)
        c.wait_node("node02", "ready", timeout=60)
        self.reload(self.catalog)
        self.load = Load(c.api_port, MODEL, CLIENTS).start()
        ready = self.recovered(time.monotonic(), count=2)
        self.serving_since = time.monotonic()
        # A round of requests begun after that, so the answers a fault finds open are counted.
        wait_for(lambda: len(self.load.ok_since(self.serving_since)) >= CLIENTS, 60, "a round of requests")
        assert sorted(s.node for s in ready.values()) == ["node01", "node02"], ready
        return ready

    def reload(self, catalog: str) -> None:
        self.cluster.write_server_config(catalog)
        out = self.cluster.ctl("reload")
        assert out.returncode == 0, out.stderr

    def recovered(self, since: float, count: int = 2, timeout: float = RECOVER_TIMEOUT_S) -> dict[str, Slot]:
        """Wait until *count* slots are ready, each answers a request sent straight to it, and the
        router has sent requests begun after *since* to each of their engines."""

        def check():
            ready = slots(self.cluster)
            if len(ready) != count:
                return None
            engines = {r: probe(s.endpoint) for r, s in ready.items()}
            if None in engines.values():
                return None
            routed = self.load.engines_since(since)
            return ready if set(engines.values()) <= routed else None

        return wait_for(check, timeout, f"{count} ready replicas of {MODEL}, each answering and routed to",
                        interval=0.2, detail=lambda: f"{json.dumps(views(self.cluster), indent=1)}\n{self.cluster.logs()}")

    def engines(self, ready: dict[str, Slot]) -> dict[str, str]:
        """Each slot's engine process, as its completion ids name it."""
        found = {r: probe(s.endpoint) for r, s in ready.items()}
        assert None not in found.values(), found
        return found

    def figures(self, fault: str, outcomes: list[Outcome], *, hit_engines: frozenset[str] = frozenset(),
                outage: tuple[float, float] | None = None, orphans: list[int], twice: list[str],
                recover_s: float | None, note: str = "") -> Figures:
        outcomes = self.measured(outcomes)
        failed = [o for o in outcomes if not o.ok]
        down = [o for o in failed if outage is not None and o.started < outage[1] and o.ended >= outage[0]]
        rest = [o for o in failed if all(o is not d for d in down)]
        return Figures(
            fault=fault, requests=len(outcomes),
            cut=sum(1 for o in rest if o.had_bytes and o.engine in hit_engines),
            before_bytes=sum(1 for o in rest if not o.had_bytes),
            elsewhere=sum(1 for o in rest if o.had_bytes and o.engine not in hit_engines),
            outage=len(down), orphaned=len(orphans), started_twice=len(twice),
            recover_s=None if recover_s is None else round(recover_s, 1), note=note,
        )

    def measured(self, outcomes: list[Outcome]) -> list[Outcome]:
        return [o for o in outcomes if o.started >= self.serving_since]

    def stop_load(self) -> list[Outcome]:
        return self.load.stop() if self.load is not None else []


def failures(outcomes: list[Outcome], limit: int = 8) -> str:
    """The first few failed requests, for an assertion's message."""
    failed = [o for o in outcomes if not o.ok]
    return f"{len(failed)} failed, first: " + "; ".join(
        f"[{'bytes from ' + str(o.engine) if o.had_bytes else 'no bytes'}] {o.error}" for o in failed[:limit])
