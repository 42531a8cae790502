"""Which of a node's heartbeats are news to the TUIs and ctl sessions following ``llmgw.event.node``.

A heartbeat arrives every few seconds from every node, and each event carries
the node's whole view (its engines, its weights, every GPU).  So a
heartbeat is published only when it changes something a subscriber shows:
anything but the live figures, or a live figure by more than ``change`` of
its whole (memory available against the node's memory, a GPU's memory in use
against its memory, its utilisation against 100 %, a filesystem's free space
against its size).  ``interval_s`` after the last event, the next heartbeat
is published whatever it says, so a slow drift and "last seen" are not
stale for long.  docs/link.rst says the same for whoever subscribes.
"""

from __future__ import annotations

from operator import attrgetter

import attrs

from llmgw.records import GPU, Filesystem
from llmgw.views import NodeView

#: What a heartbeat moves every time: compared by size of change, or not at all.
_LIVE = frozenset({"last_seen", "seen_ago_s", "memory_available_bytes", "gpus", "filesystems"})
_FACTS = tuple(f.name for f in attrs.fields(NodeView) if f.name not in _LIVE)
_view_facts = attrgetter(*_FACTS)
# What of a GPU or a filesystem is a fact rather than a figure: compared field by field.
_GPU_FACTS = tuple(f.name for f in attrs.fields(GPU) if f.name not in ("memory_used_bytes", "utilization_pct"))
_FILESYSTEM_FACTS = tuple(f.name for f in attrs.fields(Filesystem) if f.name != "free_bytes")
# Each as one tuple, read in C: a heartbeat compares eight cards' facts.
_gpu_facts = attrgetter(*_GPU_FACTS)
_filesystem_facts = attrgetter(*_FILESYSTEM_FACTS)


@attrs.frozen
class NewsSettings:
    """server.yaml's ``fleet.node_event_interval_s`` and ``fleet.node_figures_change``."""

    interval_s: float = 30.0
    change: float = 0.05


def is_news(old: NodeView, new: NodeView, change: float) -> bool:
    """Whether *new* shows a subscriber anything *old* did not, at the figures' threshold *change*."""
    if _view_facts(old) != _view_facts(new):
        return True
    if _moved(old.memory_available_bytes, new.memory_available_bytes, new.memory_total_bytes, change):
        return True
    return _gpus_news(old.gpus, new.gpus, change) or _filesystems_news(old.filesystems, new.filesystems, change)


#: What a heartbeat may change of a node besides its live figures (``Fleet.heartbeat``).
_HEARTBEAT_FACTS = ("memory_total_bytes", "engines", "weights")
_heartbeat_facts = attrgetter(*_HEARTBEAT_FACTS)


def is_heartbeat_news(old: NodeView, state, reason: str | None, inventory, change: float) -> bool:
    """``is_news(old, new)`` for a heartbeat, without making *new*: a node in *state*, with *reason* and *inventory*.

    Only a heartbeat is judged this way, and only against the view last
    published: every other change publishes at once, so the facts a
    heartbeat cannot carry are as *old* shows them.  A heartbeat then need
    not build the node's view (a copy of every field, 10,000 nodes every
    5 s) unless it is published.
    """
    if old.state != state or old.reason != reason:
        return True
    if _heartbeat_facts(old) != _heartbeat_facts(inventory):
        return True
    if _moved(old.memory_available_bytes, inventory.memory_available_bytes, inventory.memory_total_bytes, change):
        return True
    return (_gpus_news(old.gpus, inventory.gpus, change)
            or _filesystems_news(old.filesystems, inventory.filesystems, change))


def _moved(a: float | None, b: float | None, whole: float | None, change: float) -> bool:
    """Whether a figure went from *a* to *b* by more than *change* of *whole* (of the larger, when no whole is known)."""
    if (a is None) != (b is None):
        return True
    if a is None or a == b:
        return False
    scale = whole if whole else max(abs(a), abs(b))
    return abs(a - b) > change * scale


def _gpus_news(old: list[GPU] | None, new: list[GPU] | None, change: float) -> bool:
    if old is None or new is None or len(old) != len(new):
        return old != new
    for a, b in zip(old, new):
        if _gpu_facts(a) != _gpu_facts(b):
            return True
        if (_moved(a.memory_used_bytes, b.memory_used_bytes, b.memory_total_bytes, change)
                or _moved(a.utilization_pct, b.utilization_pct, 100, change)):
            return True
    return False


def _filesystems_news(old: list[Filesystem] | None, new: list[Filesystem] | None, change: float) -> bool:
    if old is None or new is None or len(old) != len(new):
        return old != new
    for a, b in zip(old, new):
        if _filesystem_facts(a) != _filesystem_facts(b):
            return True
        if _moved(a.free_bytes, b.free_bytes, b.total_bytes, change):
            return True
    return False
