"""A fleet of two nodes as real agents would report them: one complete, one that said little.

The collector, admin page and contrib tests take its ``clock`` and ``fleet``
fixtures by importing them by name.
"""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from llmgw.control.fleet import Fleet
from llmgw.records import CPU, GPU, EngineInfo, Filesystem, Heartbeat, Inventory, ShardSpec, ShardStatus
from llmgw.states import EngineState

GIB = 1024**3


def gpu_node() -> Inventory:
    return Inventory(
        node_id="gpu01", agent_version="0.1.0", hostname="gpu01.lab", os="Debian GNU/Linux 12",
        kernel="6.1.0-18-amd64", arch="x86_64",
        cpu=CPU(model="AMD EPYC 7763 64-Core Processor", logical_cores=128, avx2=True),
        memory_total_bytes=512 * GIB, memory_available_bytes=400 * GIB, nvidia_driver="550.54.15",
        gpus=[
            GPU(index=0, uuid="GPU-aaaa", name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GIB,
                memory_used_bytes=60 * GIB, utilization_pct=87),
            # A driver too old to know utilisation: the card is there, its busyness is not known.
            GPU(index=1, uuid="GPU-bbbb", name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GIB,
                memory_used_bytes=1 * GIB),
        ],
        filesystems=[
            Filesystem(mountpoint="/srv/models", fstype="lustre", shared=True, total_bytes=100 * 1024 * GIB,
                       free_bytes=40 * 1024 * GIB, weights_dirs=["/srv/models"]),
            Filesystem(mountpoint="/scratch", fstype="ext4", shared=False, total_bytes=3500 * GIB,
                       weights_dirs=["/scratch/weights"]),
        ],
        # An agent older than install states (no state: seen to run), and a build that is broken here.
        engines=[EngineInfo(name="vllm", version="0.6.3"), EngineInfo(name="sim"),
                 EngineInfo(name="llama.cpp", version="b6000", state=EngineState.BROKEN, origin="server.yaml",
                            reason="needs libgomp.so.1, which this node does not have: apt-get install libgomp1")],
        shards=[],
    )


def quiet_node() -> Inventory:
    """An agent that reported who it is and nothing measured: no memory, GPUs not probed."""
    return Inventory(node_id="cpu07", arch="aarch64")


def shard(model: str, replica: int, state: str) -> ShardStatus:
    spec = ShardSpec(shard_id=f"{model}/{replica}/0", replica_id=f"{model}/{replica}", model=model, engine="vllm")
    return ShardStatus(spec=spec, state=state, since=0.0)


@pytest.fixture
def clock():
    clock = Clock()
    clock.advance(1_000)
    return clock


@pytest.fixture
def fleet(clock):
    fleet = Fleet(clock, lambda kind, ident, event: None, unreachable_after=15, lost_after=60)
    fleet.register("gpu01", 1, gpu_node())
    fleet.register("cpu07", 2, quiet_node())
    for replica in range(3):  # the control plane placed them: a node reports only what it was given
        fleet.place("gpu01", shard("qwen", replica, "starting").spec)
    fleet.shard_status("gpu01", shard("qwen", 0, "ready"))
    fleet.shard_status("gpu01", shard("qwen", 1, "starting"))
    clock.advance(20)
    fleet.heartbeat("gpu01", 1, Heartbeat(memory_available_bytes=390 * GIB))
    fleet.check()  # cpu07 has been silent for 20 s: unreachable
    return fleet
