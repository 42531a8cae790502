"""Memory, read afresh on every heartbeat: a VM can be given more while it runs."""

from __future__ import annotations

import psutil


def probe() -> tuple[int | None, int | None]:
    """(total, available) in bytes.

    "available" is the kernel's estimate of what can be allocated without
    swapping (MemAvailable), which is what a model about to load competes for;
    "free" would leave out the page cache and make every busy node look full.
    """
    try:
        vm = psutil.virtual_memory()
    except (OSError, RuntimeError):
        return None, None
    return int(vm.total), int(vm.available)
