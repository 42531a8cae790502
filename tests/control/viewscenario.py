"""A fleet in every state a view can show, and what the control plane answers about it.

Used by ``test_views_wire.py`` to compare the wire form of today's views with
``tests/fixtures/views/recorded.json``, which was written by this same
scenario from the code as it was before the views became records.  So the
scenario touches only what both have: the fleet, the reconciler and the
control session's procedures, and it reads answers as JSON.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from autobahn.wamp.types import ComponentConfig
from twisted.internet.task import Clock

from llmgw.config.catalog import Model, Profile
from llmgw.config.server import FleetSettings
from llmgw.control.catalog import Entry, fingerprint
from llmgw.control.fleet import Fleet
from llmgw.control.plane import ControlSession
from llmgw.link import uris
from llmgw.wire import to_wire
from llmgw.records import (
    CPU, GPU, EngineInfo, Filesystem, Heartbeat, IBAdapter, IBPort, Inventory, Progress, ShardSpec, ShardStatus,
    WeightsFile, WeightsReport,
)

GB = 1_000_000_000
GEMMA = "/srv/models/gemma.gguf"
QWEN = "https://models.example/qwen.gguf"


def _entry(name, replicas, source=None, profile="sim-fast", engine="sim"):
    prof = Profile(name=profile, engine=engine, args=("--ttft-ms", "0"))
    model = Model(name=name, profile=profile, source=source, replicas=replicas)
    return Entry(model, prof, fingerprint(model, prof, None))


def _status(replica_id, rank, state, entry=None, port=None, reason=None, since=100.0, source=None):
    model = replica_id.rpartition("/")[0]
    spec = ShardSpec(shard_id=f"{replica_id}/{rank}", replica_id=replica_id, model=model, engine="sim",
                     fingerprint=entry.fingerprint if entry is not None else "old", source=source, rank=rank,
                     port=port)
    return ShardStatus(spec, state, pid=4000 + (port or 0) % 1000,
                       endpoint=f"http://10.0.0.1:{port}" if port else None, reason=reason, since=since)


def _wire(value):
    return json.loads(json.dumps(to_wire(value)))


def run() -> dict:
    """The answers of nodes, replicas, status and the endpoint table, and every event, as JSON."""
    clock = Clock()
    clock.advance(1000)
    echo, gemma, qwen, tiny = (_entry("echo", 3), _entry("gemma", 1, source=GEMMA), _entry("qwen", 1, source=QWEN),
                               _entry("tiny", 1))
    catalog = SimpleNamespace(entries={e.model.name: e for e in (echo, gemma, qwen, tiny)},
                              # Every heartbeat published, as before heartbeats were held to news.
                              config=SimpleNamespace(fleet=FleetSettings(settle_s=0.0, node_event_interval_s=0.0)))
    plane = ControlSession(ComponentConfig(realm=uris.REALM), lambda emit: Fleet(clock, emit), catalog, clock)
    published = []
    plane.is_attached = lambda: True
    plane.publish = lambda topic, *args: published.append([topic, *_wire(list(args))])
    fleet = plane.fleet

    shards = [
        _status("echo/0", 0, "ready", echo, port=40001),
        _status("echo/1", 0, "draining", echo, port=40002),
        _status("echo/2", 0, "failed", echo, reason="exited with code 1: CUDA out of memory"),
        _status("gemma/0", 0, "starting", gemma, port=40003, source=GEMMA),
        _status("qwen/0", 0, "fetching", qwen, source=QWEN),
        _status("echo/3", 0, "ready", echo, port=40004),  # above replicas: scaled down
        _status("gone/0", 0, "ready", None, port=40005),  # a model that left the catalog
        _status("gone/1", 0, "ready", None, port=40007),
    ]
    fleet.register("node01", 1, Inventory(
        node_id="node01", protocol=1, agent_version="0.1.0", address="10.0.0.1", hostname="node01.example",
        os="Ubuntu 22.04", kernel="6.5.0", arch="x86_64",
        cpu=CPU(model="AMD EPYC 7763", logical_cores=128, vector_flags=["avx2"], avx2=True),
        memory_total_bytes=512 * GB, memory_available_bytes=400 * GB, nvidia_driver="550.54",
        gpus=[GPU(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GB,
                  memory_used_bytes=20 * GB, utilization_pct=35)],
        filesystems=[Filesystem(mountpoint="/data", fstype="ext4", shared=False, total_bytes=2000 * GB,
                                free_bytes=1500 * GB, weights_dirs=["/data/weights"])],
        infiniband=[IBAdapter(name="mlx5_0", node_guid="0x1", ports=[IBPort(port=1, state="ACTIVE", rate_gbps=200.0)],
                              fabric="ib0")],
        labels={"rack": "r1"},
        engines=[EngineInfo("sim", "0.1", "/usr/bin/llmgw-sim")],
        weights=WeightsReport(files=[WeightsFile(GEMMA, 5 * GB)], fingerprint="w1", listed=True,
                              cache_dir="/data/weights"),
        cordoned=False, shards=shards, warnings=["CPU has no AVX2: llama.cpp runs several times slower here"],
    ))
    # An agent too old to say anything but its name, whose shard is on a node since lost.
    # (Its address is the one its link came from: an endpoint is believed only on its node's address.)
    fleet.register("node02", 1, Inventory(node_id="node02", shards=[_status("tiny/0", 0, "ready", tiny, port=40006)]),
                   peer="10.0.0.1")
    fleet.set_cordoned("node01", True)
    fleet.download("node01", Progress(source=QWEN, file_name="qwen.gguf", bytes_done=120 * GB // 1000,
                                      bytes_total=253 * GB // 1000, rate_bps=31e6))
    clock.advance(5)
    fleet.heartbeat("node01", 1, Heartbeat(memory_available_bytes=390 * GB))
    clock.advance(200)
    fleet.heartbeat("node01", 1, Heartbeat())
    fleet.check()
    fleet.shard_status("node01", _status("gone/1", 0, "stopped", None, port=40007))
    clock.advance(2.5)
    plane.publish_endpoints()
    return {
        "nodes": _wire(plane.nodes()),
        "replicas": _wire(plane.replicas()),
        "status": _wire(plane.status()),
        "endpoints": _wire(plane.endpoint_table()),
        "events": published,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
