"""RDMA adapters (InfiniBand and RoCE) as the kernel lists them under /sys/class/infiniband."""

from __future__ import annotations

import os

from twisted.logger import Logger

from llmgw.records import IBAdapter, IBPort

log = Logger()


def probe(sysfs_root: str = "/sys", fabrics: dict[str, str] | None = None) -> list[IBAdapter] | None:
    """Every adapter and its ports; [] on a node without the class (no RDMA driver).

    Which fabric an adapter is on cannot be found out (OpenSM's default subnet
    prefix is the same everywhere), so it comes from agent.yaml's `fabrics:`,
    keyed by adapter name.  None only when the class is there but unreadable.
    """
    fabrics = fabrics or {}
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    except OSError as e:
        log.info("cannot list {path}: {error}; InfiniBand not reported", path=base, error=e)
        return None
    return [_adapter(os.path.join(base, name), name, fabrics.get(name)) for name in names]


def _adapter(path: str, name: str, fabric: str | None) -> IBAdapter:
    return IBAdapter(
        name=name,
        # As the kernel writes it, 9c63:c003:0055:48ae (ibstat prints 0x9c63c003005548ae).
        node_guid=_read(path, "node_guid"),
        board_id=_read(path, "board_id"),
        fw_version=_read(path, "fw_ver"),
        ports=_ports(os.path.join(path, "ports")),
        fabric=fabric,
    )


def _ports(path: str) -> list[IBPort]:
    try:
        numbers = sorted(int(n) for n in os.listdir(path) if n.isdigit())
    except OSError:
        return []
    ports = []
    for n in numbers:
        port = os.path.join(path, str(n))
        ports.append(IBPort(
            port=n,
            state=parse_state(_read(port, "state")),
            phys_state=parse_state(_read(port, "phys_state")),
            rate_gbps=parse_rate(_read(port, "rate")),
            link_layer=_read(port, "link_layer"),
        ))
    return ports


def parse_state(value: str | None) -> str | None:
    """"4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp": the kernel's code goes, its name stays."""
    if value is None:
        return None
    code, sep, name = value.partition(":")
    return (name if sep else code).strip() or None


def parse_rate(value: str | None) -> float | None:
    """"400 Gb/sec (4X NDR)" -> 400.0; "2.5 Gb/sec (1X SDR)" -> 2.5."""
    if not value:
        return None
    try:
        return float(value.split()[0])
    except ValueError:
        return None


def _read(directory: str, name: str) -> str | None:
    # Any one attribute may be missing (older drivers have no board_id) or
    # unreadable; that figure is unknown, the rest of the adapter still counts.
    try:
        with open(os.path.join(directory, name), encoding="ascii", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None
