"""Processes the tests started, seen from outside the code under test."""

from __future__ import annotations

import psutil


def alive(pid: int) -> bool:
    """Whether *pid* is a running process: one that has exited but not been reaped (a zombie) is not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
