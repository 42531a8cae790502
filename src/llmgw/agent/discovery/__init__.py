"""What a node finds out about itself: the inventory it registers with, and the
live figures it sends on every heartbeat.

Each concern is its own module (host, cpu, memory, storage, gpus, infiniband);
this one puts their answers into the records that cross the link.  Everything
here blocks (files, statvfs, NVML), so the agent calls it in a thread.

What a probe could not find out stays None, "not reported", never zero; an
empty list means the probe ran and found nothing.
"""

from __future__ import annotations

from typing import Any

import llmgw
from llmgw.agent import directories
from llmgw.agent.discovery import cpu, gpus, host, infiniband, memory, storage
from llmgw.records import Heartbeat, Inventory


def discover(
    *,
    node_id: str | None,
    hub_host: str,
    hub_port: int,
    weights_dirs: list[str],
    labels: dict[str, str],
    fabrics: dict[str, str],
    nvml: Any = None,
    sysfs_root: str = "/sys",
    proc_root: str = "/proc",
    agent_version: str | None = llmgw.__version__,
    protocol: int | None = llmgw.PROTOCOL_VERSION,
) -> Inventory:
    """The whole of what this node says about itself when it registers.

    *node_id* and *labels* and *fabrics* are agent.yaml's: what is written wins,
    and what cannot be discovered (which fabric an adapter is on) comes only from
    there.  *nvml*, *sysfs_root* and *proc_root* are for tests; $LLMGW_FAKE_NVML
    replaces NVML for demos (see fakenvml).
    """
    processor, warnings = cpu.probe(proc_root)
    # A weights directory that is missing or unusable is said, not only skipped: no disk, and why.
    warnings = [*warnings, *directories.weights_dir_problems(weights_dirs)]
    total, available = memory.probe()
    driver, cards = gpus.probe(nvml)
    return Inventory(
        node_id=host.node_id(node_id),
        protocol=protocol,
        agent_version=agent_version,
        address=host.route_address(hub_host, hub_port),
        hostname=host.hostname(),
        os=host.os_name(),
        kernel=host.kernel(),
        arch=host.arch(),
        cpu=processor,
        memory_total_bytes=total,
        memory_available_bytes=available,
        nvidia_driver=driver,
        gpus=cards,
        filesystems=storage.probe(weights_dirs),
        infiniband=infiniband.probe(sysfs_root, fabrics),
        labels=dict(labels),
        warnings=warnings,
    )


def sample(*, weights_dirs: list[str], nvml: Any = None) -> Heartbeat:
    """The figures that change while a node runs, read afresh for each heartbeat.

    Memory because a VM can be given more; GPUs because another process can take
    a card's memory; disk because a node filling up is exactly the one to watch.
    """
    total, available = memory.probe()
    _, cards = gpus.probe(nvml)
    return Heartbeat(
        memory_total_bytes=total,
        memory_available_bytes=available,
        gpus=cards,
        filesystems=storage.probe(weights_dirs),
    )
